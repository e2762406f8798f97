"""Writing Ogg Opus streams (RFC 3533, RFC 7845): pages around the packets libopus made.

Pure byte arithmetic, next to its one user, :class:`~pplex_trio.codec._libopus.LibopusWriter`.
"""

from __future__ import annotations

import os
import struct
import zlib

BOS = 0x02
# Ogg's CRC is CRC-32 with polynomial 0x04C11DB7, *not* bit-reflected, init 0.
# zlib's crc32 is the reflected form of the same polynomial, so feeding it
# bit-reversed bytes and reversing its result gives Ogg's CRC in C speed.
_REVERSE_BITS = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def ogg_crc(data: bytes) -> int:
    """The Ogg page checksum: CRC-32 with polynomial 0x04C11DB7, unreflected, initial value 0, no final XOR."""
    raw = zlib.crc32(data.translate(_REVERSE_BITS), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int(f"{raw:032b}"[::-1], 2)


def build_page(packets: list[bytes], *, serial: int, sequence: int, granule: int, flags: int = 0) -> bytes:
    """One Ogg page holding whole ``packets`` (each laced into 255-byte segments)."""
    lacing = bytearray()
    for packet in packets:
        full, rest = divmod(len(packet), 255)
        lacing += b"\xff" * full + bytes([rest])
    if len(lacing) > 255:
        raise ValueError("too many packets for one Ogg page")
    header = struct.pack("<4sBBqIIIB", b"OggS", 0, flags, granule, serial, sequence, 0, len(lacing))
    page = bytearray(header + lacing + b"".join(packets))
    page[22:26] = struct.pack("<I", ogg_crc(bytes(page)))
    return bytes(page)


class OggOpusMuxer:
    """Wrap Opus packets into an Ogg Opus stream, two packets per page.

    The first call to :meth:`pages` returns the OpusHead page (BOS, sequence
    0) and the OpusTags page (sequence 1) before any audio, as players and the
    official web client expect.
    """

    def __init__(self, *, input_rate: int, pre_skip_48k: int, vendor: str = "pplex-trio", serial: int | None = None):
        self.serial = int.from_bytes(os.urandom(4), "little") if serial is None else serial
        self._head = struct.pack("<8sBBHIhB", b"OpusHead", 1, 1, pre_skip_48k, input_rate, 0, 0)
        vendor_bytes = vendor.encode()
        self._tags = b"OpusTags" + struct.pack("<I", len(vendor_bytes)) + vendor_bytes + struct.pack("<I", 0)
        self._sequence = 0
        self._granule = 0

    def pages(self, packets: list[bytes], samples_48k_per_packet: int, per_page: int = 2) -> bytes:
        """Ogg pages for ``packets``, ``per_page`` to a page, the granule advanced by ``samples_48k_per_packet`` each;
        the first call prepends the OpusHead and OpusTags pages.
        """
        out = []
        if self._sequence == 0:
            out.append(self._page([self._head], flags=BOS))
            out.append(self._page([self._tags]))
        for i in range(0, len(packets), per_page):
            group = packets[i : i + per_page]
            self._granule += samples_48k_per_packet * len(group)
            out.append(self._page(group))
        return b"".join(out)

    def _page(self, packets: list[bytes], flags: int = 0) -> bytes:
        page = build_page(packets, serial=self.serial, sequence=self._sequence, granule=self._granule, flags=flags)
        self._sequence += 1
        return page
