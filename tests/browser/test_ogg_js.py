"""static/js/ogg.js, run in the browser against Ogg pages built here by an independent writer."""

from __future__ import annotations

import random

import pytest

from _helpers import ogg

pytestmark = pytest.mark.browser


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        r = i << 24
        for _ in range(8):
            r = ((r << 1) ^ 0x04C11DB7) if r & 0x80000000 else (r << 1)
        table.append(r & 0xFFFFFFFF)
    return table


CRC_TABLE = _crc_table()


def ogg_crc(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ CRC_TABLE[((crc >> 24) ^ byte) & 0xFF]
    return crc


def page(segments: list[int], body: bytes, *, sequence: int, flags: int = 0, granule: int = 0) -> bytes:
    header = bytearray(
        b"OggS" + bytes([0, flags]) + granule.to_bytes(8, "little", signed=True) + (7).to_bytes(4, "little")
    )
    header += sequence.to_bytes(4, "little") + bytes(4) + bytes([len(segments)]) + bytes(segments)
    data = bytearray(header + body)
    data[22:26] = ogg_crc(bytes(data)).to_bytes(4, "little")
    return bytes(data)


def test_packet_reader_handles_splits_continuations_and_damage(context, start_server):
    server = start_server()
    tab = context.new_page()
    tab.goto(server.url + "/")
    rng = random.Random(3)
    big = bytes(rng.randrange(256) for _ in range(700))  # 255 + 255 + 190: spans two pages
    small = b"\x01\x02\x03"
    exact = bytes(range(255))  # a multiple of 255 ends with a 0 segment
    stream = b"".join(
        [
            page([19], b"OpusHead" + bytes(11), sequence=0, flags=2),
            page([255, 255], big[:510], sequence=1, granule=-1),  # continues on the next page
            page([190, 3], big[510:] + small, sequence=2, flags=1),
            page([255, 0], exact, sequence=3),
        ]
    )
    damaged = bytearray(page([3], b"bad", sequence=4))
    damaged[-1] ^= 0xFF  # wrong checksum: skipped
    stream += b"noise" + bytes(damaged) + page([3], b"end", sequence=5, flags=4)
    assert len(ogg.split_pages(stream[: stream.index(b"noise")])) == 4  # the server's parser agrees

    result = tab.evaluate(
        """async ([bytes, chunk]) => {
            const { OggPacketReader, OggPageWriter, crc32 } = await import("/js/ogg.js");
            const reader = new OggPacketReader();
            const data = new Uint8Array(bytes);
            const packets = [];
            for (let i = 0; i < data.length; i += chunk) packets.push(...reader.push(data.subarray(i, i + chunk)));
            const written = new OggPageWriter(7).page([new Uint8Array([1, 2, 3])], 960);
            return {
                packets: packets.map((p) => [Array.from(p.data), p.page.sequence]),
                pages: reader.pages,
                badPages: reader.badPages,
                written: Array.from(written),
            };
        }""",
        [list(stream), 7],
    )
    got = [(bytes(data), sequence) for data, sequence in result["packets"]]
    assert got == [
        (b"OpusHead" + bytes(11), 0),
        (big, 2),
        (small, 2),
        (exact, 3),
        (b"end", 5),
    ]
    assert (result["pages"], result["badPages"]) == (5, 1)
    # The writer's page is byte-for-byte what the independent writer makes.
    assert bytes(result["written"]) == page([3], b"\x01\x02\x03", sequence=0, flags=2, granule=960)
