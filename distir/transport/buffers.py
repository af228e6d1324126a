"""Result buffers: allocation-free results for collectives on CPU tensors.

A fresh 64 MiB CPU tensor costs about 30 ms of page faults on the machines
distir is measured on (`copy_` into a warm buffer: about 4 ms), so
implementations take their results from a pool and reuse a buffer as soon as
nobody holds it any more. CUDA tensors come from PyTorch's caching
allocator, which already does this.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import NamedTuple

import torch

#: Below this size a fresh allocation is cheaper than a pool lookup.
POOLED_MIN_BYTES = 64 * 1024

_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)


class _Buffer(NamedTuple):
    """A pooled buffer and the Python object of its storage, which the pool
    holds so that every `untyped_storage()` of the buffer or a view of it
    returns this very object: a user who keeps one shows in its references
    (a Python storage object does not show in the storage's use count)."""

    tensor: torch.Tensor
    storage: torch.UntypedStorage


def _new_buffer(numel: int, dtype: torch.dtype, device: torch.device) -> _Buffer:
    tensor = torch.empty(numel, dtype=dtype, device=device)
    return _Buffer(tensor, tensor.untyped_storage())


def _held(buf: _Buffer) -> tuple[int, int]:
    """(the storage's use count, its Python object's references), each
    counted as in `_idle`."""
    return _storage_use_count(buf.storage._cdata), sys.getrefcount(buf.storage)


#: what `_held` says of a buffer nothing else holds
_IDLE = _held(_new_buffer(1, torch.float32, torch.device("cpu"))) if _storage_use_count else None


def _idle(buf: _Buffer) -> bool:
    """Whether nothing but the pool holds `buf`'s memory: no tensor or view
    of it (the use count) and no Python object of its storage."""
    use, refs = _held(buf)
    return use <= _IDLE[0] and refs <= _IDLE[1]


class ResultBuffers:
    """Flat CPU tensors handed out as results and reused once unused.

    A buffer is handed out only as a view; it is reused when no tensor other
    than the cached base shares its storage and no Python object of that
    storage is held (the user dropped the result, every view of it and its
    storage objects). Up to `per_key` buffers are kept per (numel, dtype) and
    `max_keys` keys in LRU order. CUDA tensors come from PyTorch's caching
    allocator, which already does this.
    """

    def __init__(self, per_key: int = 2, max_keys: int = 8):
        self.per_key = per_key
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self._buffers: OrderedDict[tuple, list[_Buffer]] = OrderedDict()

    def empty(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if device.type != "cpu" or _IDLE is None or numel == 0:
            return torch.empty(numel, dtype=dtype, device=device)
        key = (numel, dtype)
        with self._lock:
            entries = self._buffers.setdefault(key, [])
            self._buffers.move_to_end(key)
            for buf in entries:
                if _idle(buf):
                    return buf.tensor.view(numel)
            buf = _new_buffer(numel, dtype, device)
            entries.append(buf)
            if len(entries) > self.per_key:
                entries.pop(0)
            while len(self._buffers) > self.max_keys:
                self._buffers.popitem(last=False)
            return buf.tensor.view(numel)


#: The pool the torch implementations share.
RESULTS = ResultBuffers()


def pooled_empty(shape: tuple[int, ...] | torch.Size, like: torch.Tensor) -> torch.Tensor:
    """An uninitialised result of `shape` with `like`'s dtype and device."""
    numel = 1
    for d in shape:
        numel *= d
    if numel * like.dtype.itemsize < POOLED_MIN_BYTES:
        # Small tensors come cheaper from the allocator than from a pool lookup.
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    return RESULTS.empty(numel, like.dtype, like.device).view(shape)


def pooled_copy(x: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of `x` that owns no memory the caller holds."""
    return pooled_empty(x.shape, x).copy_(x)
