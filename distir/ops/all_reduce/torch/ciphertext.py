"""`dist.all_reduce_add_ciphertext`: the automatic sum (`ciphertext-auto`),
exact and as fast as the int64 headroom allows, and the two alternatives
(`exact-modular-sum`, and `rns-combine` through an RNS backend's prepared
add).

Its schedule is chosen at run time from the group size P, the largest
modulus q_max and the message size (`ciphertext_schedule`):

* `native-deferred` for small messages when P·(q_max−1) ≤ 2^63−1: one
  native int64 sum, then one reduction (conditional subtractions up to P=4,
  a remainder beyond; one collective's latency instead of the ring's
  2(P−1) rounds);
* `deferred-ring` when P·(q_max−1) ≤ 2^63−1: a ring whose limbs are added
  without reduction through the reduce-scatter, the owned 1/P chunk reduced
  once, tile by tile, before the all-gather;
* `lazy-ring` otherwise: a segment is reduced only before its next addition
  could pass 2^63−1; with q_max near 2^62 that is a modular ring, one
  reduction after every addition.

(A native int64 sum followed by one reduction of the whole result was
measured for large messages too: at P=4 on two cores it took 1.6x gloo's sum
against 1.06x for the deferred ring, as it reduces all the data, out of
cache; measured again with conditional subtractions instead of the
remainder, 16 MiB, two runs side by side: P=2 27.2-28.1 ms against the
deferred ring's 26.1-26.3 ms, P=4 69.2-69.7 ms against 56.6-58.7 ms,
donated.) Limbs are checked to be reduced, and the ranks agree on it and on
the moduli, before any limb is sent.

The ciphertext sum is an all-reduce whose combine is the modular add
(`lower-ciphertext-add` makes it one): its implementations share the
all-reduce's algorithms and combines, so they live in this package.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from distir.core.invocation import Invocation
from distir.he.rns import TorchRNSBackend
from distir.ir.modular import int64_sum_is_exact, lazy_reduction_schedule
from distir.ops.all_reduce.ciphertext import AllReduceAddCiphertextOp
from distir.ops.all_reduce.torch.combines import LazyModularAdd, ModuliPieces, reduce_bounded
from distir.ops.all_reduce.torch.ring import ring_all_reduce
from distir.transport.buffers import pooled_copy, pooled_empty
from distir.transport.exchange import TorchExchange
from distir.transport.protocol import Transport
from distir.transport.registry import Implementation
from distir.transport.results import gather_stacked, writable_result

#: Below this many bytes, a native int64 sum (one collective) beats the
#: ring's 2(P - 1) message rounds when the headroom allows it.
NATIVE_DEFERRED_MAX_BYTES = 1 << 20


def ciphertext_schedule(size: int, q_max: int, nbytes: int) -> str:
    """`native-deferred`, `deferred-ring` or `lazy-ring` (see the module)."""
    if not int64_sum_is_exact(size, q_max):
        return "lazy-ring"
    return "native-deferred" if nbytes <= NATIVE_DEFERRED_MAX_BYTES else "deferred-ring"


class CiphertextAllReduceImplementation(Implementation):
    """The automatic ciphertext sum (see the module docstring)."""

    name = "ciphertext-auto"
    operation_types = (AllReduceAddCiphertextOp,)
    priority = 1

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        ct, moduli = inputs
        q_max = resources.precondition(invocation, inputs).decoded["q_max"]
        flat = ct.contiguous().reshape(-1)
        in_place = 0 in writable and flat.data_ptr() == ct.data_ptr()
        out = flat if in_place else pooled_empty((flat.numel(),), ct)
        size = resources.size
        if size == 1 or flat.numel() == 0:
            if not in_place:
                out.copy_(flat)
            return (out.view(ct.shape),)
        schedule = ciphertext_schedule(size, q_max, flat.numel() * flat.element_size())
        if schedule == "native-deferred":
            if not in_place:
                out.copy_(flat)
            resources.all_reduce(out, dist.ReduceOp.SUM, invocation, wait=True)
            # Sums lie in [0, P(q - 1)]: conditional subtractions for P <= 4
            # (three passes each), one remainder beyond.
            reduce_bounded(out, ModuliPieces.per_row(moduli.to(ct.device), ct.shape), 0, size)
            return (out.view(ct.shape),)
        lazy = LazyModularAdd(ModuliPieces.per_row(moduli.to(ct.device), ct.shape))
        combines = [lazy.step_combine(b) for b in lazy_reduction_schedule(size, q_max)]
        ring_all_reduce(flat, out, combines.__getitem__, TorchExchange(resources, invocation))
        return (out.view(ct.shape),)


class ExactCiphertextAddImplementation(Implementation):
    """Per-limb modular sum, exact: a native int64 sum plus one remainder when
    P·(q_max−1) fits in int64, otherwise gather and fold with a modular add."""

    name = "exact-modular-sum"
    operation_types = (AllReduceAddCiphertextOp,)

    def __init__(self) -> None:
        self.rns = TorchRNSBackend()

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        ct, moduli = inputs
        q_max = resources.precondition(invocation, inputs).decoded["q_max"]
        if int64_sum_is_exact(resources.size, q_max):
            y = writable_result(ct, 0, writable)
            resources.all_reduce(y, dist.ReduceOp.SUM, invocation, wait=True)
            torch.remainder(y, moduli.to(y.device).view(-1, 1), out=y)
            return (y,)
        stacked = gather_stacked(ct, resources, invocation)
        acc = pooled_copy(stacked[0])
        for other in stacked.unbind(0)[1:]:
            self.rns.add_mod_(acc, other, moduli)
        return (acc,)


class CombineCiphertextAddImplementation(Implementation):
    """Ciphertext sum through an RNS backend's prepared add combine (see
    `distributed_operation_contributions(ciphertext_add=...)`)."""

    name = "rns-combine"
    operation_types = (AllReduceAddCiphertextOp,)
    priority = 1

    def __init__(self, combine: Callable[..., torch.Tensor]):
        self.combine = combine

    def execute(
        self,
        invocation: Invocation,
        inputs: Sequence[torch.Tensor],
        resources: Transport,
        writable: frozenset[int] = frozenset(),
    ) -> tuple[torch.Tensor, ...]:
        ct, moduli = inputs
        resources.precondition(invocation, inputs)
        stacked = gather_stacked(ct, resources, invocation)
        acc = pooled_copy(stacked[0])
        in_place_add = getattr(self.combine, "in_place", None)
        for other in stacked.unbind(0)[1:]:
            acc = in_place_add(acc, other, moduli) if in_place_add else self.combine(
                acc, other, moduli
            )
        return (acc,)
