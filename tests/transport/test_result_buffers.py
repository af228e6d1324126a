"""The result pool never hands out memory something still holds.

Collectives take results of 64 KiB and more from a pool and reuse a buffer
once the caller dropped it. Whatever the caller keeps of a result (the
tensor, a view, its `untyped_storage()` or `storage()`, a NumPy array, a
DLPack capsule) must keep its memory out of the pool: a Python storage
object does not show in the storage's use count, and a result held only
through one was handed out again and overwritten by the next run.
"""

from __future__ import annotations

import warnings

import torch
import torch.utils.dlpack
from hypothesis import given
from hypothesis import strategies as st

from distir.transport.buffers import ResultBuffers

N = 1 << 15  # 128 KiB of float32: pooled
CPU = torch.device("cpu")


def _storage(y: torch.Tensor):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated, and still handed out
        return y.storage()


#: how a caller keeps (part of) a result, and how to read back what it keeps
HOLDS = {
    "the tensor": (lambda y: y, lambda h: h[0].item()),
    "a view": (lambda y: y[3:], lambda h: h[0].item()),
    "untyped_storage()": (
        lambda y: y.untyped_storage(),
        lambda h: torch.tensor([], dtype=torch.float32).set_(h)[0].item(),
    ),
    "storage()": (_storage, lambda h: h[0]),
    "numpy()": (lambda y: y.numpy(), lambda h: float(h[0])),
    "a DLPack capsule": (
        lambda y: torch.utils.dlpack.to_dlpack(y),
        None,  # read once, when the capsule is consumed at the end
    ),
}


@given(
    st.lists(
        st.tuples(st.sampled_from([*HOLDS, "nothing"]), st.integers(0, 3)),
        min_size=1,
        max_size=14,
    )
)
def test_a_buffer_is_handed_out_again_only_when_nothing_holds_its_memory(steps):
    pool = ResultBuffers(per_key=3, max_keys=2)
    kept: list[tuple[str, object, float]] = []
    for n, (hold, drop) in enumerate(steps):
        del kept[:drop]  # the caller lets go of its oldest results
        y = pool.empty(N, torch.float32, CPU)
        # whatever is still kept still reads what it was written as
        y.fill_(float(n))  # the next run writes its result
        y[3] = float(n)
        if hold != "nothing":
            keep, _ = HOLDS[hold]
            kept.append((hold, keep(y), float(n)))
        del y
        for what, holder, value in kept:
            read = HOLDS[what][1]
            if read is not None:
                assert read(holder) == value, f"{what} of result #{value:g} was overwritten"
    for what, holder, value in kept:
        if what == "a DLPack capsule":
            assert torch.utils.dlpack.from_dlpack(holder)[0].item() == value


def test_a_dropped_result_is_reused():
    pool = ResultBuffers()
    y = pool.empty(N, torch.float32, CPU)
    address = y.data_ptr()
    del y
    assert pool.empty(N, torch.float32, CPU).data_ptr() == address
