"""Choosing an Opus writer: libopus (ours, releases the GIL) or sphn's."""

from __future__ import annotations

import sphn

from .._conversation import SAMPLE_RATE
from ._libopus import LibopusWriter, OpusWriter


def make_writer(kind: str) -> OpusWriter:
    """``libopus``, ``sphn``, or ``auto`` (libopus when the system has it, else sphn)."""
    if kind == "sphn":
        return _sphn_writer()
    if kind in ("libopus", "auto"):
        try:
            return LibopusWriter()
        except Exception:  # opuslib_next raises a bare Exception when libopus is missing
            if kind == "libopus":
                raise
    return _sphn_writer()


def _sphn_writer() -> OpusWriter:
    writer: OpusWriter = sphn.OpusStreamWriter(SAMPLE_RATE)  # sphn is untyped
    return writer
