"""pplex-trio: a real-time, full-duplex speech server for PersonaPlex/Moshi."""

from ._version import __version__ as __version__
