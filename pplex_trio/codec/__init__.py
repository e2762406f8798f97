"""Audio codecs: Opus output for the Moshi protocol (our libopus writer, its Ogg muxer, the encoder
child), and G.711, resampling and a voice-activity detector for the Realtime protocol, and the conversation-quality
meter, and the caller's words from a transcriber's tokens (``_words.py``).

Pure codec work, no Trio: the encoder child process imports only this
package, numpy and opuslib, so it starts fast.  Where the encoding runs (the
child, the event loop) is the server's business (``server/_encoders.py``).
"""

from . import _encoder_wire as encoder_wire  # noqa: F401  (the encoder child's wire format (both ends share it))
from ._g711 import alaw_decode as alaw_decode
from ._g711 import alaw_encode as alaw_encode
from ._g711 import ulaw_decode as ulaw_decode
from ._g711 import ulaw_encode as ulaw_encode
from ._libopus import OPUS_BITRATE as OPUS_BITRATE
from ._libopus import OPUS_COMPLEXITY as OPUS_COMPLEXITY
from ._libopus import LibopusWriter as LibopusWriter
from ._libopus import OpusWriter as OpusWriter
from ._libopus import libopus_available as libopus_available
from ._pcm16 import pcm16_decode as pcm16_decode
from ._pcm16 import pcm16_encode as pcm16_encode
from ._quality import BARGE_IN_FRAMES as BARGE_IN_FRAMES
from ._quality import BargeIn as BargeIn
from ._quality import ConversationQuality as ConversationQuality
from ._quality import QualityStatistics as QualityStatistics
from ._quality import Response as Response
from ._quality import TurnResponse as TurnResponse
from ._resample import StreamResampler as StreamResampler
from ._vad import EnergyVAD as EnergyVAD
from ._vad import is_silent as is_silent
from ._voice_audio import load_libraries as load_libraries
from ._voice_audio import voice_audio as voice_audio
from ._words import WORD_START as WORD_START
from ._words import TurnEnd as TurnEnd
from ._words import Word as Word
from ._words import WordAssembler as WordAssembler
from ._words import is_end_of_turn as is_end_of_turn
from ._writers import make_writer as make_writer
