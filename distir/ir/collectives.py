"""The shared base of the collective ops (`CollectiveOp`) and the verifier
helpers their families share; each collective lives in its family folder
under `distir/ops/`."""

from __future__ import annotations

from abc import ABC

from xdsl.dialects.builtin import (
    IntegerType,
    TensorType,
)
from xdsl.ir import Attribute
from xdsl.irdl import (
    IRDLOperation,
    traits_def,
)
from xdsl.utils.exceptions import VerifyException

from distir.ir.attributes import (
    CollectiveEffect,
)
from distir.ir.facts import (
    EveryRankEnters,
)
from distir.ops.groups.ir import GroupMemberOp


class CollectiveOp(GroupMemberOp, ABC):
    """A collective: every rank of the group must execute it, in the same order."""

    traits = traits_def(CollectiveEffect(), EveryRankEnters())


def is_integer_tensor(t: Attribute) -> bool:
    return isinstance(t, TensorType) and isinstance(t.element_type, IntegerType)


def verify_same_type(op: IRDLOperation, what: str, got: Attribute, expected: Attribute) -> None:
    if got != expected:
        raise VerifyException(
            f"'{op.name}' result type {got} must equal the {what} type {expected}"
        )


###############################################################################
# Gathers and all-to-all
###############################################################################


def verify_axis(op: IRDLOperation, axis: int, t: TensorType) -> None:
    rank = t.get_num_dims()
    if not 0 <= axis < rank:
        raise VerifyException(f"'{op.name}' axis {axis} is out of range for {t} (rank {rank})")


def verify_counts_type(op: IRDLOperation, what: str, t: Attribute) -> None:
    if not is_integer_tensor(t):
        raise VerifyException(f"'{op.name}' {what} must be a tensor of integers, got {t}")
    assert isinstance(t, TensorType)
    if t.get_num_dims() != 1:
        raise VerifyException(f"'{op.name}' {what} must have rank 1, got {t}")


def verify_count_entries(op: IRDLOperation, what: str, t: Attribute, size: int | None) -> None:
    """A counts tensor (`verify_counts_type`) has one entry per rank of a
    group of static `size` (a dynamic length or size: no check)."""
    assert isinstance(t, TensorType)
    n = t.get_shape()[0]
    if size is not None and n >= 0 and n != size:
        raise VerifyException(f"'{op.name}' {what} has {n} entries for a group of size {size}")


def verify_counts(op: IRDLOperation, what: str, t: Attribute, size: int | None) -> None:
    """Counts are a rank-1 integer tensor with one entry per group rank."""
    verify_counts_type(op, what, t)
    verify_count_entries(op, what, t, size)


class AlongAxisOp(CollectiveOp, ABC):
    """A collective that moves rows of its `input` along its `axis` into its
    `result` (the all-gather, the variable all-to-all, the gather and the
    scatter, the reduce-scatter): what each of their verifiers checks first."""

    def verify_along_axis(self) -> tuple[TensorType, TensorType, int]:
        """The group, the axis in range for the input, and the result like
        the input but along the axis; returns the input's and the result's
        types and the axis."""
        self.verify_group()
        t_in, t_out = self.input.type, self.result.type  # type: ignore[attr-defined]
        assert isinstance(t_in, TensorType) and isinstance(t_out, TensorType)
        axis = self.axis.value.data  # type: ignore[attr-defined]
        verify_axis(self, axis, t_in)
        verify_same_except_axis(self, axis, t_in, t_out)
        return t_in, t_out, axis


def verify_same_except_axis(op: IRDLOperation, axis: int, a: TensorType, b: TensorType) -> None:
    if a.element_type != b.element_type:
        raise VerifyException(
            f"'{op.name}' result element type {b.element_type} must equal the "
            f"input element type {a.element_type}"
        )
    if a.get_num_dims() != b.get_num_dims():
        raise VerifyException(f"'{op.name}' result {b} must have the rank of {a}")
    for d, (x, y) in enumerate(zip(a.get_shape(), b.get_shape())):
        if d != axis and x >= 0 and y >= 0 and x != y:
            raise VerifyException(
                f"'{op.name}' result {b} differs from input {a} in dimension {d}, "
                f"which is not the axis {axis}"
            )
