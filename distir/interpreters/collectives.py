"""Run-time meaning of the collectives: preconditions and reference rules.

For each collective, in one block: its *precondition* (what every rank checks
locally and what all ranks of the group must agree on before the payload
moves; the Torch backend evaluates the same rule) and its *reference rule*
(the definition of DESIGN.md, computed from every rank's operands).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from distir.errors import CollectiveMismatchError
from distir.interpreters.checks import (
    Agreed,
    Precondition,
    check_axis_rows,
    check_ciphertext,
    check_counts,
    check_root,
    precondition,
)
from distir.interpreters.invocation import Invocation
from distir.interpreters.kernels import NATIVE_FOLDS
from distir.interpreters.reference import SimulatedCall, reference
from distir.ir.dialect import (
    AllGatherOp,
    AllReduceAddCiphertextOp,
    AllReduceOp,
    AssertUniformOp,
    BroadcastOp,
    GroupSizeOp,
    RankOp,
    VariableAllToAllOp,
)

Inputs = Sequence[torch.Tensor]


def _same_layout(call: SimulatedCall, values: Sequence[torch.Tensor], what: str) -> None:
    first = values[0]
    for r, v in enumerate(values):
        if v.shape != first.shape or v.dtype != first.dtype:
            raise CollectiveMismatchError(
                call.invocation.description,
                f"{what} of rank {r} is {list(v.shape)} {v.dtype} but rank 0 has "
                f"{list(first.shape)} {first.dtype}",
            )


# dist.rank, dist.group_size ---------------------------------------------------------


@reference(RankOp)
def rank_reference(call: SimulatedCall, inputs: Inputs) -> tuple[torch.Tensor, ...]:
    return (torch.tensor(call.me, dtype=torch.int64),)


@reference(GroupSizeOp)
def group_size_reference(call: SimulatedCall, inputs: Inputs) -> tuple[torch.Tensor, ...]:
    return (torch.tensor(call.size, dtype=torch.int64),)


# dist.broadcast ------------------------------------------------------------------


@precondition(BroadcastOp)
def broadcast_precondition(inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
    static_root = inv.properties["root"]
    root = int(inputs[1]) if static_root is None else static_root
    check_root(inv, root, size)
    agreed = [Agreed.value("roots", root)] if static_root is None else []
    if inv.dynamic(0):
        agreed.append(Agreed.layout("message layouts", inputs[0]))
    return Precondition(agreed=agreed, decoded={"root": root})


@reference(BroadcastOp)
def broadcast_reference(call: SimulatedCall, inputs: Inputs) -> tuple[torch.Tensor, ...]:
    mine, everyone = call.agree(inputs)
    _same_layout(call, [ops[0] for ops in everyone], "the message")
    return (everyone[mine.decoded["root"]][0].clone(),)


# dist.all_reduce -------------------------------------------------------------------


@precondition(AllReduceOp)
def all_reduce_precondition(inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
    agreed = [Agreed.layout("input layouts", inputs[0])] if inv.dynamic(0) else []
    agreed += [Agreed.tensor(f"extra operand #{i}", e) for i, e in enumerate(inputs[1:])]
    return Precondition(agreed=agreed)


@reference(AllReduceOp)
def all_reduce_reference(call: SimulatedCall, inputs: Inputs) -> tuple[torch.Tensor, ...]:
    _, everyone = call.agree(inputs)
    values = [ops[0] for ops in everyone]
    _same_layout(call, values, "the input")
    kind = call.invocation.properties["kind"]
    acc = values[0].clone()
    if kind is not None:
        for v in values[1:]:
            acc = NATIVE_FOLDS[kind](acc, v)
        return (acc,)
    extras = inputs[1:]
    for v in values[1:]:
        (acc,) = call.invocation.regions[0](acc, v, *extras)
    return (acc,)


# dist.all_reduce_add_ciphertext ------------------------------------------------------


@precondition(AllReduceAddCiphertextOp)
def ciphertext_precondition(
    inv: Invocation, inputs: Inputs, size: int, rank: int
) -> Precondition:
    ct, moduli = inputs
    q_max = check_ciphertext(inv, ct, moduli)
    agreed = [Agreed.tensor("moduli", moduli)]
    if inv.dynamic(0):
        agreed.append(Agreed.layout("ciphertext layouts", ct))
    return Precondition(agreed=agreed, decoded={"q_max": q_max})


@reference(AllReduceAddCiphertextOp)
def ciphertext_reference(call: SimulatedCall, inputs: Inputs) -> tuple[torch.Tensor, ...]:
    _, everyone = call.agree(inputs)
    values = [ops[0] for ops in everyone]
    _same_layout(call, values, "the ciphertext")
    q = inputs[1].view(-1, 1)
    acc = values[0].clone()
    for v in values[1:]:
        acc = torch.remainder(acc + v, q)  # exact: both < 2^62
    return (acc,)


# dist.assert_uniform ---------------------------------------------------------------------


@precondition(AssertUniformOp)
def assert_uniform_precondition(
    inv: Invocation, inputs: Inputs, size: int, rank: int
) -> Precondition:
    return Precondition(agreed=[Agreed.tensor("values", inputs[0])])


@reference(AssertUniformOp)
def assert_uniform_reference(call: SimulatedCall, inputs: Inputs) -> tuple[torch.Tensor, ...]:
    call.agree(inputs)
    return ()


# dist.all_gather -----------------------------------------------------------------------


@precondition(AllGatherOp)
def all_gather_precondition(inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
    x, axis = inputs[0], inv.properties["axis"]
    if len(inputs) == 1:
        agreed = [Agreed.layout("input layouts", x)] if inv.dynamic(0) else []
        return Precondition(agreed=agreed)
    counts = check_counts(inv, "counts", inputs[1], size)
    check_axis_rows(inv, x, axis, counts[rank], f"counts[{rank}]")
    agreed = [Agreed.value("counts", counts)]
    if inv.dynamic(0):
        agreed.append(Agreed.layout("input layouts", x, skip_axis=axis))
    return Precondition(agreed=agreed, decoded={"counts": counts})


@reference(AllGatherOp)
def all_gather_reference(call: SimulatedCall, inputs: Inputs) -> tuple[torch.Tensor, ...]:
    _, everyone = call.agree(inputs)
    parts = [ops[0] for ops in everyone]
    if len(inputs) == 1:
        _same_layout(call, parts, "the input")
    return (torch.cat(parts, dim=call.invocation.properties["axis"]),)


# dist.variable_all_to_all ----------------------------------------------------------------


@precondition(VariableAllToAllOp)
def all_to_all_precondition(inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
    x, axis = inputs[0], inv.properties["axis"]
    send = check_counts(inv, "send counts", inputs[1], size)
    check_axis_rows(inv, x, axis, sum(send), "the sum of send counts")
    agreed = [Agreed.layout("row layouts", x, skip_axis=axis)] if inv.dynamic(0) else []
    return Precondition(agreed=agreed, decoded={"send": send})


@reference(VariableAllToAllOp)
def all_to_all_reference(call: SimulatedCall, inputs: Inputs) -> tuple[torch.Tensor, ...]:
    _, everyone = call.agree(inputs)
    axis = call.invocation.properties["axis"]
    received, recv_counts = [], []
    for x, send_counts in everyone:
        sizes = [int(c) for c in send_counts.tolist()]
        received.append(torch.split(x, sizes, dim=axis)[call.me])
        recv_counts.append(sizes[call.me])
    counts_dtype = inputs[1].dtype
    return (torch.cat(received, dim=axis), torch.tensor(recv_counts, dtype=counts_dtype))
