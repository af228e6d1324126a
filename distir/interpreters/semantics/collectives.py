"""Semantics records of the collectives: rank queries, broadcast, the
all-reduces, all-gather and the variable all-to-all.

Each record is one block: how its op decodes, its precondition (what every
rank checks locally and what all ranks of the group must agree on before
the payload moves; the Torch backend evaluates the same rule) and its
reference rule (the definition of DESIGN.md, computed from every rank's
operands).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from xdsl.dialects.builtin import IntegerAttr

from distir.errors import CollectiveMismatchError
from distir.interpreters.checks import (
    Agreed,
    Precondition,
    check_axis_rows,
    check_ciphertext,
    check_counts,
    named_rank,
)
from distir.interpreters.invocation import Invocation
from distir.interpreters.kernels import NATIVE_FOLDS, fold_in_rank_order
from distir.interpreters.semantics.base import Inputs, OpSemantics, ReferenceCall, Results
from distir.ir.all_reduce import AllReduceOp
from distir.ir.attributes import ASSUMED_GROUP_SIZE
from distir.ir.collectives import (
    AllGatherOp,
    AllReduceAddCiphertextOp,
    AssertUniformOp,
    BroadcastOp,
    VariableAllToAllOp,
)
from distir.ir.groups import GroupSizeOp, RankOp


def same_layout(call: ReferenceCall, values: Sequence[torch.Tensor], what: str) -> None:
    first = values[0]
    for r, v in enumerate(values):
        if v.shape != first.shape or v.dtype != first.dtype:
            raise CollectiveMismatchError(
                call.invocation.description,
                f"{what} of rank {r} is {list(v.shape)} {v.dtype} but rank 0 has "
                f"{list(first.shape)} {first.dtype}",
            )


class RankSemantics(OpSemantics):
    op = RankOp

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        return (torch.tensor(call.me, dtype=torch.int64),)


class GroupSizeSemantics(OpSemantics):
    op = GroupSizeOp

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        return (torch.tensor(call.size, dtype=torch.int64),)


class BroadcastSemantics(OpSemantics):
    op = BroadcastOp

    def decode(self, op: BroadcastOp) -> dict[str, Any]:
        return {"root": None if op.root is None else op.root.value.data}

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        static_root = inv.properties["root"]
        root = named_rank(inv, "root", list(inputs[1:]), size)
        agreed = [Agreed.value("roots", root)] if static_root is None else []
        if inv.dynamic(0):
            agreed.append(Agreed.layout("message layouts", inputs[0]))
        return Precondition(agreed=agreed, decoded={"root": root})

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        mine, everyone = call.agree(inputs)
        same_layout(call, [ops[0] for ops in everyone], "the message")
        return (everyone[mine.decoded["root"]][0].clone(),)


class AllReduceSemantics(OpSemantics):
    op = AllReduceOp

    def decode(self, op: AllReduceOp) -> dict[str, Any]:
        assumed = op.attributes.get(ASSUMED_GROUP_SIZE)
        return {
            "kind": None if op.is_generic else str(op.kind.data),
            "assumed_max_group_size": (
                assumed.value.data if isinstance(assumed, IntegerAttr) else None
            ),
        }

    def fresh_results(self, op: AllReduceOp) -> bool:
        # A generic all-reduce's combine region may yield one of its operands.
        return not op.is_generic

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        agreed = [Agreed.layout("input layouts", inputs[0])] if inv.dynamic(0) else []
        agreed += [Agreed.tensor(f"extra operand #{i}", e) for i, e in enumerate(inputs[1:])]
        return Precondition(agreed=agreed)

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        _, everyone = call.agree(inputs)
        values = [ops[0] for ops in everyone]
        same_layout(call, values, "the input")
        values[0] = values[0].clone()  # never the caller's tensor, even for one rank
        kind = call.invocation.properties["kind"]
        if kind is not None:
            fold = NATIVE_FOLDS[kind]
            return (fold_in_rank_order(lambda a, b: (fold(a, b),), values),)
        return (fold_in_rank_order(call.invocation.regions[0], values, inputs[1:]),)


class AllReduceAddCiphertextSemantics(OpSemantics):
    op = AllReduceAddCiphertextOp

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        ct, moduli = inputs
        q_max = check_ciphertext(inv.description, ct, moduli)
        agreed = [Agreed.tensor("moduli", moduli)]
        if inv.dynamic(0):
            agreed.append(Agreed.layout("ciphertext layouts", ct))
        return Precondition(agreed=agreed, decoded={"q_max": q_max})

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        _, everyone = call.agree(inputs)
        values = [ops[0] for ops in everyone]
        same_layout(call, values, "the ciphertext")
        values[0] = values[0].clone()
        q = inputs[1].view(-1, 1)
        # exact: both addends are below q < 2^62
        return (fold_in_rank_order(lambda a, b: (torch.remainder(a + b, q),), values),)


class AssertUniformSemantics(OpSemantics):
    op = AssertUniformOp

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        return Precondition(agreed=[Agreed.tensor("values", inputs[0])])

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        call.agree(inputs)
        return ()


class _AlongAxis(OpSemantics):
    """A collective that concatenates or splits rows along an `axis`."""

    def decode(self, op: AllGatherOp | VariableAllToAllOp) -> dict[str, Any]:
        return {"axis": op.axis.value.data}


class AllGatherSemantics(_AlongAxis):
    op = AllGatherOp

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
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

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        _, everyone = call.agree(inputs)
        parts = [ops[0] for ops in everyone]
        if len(inputs) == 1:
            same_layout(call, parts, "the input")
        return (torch.cat(parts, dim=call.invocation.properties["axis"]),)


class VariableAllToAllSemantics(_AlongAxis):
    op = VariableAllToAllOp

    def precondition(self, inv: Invocation, inputs: Inputs, size: int, rank: int) -> Precondition:
        x, axis = inputs[0], inv.properties["axis"]
        send = check_counts(inv, "send counts", inputs[1], size)
        check_axis_rows(inv, x, axis, sum(send), "the sum of send counts")
        agreed = [Agreed.layout("row layouts", x, skip_axis=axis)] if inv.dynamic(0) else []
        return Precondition(agreed=agreed, decoded={"send": send})

    def reference(self, call: ReferenceCall, inputs: Inputs) -> Results:
        _, everyone = call.agree(inputs)
        axis = call.invocation.properties["axis"]
        received, recv_counts = [], []
        for x, send_counts in everyone:
            sizes = [int(c) for c in send_counts.tolist()]
            received.append(torch.split(x, sizes, dim=axis)[call.me])
            recv_counts.append(sizes[call.me])
        counts_dtype = inputs[1].dtype
        return (torch.cat(received, dim=axis), torch.tensor(recv_counts, dtype=counts_dtype))
