"""The engine side: the interface, the actor that drives it, leases, and the echo test engine."""

from ._actor import ActorStatistics as ActorStatistics
from ._actor import EngineActor as EngineActor
from ._echo import OFFICIAL_VOICES as OFFICIAL_VOICES
from ._echo import EchoEngine as EchoEngine
from ._echo import voices_in_directory as voices_in_directory
from ._framing import InputFramer as InputFramer
from ._interface import FRAME_SIZE as FRAME_SIZE
from ._interface import SAMPLE_RATE as SAMPLE_RATE
from ._interface import Conversation as Conversation
from ._interface import ConversationRejected as ConversationRejected
from ._interface import Engine as Engine
from ._interface import Sampling as Sampling
from ._interface import SlotMode as SlotMode
from ._interface import StepOutput as StepOutput
from ._settings import OFF_GPU_SLOTS as OFF_GPU_SLOTS
from ._settings import ActorSettings as ActorSettings
from ._slots import InputStats as InputStats
from ._slots import Lease as Lease
from ._slots import LeaseFailure as LeaseFailure
from ._slots import LeaseState as LeaseState
from ._slots import OutputEnd as OutputEnd
from ._slots import OutputEvent as OutputEvent
from ._slots import OutputFrame as OutputFrame
from ._slots import QueueFull as QueueFull
from ._slots import SlotPhase as SlotPhase
