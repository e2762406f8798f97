"""The engine side: the interface, the actor that drives it, leases, and the echo test engine.

The model's engine (``PersonaPlexEngine``), the memory plan and the 8-bit comparison need torch: they are
imported on first use, so that an echo server never loads it.
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._actor import EngineActor as EngineActor
from ._actor_state import ACTOR_LIFECYCLE as ACTOR_LIFECYCLE
from ._actor_state import ActorState as ActorState
from ._actor_state import ActorStatistics as ActorStatistics
from ._echo import OFFICIAL_VOICES as OFFICIAL_VOICES
from ._echo import EchoEngine as EchoEngine
from ._echo import voices_in_directory as voices_in_directory
from ._framing import InputFramer as InputFramer
from ._framing import InputStats as InputStats
from ._interface import FRAME_SIZE as FRAME_SIZE
from ._interface import SAMPLE_RATE as SAMPLE_RATE
from ._interface import Conversation as Conversation
from ._interface import ConversationRejected as ConversationRejected
from ._interface import Engine as Engine
from ._interface import Job as Job
from ._interface import Sampling as Sampling
from ._interface import SlotMode as SlotMode
from ._interface import StepOutput as StepOutput
from ._lease import Lease as Lease
from ._lease_core import BEGUN_STATES as BEGUN_STATES
from ._lease_core import LEASE_LIFECYCLE as LEASE_LIFECYCLE
from ._lease_core import LIVE_STATES as LIVE_STATES
from ._lease_core import PREPARING_STATES as PREPARING_STATES
from ._lease_core import LeaseFailed as LeaseFailed
from ._lease_core import LeaseFailure as LeaseFailure
from ._lease_core import LeaseState as LeaseState
from ._outbox import OutputEnd as OutputEnd
from ._outbox import OutputEvent as OutputEvent
from ._outbox import OutputFrame as OutputFrame
from ._resume import Parked as Parked
from ._resume import ResumeRefused as ResumeRefused
from ._settings import OFF_GPU_SLOTS as OFF_GPU_SLOTS
from ._settings import ActorSettings as ActorSettings
from ._slots import SLOT_STATES as SLOT_STATES
from ._slots import QueueFull as QueueFull

if TYPE_CHECKING:
    from ._compare import compare as compare
    from ._fit import GIB as GIB
    from ._fit import plan_memory as plan_memory
    from ._fit_transcriber import plan_transcriber_memory as plan_transcriber_memory
    from ._personaplex import PersonaPlexEngine as PersonaPlexEngine
    from ._transcribing import EngineTranscriber as EngineTranscriber
    from ._transcribing import TranscriberUnavailable as TranscriberUnavailable

_NEEDS_TORCH = {
    "PersonaPlexEngine": "._personaplex",
    "compare": "._compare",
    "plan_memory": "._fit",
    "GIB": "._fit",
    "TranscriberUnavailable": "._transcribing",
    "EngineTranscriber": "._transcribing",
    "plan_transcriber_memory": "._fit_transcriber",
}


def __getattr__(name: str) -> Any:
    if name in _NEEDS_TORCH:
        return getattr(importlib.import_module(_NEEDS_TORCH[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
