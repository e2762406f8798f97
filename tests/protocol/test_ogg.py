"""Ogg page framing: splitting, CRC, and the Ogg Opus muxer."""

import struct

import numpy as np
import pytest
import sphn

from _helpers.ogg import is_bos, page_sequence, split_pages
from pplex_trio.codec._ogg_writer import OggOpusMuxer, build_page, ogg_crc


def crc_bitwise(data: bytes) -> int:
    """RFC 3533's CRC, written from its definition (polynomial 0x04C11DB7, MSB first, init 0)."""
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return crc


@pytest.mark.parametrize("data", [b"", b"OggS", bytes(range(256)), b"\xff" * 1000])
def test_crc_matches_the_definition(data):
    assert ogg_crc(data) == crc_bitwise(data)


def test_crc_of_pages_written_by_sphn():
    pages = split_pages(sphn.OpusStreamWriter(24000).append_pcm(np.zeros(1920, np.float32)))
    for page in pages:
        blank = bytearray(page)
        blank[22:26] = bytes(4)
        assert struct.unpack("<I", page[22:26])[0] == ogg_crc(bytes(blank))


def test_split_pages_rejects_garbage_and_truncation():
    page = build_page([b"abc"], serial=1, sequence=0, granule=0)
    assert split_pages(page + page) == [page, page]
    with pytest.raises(ValueError):
        split_pages(b"nope" + page)
    with pytest.raises(ValueError):
        split_pages(page[:-1])


@pytest.mark.parametrize("size", [0, 1, 254, 255, 256, 510, 1000])
def test_lacing_of_packet_sizes(size):
    packet = bytes(range(256)) * 4
    page = build_page([packet[:size], b"x"], serial=7, sequence=3, granule=99)
    segments = page[26]
    lacing = page[27 : 27 + segments]
    assert sum(lacing) == size + 1
    assert page[27 + segments :] == packet[:size] + b"x"
    assert page_sequence(page) == 3 and struct.unpack("<q", page[6:14])[0] == 99


def test_muxer_header_pages_then_audio_pages():
    muxer = OggOpusMuxer(input_rate=24000, pre_skip_48k=312, serial=5)
    first = split_pages(muxer.pages([b"a", b"b", b"c", b"d"], 960))
    assert [page_sequence(p) for p in first] == [0, 1, 2, 3]
    assert is_bos(first[0]) and not is_bos(first[1])
    head = first[0][28:]
    assert head[:8] == b"OpusHead" and struct.unpack("<H", head[10:12])[0] == 312
    assert struct.unpack("<I", head[12:16])[0] == 24000
    assert first[1][28:36] == b"OpusTags"
    later = split_pages(muxer.pages([b"e", b"f", b"g", b"h"], 960))
    assert [page_sequence(p) for p in later] == [4, 5]
    granules = [struct.unpack("<q", p[6:14])[0] for p in first[2:] + later]
    assert granules == [1920, 3840, 5760, 7680]  # 48 kHz samples, two 20 ms packets per page
