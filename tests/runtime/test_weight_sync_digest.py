"""The weight sync's message digest: what it is (CRC-32 and the length,
against a bit-by-bit definition of CRC-32 in plain Python) and what it is
claimed to detect: every flipped byte, every burst of up to 32 bits, every
pair of flipped bits — including the pair a sum of words cannot see (a bit
set in one word and the same bit cleared in another)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distir.runtime.weight_sync import _digest


def _crc32(data: bytes) -> int:
    """CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320), bit by bit."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _bytes(buffer: torch.Tensor) -> bytes:
    return bytes(buffer.tolist())


def _random(nbytes: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8)


@given(st.binary(min_size=0, max_size=300))
@settings(max_examples=60, deadline=None)
def test_the_digest_is_crc32_and_the_length(data):
    buffer = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if data
        else torch.zeros(0, dtype=torch.uint8)
    )
    assert _digest(buffer).tolist() == [_crc32(data), len(data)]


@given(st.integers(1, 9000), st.integers(0, 2**32 - 1), st.data())
@settings(max_examples=200, deadline=None)
def test_any_flipped_byte_changes_the_digest(nbytes, seed, data):
    buffer = _random(nbytes, seed)
    before = _digest(buffer)
    at = data.draw(st.integers(0, nbytes - 1))
    buffer[at] ^= data.draw(st.integers(1, 255))
    assert not torch.equal(_digest(buffer), before)


@given(st.integers(0, 2**32 - 1), st.integers(0, 8 * 40 - 32), st.integers(1, 32), st.data())
@settings(max_examples=200, deadline=None)
def test_any_burst_of_up_to_32_bits_changes_the_digest(seed, start, length, data):
    buffer = _random(40, seed)
    before = _digest(buffer)
    middle = data.draw(st.integers(0, max(0, (1 << max(0, length - 2)) - 1)))
    pattern = 1 if length == 1 else (1 << (length - 1)) | (middle << 1) | 1
    value = int.from_bytes(_bytes(buffer), "little") ^ (pattern << start)
    after = torch.tensor(list(value.to_bytes(40, "little")), dtype=torch.uint8)
    assert not torch.equal(_digest(after), before)


@given(st.integers(16, 65536), st.integers(0, 2**32 - 1), st.data())
@settings(max_examples=200, deadline=None)
def test_any_two_flipped_bits_change_the_digest(nbytes, seed, data):
    """Among them the pair that cancels in any sum of 64-bit words: bit k
    set in one word and bit k cleared in another."""
    buffer = _random(nbytes, seed)
    before = _digest(buffer)
    first = data.draw(st.integers(0, 8 * nbytes - 1))
    second = data.draw(st.integers(0, 8 * nbytes - 1).filter(lambda b: b != first))
    for bit in (first, second):
        buffer[bit // 8] ^= 1 << (bit % 8)
    assert not torch.equal(_digest(buffer), before)


def test_a_bit_moved_between_words_is_seen():
    """The case a sum of words misses, written out: the same bit cleared in
    one 8-byte word and set in another of the same block."""
    buffer = torch.zeros(4096, dtype=torch.uint8)
    buffer[3] = 0x10
    moved = buffer.clone()
    moved[3], moved[8 + 3] = 0, 0x10
    words = (buffer.view(torch.int64).sum(), moved.view(torch.int64).sum())
    assert words[0] == words[1]  # a sum cannot tell them apart
    assert not torch.equal(_digest(buffer), _digest(moved))
