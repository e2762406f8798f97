"""WebRTC's ground under the Trio server (issue 49): the one asyncio loop thread the WebRTC stack runs on, owned
by a Trio task; nothing here knows a conversation's session."""

from ._asyncio_loop import CANCEL_GRACE_SECONDS as CANCEL_GRACE_SECONDS
from ._asyncio_loop import AsyncioLoop as AsyncioLoop
from ._asyncio_loop import open_asyncio_loop as open_asyncio_loop
