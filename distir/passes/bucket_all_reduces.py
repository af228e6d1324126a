"""`bucket-all-reduces`: fuse a wave of small native all-reduces into one.

A training step all-reduces one gradient per layer: many small tensors of the
same dtype, with the same reduction, on the same group. Each collective pays
a fixed latency (about 0.3 ms at P=2 and 1 to 6 ms at P=4 on gloo over
loopback), which dominates below a few hundred KiB. This pass packs such a
wave into one flat buffer, all-reduces it once and splits it back:

    %a = dist.all_reduce sum %x : tensor<64x32xf32>
    %b = dist.all_reduce sum %y : tensor<32xf32>

becomes

    %x_shape = arith.constant dense<2048> : tensor<1xi64>
    %x_flat = tensor.reshape %x(%x_shape) : (tensor<64x32xf32>, tensor<1xi64>) -> tensor<2048xf32>
    %packed = tensor.concat dim(0) %x_flat, %y : (tensor<2048xf32>, tensor<32xf32>) -> tensor<2080xf32>
    %bucket = dist.all_reduce sum %packed : tensor<2080xf32>
    %a_flat = tensor.extract_slice %bucket[0] [2048] [1] : tensor<2080xf32> to tensor<2048xf32>
    %a = tensor.reshape %a_flat(...) : (...) -> tensor<64x32xf32>
    %b = tensor.extract_slice %bucket[2048] [32] [1] : tensor<2080xf32> to tensor<32xf32>

Element-wise native reductions act on every element separately, so the
bucket computes the same values. The fused op sits where the last member of
the wave was; a wave closes before any op that uses one of its results (or
contains such a use) and before any op with regions that holds a collective
or a call, since the collective order inside control flow must not change.
Collectives between members in the same block are fine to pass: every rank
executes the same straight-line sequence, reordered the same way.

Inside a `dist.wave` nothing is bucketed. A wave may hold only collectives
(the packing reshapes and concat could not sit in it), and it already
submits its members together, so their latencies overlap; bucketing them
would mean packing before the wave and unpacking after it, moving ops across
the wave's boundary for a gain the wave mostly has. A wave is a barrier for
buckets outside it, as any op with regions holding a collective.

When it is faster: packing and unpacking copy the data a few times, which
costs less than one collective latency up to a few hundred KiB per tensor
and a few MiB per bucket. Members must have static shapes, rank >= 1, at most
`max-op-bytes` each; a bucket holds at most `bucket-bytes` and at least
`min-ops` members. Ops with an `algorithm` are left alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import arith, func, tensor
from xdsl.dialects.builtin import (
    DenseIntOrFPElementsAttr,
    ModuleOp,
    TensorType,
    i64,
)
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from distir.ir.analysis import static_bytes
from distir.ir.dialect import AllReduceOp, CollectiveOp, WaveOp
from distir.passes._rewrite_utils import rewrite_once, with_location
from distir.passes.options import check_options, option


def _key(op: AllReduceOp) -> tuple:
    assert not op.is_generic and isinstance(op.input.type, TensorType)
    return (op.kind.data, op.input.type.element_type, op.group)


def _has_barrier(op: Operation) -> bool:
    """An op with regions holding a collective or a call: waves do not cross it."""
    return bool(op.regions) and any(
        isinstance(inner, CollectiveOp | func.CallOp) for inner in op.walk() if inner is not op
    )


def _uses_any(op: Operation, values: set[SSAValue]) -> bool:
    return any(v in values for inner in op.walk() for v in inner.operands)


@dataclass
class AllReduceWaveBucketing(RewritePattern):
    """Starting at the first member of a wave, gather the compatible small
    native all-reduces that follow and fuse them into one."""

    max_op_bytes: int
    bucket_bytes: int
    min_ops: int
    created: set[Operation] = field(default_factory=set)

    def candidate(self, op: Operation) -> bool:
        if not isinstance(op, AllReduceOp) or op.is_generic or op.algorithm is not None:
            return False
        if op in self.created or op.attributes or isinstance(op.parent_op(), WaveOp):
            return False
        t = op.input.type
        if not isinstance(t, TensorType) or t.get_num_dims() < 1:
            return False
        size = static_bytes(t)
        return size is not None and size <= self.max_op_bytes

    def wave(self, first: AllReduceOp) -> list[AllReduceOp]:
        key = _key(first)
        members = [first]
        results: set[SSAValue] = {first.result}
        total = static_bytes(first.input.type) or 0
        op = first.next_op
        while op is not None:
            if _uses_any(op, results) or _has_barrier(op):
                break
            if self.candidate(op) and _key(op) == key:
                assert isinstance(op, AllReduceOp)
                size = static_bytes(op.input.type) or 0
                if total + size > self.bucket_bytes:
                    break
                members.append(op)
                results.add(op.result)
                total += size
            op = op.next_op
        return members

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: AllReduceOp, rewriter: PatternRewriter) -> None:
        if not self.candidate(op):
            return
        members = self.wave(op)
        if len(members) < max(2, self.min_ops):
            return
        self.created.update(members)  # never start a wave inside this one again
        last = members[-1]
        element = op.input.type.element_type  # type: ignore[union-attr]

        packing: list[Operation] = []
        flats: list[SSAValue] = []
        for member in members:
            t = member.input.type
            assert isinstance(t, TensorType)
            if t.get_num_dims() == 1:
                flats.append(member.input)
                continue
            n = math.prod(t.get_shape())
            shape = arith.ConstantOp(DenseIntOrFPElementsAttr.from_list(TensorType(i64, [1]), [n]))
            flat = tensor.ReshapeOp(member.input, shape.result, TensorType(element, [n]))
            hint = member.input.name_hint
            if hint:
                shape.result.name_hint, flat.result.name_hint = f"{hint}_shape", f"{hint}_flat"
            with_location([shape, flat], member.location)
            packing += [shape, flat]
            flats.append(flat.result)
        total = sum(math.prod(m.input.type.get_shape()) for m in members)  # type: ignore[union-attr]
        packed = tensor.ConcatOp(flats, 0, TensorType(element, [total]))
        packed.result.name_hint = "packed"
        bucket = AllReduceOp(packed.result, kind=op.kind.data, group=op.group)  # type: ignore[union-attr]
        bucket.result.name_hint = "bucket"
        with_location([packed, bucket], op.location)
        rewriter.insert([*packing, packed, bucket], InsertPoint.before(last))
        self.created.add(bucket)

        offset = 0
        for member in members:
            t = member.input.type
            assert isinstance(t, TensorType)
            n = math.prod(t.get_shape())
            piece = tensor.ExtractSliceOp.from_static_parameters(bucket.result, [offset], [n])
            unpacking: list[Operation] = [piece]
            value = piece.result
            if t.get_num_dims() != 1:
                dims = list(t.get_shape())
                shape = arith.ConstantOp(
                    DenseIntOrFPElementsAttr.from_list(TensorType(i64, [len(dims)]), dims)
                )
                back = tensor.ReshapeOp(piece.result, shape.result, t)
                unpacking += [shape, back]
                value = back.result
            hint = member.result.name_hint
            if hint:
                value.name_hint = hint
                if value is not piece.result:
                    piece.result.name_hint = f"{hint}_flat"
                    unpacking[1].results[0].name_hint = f"{hint}_shape"
            with_location(unpacking, member.location)
            rewriter.insert(unpacking, InsertPoint.before(last))
            offset += n
            rewriter.replace_all_uses_with(member.result, value)
        for member in members:
            rewriter.erase(member)


@dataclass(frozen=True)
class BucketAllReducesPass(ModulePass):
    """Fuse waves of small native all-reduces of the same kind, element type
    and group into one all-reduce of a packed buffer."""

    name = "bucket-all-reduces"

    max_op_bytes: int = option(256 << 10, minimum=1)
    """Largest all-reduce (bytes) that joins a bucket."""

    bucket_bytes: int = option(4 << 20, minimum=1)
    """Largest packed buffer (bytes)."""

    min_ops: int = option(2, minimum=2)
    """Fewest members worth a bucket."""

    def __post_init__(self) -> None:
        check_options(self)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        rewrite_once(op, AllReduceWaveBucketing(self.max_op_bytes, self.bucket_bytes, self.min_ops))
