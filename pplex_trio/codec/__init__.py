"""Opus output for the Moshi protocol: our libopus writer, its Ogg muxer, and the encoder child.

Pure codec work, no Trio: the encoder child process imports only this
package, numpy and opuslib, so it starts fast.  Where the encoding runs (the
child, the event loop) is the server's business (``server/_encoders.py``).
"""

from ._libopus import LibopusWriter as LibopusWriter
from ._libopus import OpusWriter as OpusWriter
from ._libopus import libopus_available as libopus_available
from ._writers import make_writer as make_writer
