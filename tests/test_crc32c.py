"""CRC-32C: RFC 3720 vectors, and the SSE4.2 and PCLMULQDQ paths equal the portable one."""

import random
import re
from pathlib import Path

import pytest

from durkv.log import crc32c, crc32c_clmul, crc32c_hw, crc32c_portable

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


def test_hw_reports_clmul_only_with_sse42():
    assert crc32c_clmul() in (True, False)
    assert crc32c_hw() or not crc32c_clmul()


@pytest.mark.parametrize("seed", [0, 1, 0xFFFFFFFF, 0x12345678])
def test_folded_lengths_equal_portable(seed):
    """Every length across the fold's edges: its first four blocks (64), its 16-byte
    steps and the tail the crc32 instruction finishes, each at a random alignment."""
    rng = random.Random(seed)
    blob = bytes(rng.getrandbits(8) for _ in range(200_000))
    mv = memoryview(blob)
    for length in list(range(60, 400)) + [1023, 1024, 1025, 8191, 65_536 + 5, 199_000]:
        align = rng.randrange(16)
        chunk = mv[align:align + length]
        assert crc32c(chunk, seed) == crc32c_portable(chunk, seed), (length, align)


def test_fold_constants_are_the_polynomials_powers():
    """csrc/crc32c.c's fold constants: x^(D+63) and x^(D-1) mod P, bit-reflected, in the
    high 32 bits, for folds of D = 512 and 128 bits (the comment above them says why)."""
    poly = (1 << 32) | 0x1EDC6F41

    def x_pow_mod(n):
        r = 1
        for _ in range(n):
            r <<= 1
            if r >> 32:
                r ^= poly
        return r

    def const(n):
        return int(f"{x_pow_mod(n):032b}"[::-1], 2) << 32

    src = (Path(__file__).parents[1] / "csrc" / "crc32c.c").read_text()
    for name, dist in (("fold512", 512), ("fold128", 128)):
        m = re.search(name + r"\[2\] = \{(0x[0-9a-f]+)ull, (0x[0-9a-f]+)ull\}", src)
        assert m, name
        assert [int(v, 16) for v in m.groups()] == [const(dist + 63), const(dist - 1)]
