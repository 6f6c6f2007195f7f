"""CRC-32C: RFC 3720 vectors, and the SSE4.2 path equals the portable one."""

import random

import pytest

from durkv.log import crc32c, crc32c_hw, crc32c_portable

RFC3720 = [
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (b"123456789", 0xE3069283),
    (b"", 0),
]


@pytest.mark.parametrize("data,expected", RFC3720)
def test_rfc3720_vectors(data, expected):
    assert crc32c(data) == expected
    assert crc32c_portable(data) == expected


def test_seed_continues():
    a, b = b"hello, ", b"world"
    assert crc32c(b, crc32c(a)) == crc32c(a + b)
    assert crc32c_portable(b, crc32c_portable(a)) == crc32c(a + b)


def test_hw_reports_bool():
    assert crc32c_hw() in (True, False)


def test_hw_equals_portable_many_lengths_and_alignments():
    rng = random.Random(1234)
    blob = bytes(rng.getrandbits(8) for _ in range(5000))
    mv = memoryview(blob)
    for length in list(range(0, 70)) + [127, 128, 129, 1000, 4095, 4096]:
        for align in range(0, 9):
            chunk = mv[align:align + length]
            seed = rng.getrandbits(32)
            assert crc32c(chunk, seed) == crc32c_portable(chunk, seed), (length, align)


def test_accepts_buffers():
    assert crc32c(bytearray(b"123456789")) == 0xE3069283
    assert crc32c(memoryview(b"x123456789")[1:]) == 0xE3069283
