"""Reading Ogg framing (RFC 3533) of Ogg Opus streams (RFC 7845), for the tests and the benches.

Pure byte arithmetic: splitting a byte string into whole pages (clients that
mimic the browser send one page per message) and reading a page's header
fields.  The server never needs it: it decodes Opus with sphn, and writes
pages with ``codec/_ogg_writer.py``.  The benches import it as the tests do,
with ``tests/`` on ``sys.path`` (``from _helpers import ogg``).
"""

from __future__ import annotations

HEADER = 27  # fixed part of a page header, before the segment table
BOS, EOS = 0x02, 0x04


def split_pages(data: bytes) -> list[bytes]:
    """Whole pages of ``data``; raises ``ValueError`` on anything else."""
    pages = []
    pos = 0
    while pos < len(data):
        if data[pos : pos + 4] != b"OggS" or pos + HEADER > len(data):
            raise ValueError(f"no Ogg page at byte {pos}")
        segments = data[pos + 26]
        table_end = pos + HEADER + segments
        if table_end > len(data):
            raise ValueError(f"truncated Ogg page header at byte {pos}")
        end = table_end + sum(data[pos + HEADER : table_end])
        if end > len(data):
            raise ValueError(f"truncated Ogg page at byte {pos}")
        pages.append(data[pos:end])
        pos = end
    return pages


def page_sequence(page: bytes) -> int:
    """The page sequence number (the official client decodes pages > 1 only)."""
    return int.from_bytes(page[18:22], "little")


def is_bos(page: bytes) -> bool:
    return bool(page[5] & BOS)
