"""The weight sync's message digest: what it is (a pure-Python oracle of its
definition) and what it is claimed to detect (every change confined to 64
consecutive bits, so every flipped byte; whole blocks moved)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distir.runtime.weight_sync import _DIGEST_BLOCK, _digest

MASK = (1 << 64) - 1


def _oracle(data: bytes) -> tuple[int, int]:
    """The digest's definition in plain Python integers."""
    padded = data + bytes(-len(data) % 8)
    words = [int.from_bytes(padded[i : i + 8], "little") for i in range(0, len(padded), 8)]
    blocks = [
        sum(words[i : i + _DIGEST_BLOCK]) % (1 << 64)
        for i in range(0, len(words), _DIGEST_BLOCK)
    ]
    first = sum(blocks) % (1 << 64)
    second = sum((j + 1) * b for j, b in enumerate(blocks)) % (1 << 64)
    return first, second


def _unsigned(digest: torch.Tensor) -> tuple[int, int]:
    return tuple(int(v) & MASK for v in digest.tolist())


def _buffer(data: bytes, misalign: int) -> torch.Tensor:
    """``data`` as a uint8 tensor starting ``misalign`` bytes past an 8-byte boundary."""
    raw = torch.zeros(len(data) + 8, dtype=torch.uint8)
    out = raw[misalign : misalign + len(data)]
    out.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else out)
    return out


@given(st.binary(min_size=0, max_size=3 * 8 * _DIGEST_BLOCK + 13), st.integers(0, 7))
@settings(max_examples=60, deadline=None)
def test_the_digest_is_its_definition(data, misalign):
    assert _unsigned(_digest(_buffer(data, misalign))) == _oracle(data)


@given(
    st.integers(1, 2 * 8 * _DIGEST_BLOCK + 21),
    st.integers(0, 2**32 - 1),
    st.data(),
)
@settings(max_examples=200, deadline=None)
def test_any_flipped_byte_changes_the_digest(nbytes, seed, data):
    g = torch.Generator().manual_seed(seed)
    buffer = torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8)
    before = _digest(buffer)
    at = data.draw(st.integers(0, nbytes - 1))
    buffer[at] ^= data.draw(st.integers(1, 255))
    assert not torch.equal(_digest(buffer), before)


@given(st.integers(0, 2**32 - 1), st.integers(0, 8 * 40 - 64), st.integers(1, 64), st.data())
@settings(max_examples=200, deadline=None)
def test_any_burst_of_up_to_64_bits_changes_the_first_sum(seed, start, length, data):
    g = torch.Generator().manual_seed(seed)
    buffer = torch.randint(0, 256, (40,), generator=g, dtype=torch.uint8)
    before = _digest(buffer)
    # a nonzero error pattern whose first and last bits are set: a burst of ``length`` bits
    middle = data.draw(st.integers(0, max(0, (1 << max(0, length - 2)) - 1)))
    pattern = 1 if length == 1 else (1 << (length - 1)) | (middle << 1) | 1
    value = int.from_bytes(bytes(buffer.tolist()), "little") ^ (pattern << start)
    buffer = torch.tensor(list(value.to_bytes(40, "little")), dtype=torch.uint8)
    assert int(_digest(buffer)[0]) != int(before[0])


def test_two_blocks_swapped_change_the_second_sum():
    g = torch.Generator().manual_seed(3)
    buffer = torch.randint(0, 256, (3 * 8 * _DIGEST_BLOCK,), generator=g, dtype=torch.uint8)
    block = 8 * _DIGEST_BLOCK
    swapped = torch.cat([buffer[block : 2 * block], buffer[:block], buffer[2 * block :]])
    a, b = _digest(buffer), _digest(swapped)
    assert int(a[0]) == int(b[0])  # the plain sum cannot see it
    assert int(a[1]) != int(b[1])
