"""WebRTC calls (issue 49): the peer connections (aiortc, on one asyncio loop thread owned by a Trio task), the
caller's audio in and the model's out, and each call as a connection the session core speaks over
(:class:`PeerSocket`); nothing here knows a conversation's session."""

from ._asyncio_loop import CANCEL_GRACE_SECONDS as CANCEL_GRACE_SECONDS
from ._asyncio_loop import AsyncioLoop as AsyncioLoop
from ._asyncio_loop import open_asyncio_loop as open_asyncio_loop
from ._calls import CallDesk as CallDesk
from ._calls import CallRefused as CallRefused
from ._end import EndReason as EndReason
