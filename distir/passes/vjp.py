"""`vjp`: the backward of a program is a distir program.

For the entry function `@main(x...) -> (y...)` the pass adds two functions:

- `@main_fwd(x...) -> (y..., residuals...)`: `@main` itself, also returning
  the primal values its backward reads (operands of nonlinear ops, the
  counts an exchange used, the rank a broadcast compares with its root);
- `@main_bwd(dy..., residuals...) -> (dx...)`: one cotangent per float
  result of `@main`, one gradient per float argument, computed by walking
  `@main` backwards and applying each op's *transpose rule*.

Only float tensors (and float scalars) carry gradients; integer and index
values are constants of the differentiation. A transpose rule exists for
every op where the math defines one; an op that reads a float value and has
none makes the pass raise `NotDifferentiable` naming it.

Collective rules (JAX's transposes, written with distir's own ops):

    all_reduce sum x (or a combine recognised as a sum)  ->  all_reduce sum dy
    all_reduce max/min x  ->  all_reduce min (this rank where x == y, else
                              INT64_MAX; where y is NaN: where x is NaN),
                              then all_reduce sum dy kept where that lowest
                              holder is this rank (ties: the lowest rank
                              gets it all)
    broadcast x root k    ->  reduce sum dy root k (others get 0); a dynamic
                              root: all_reduce sum dy, kept on rank k
    reduce sum x root k   ->  broadcast dy root k
    gather x root k       ->  scatter dy root k (with the counts, if any)
    scatter x root k      ->  gather dy root k (with the counts, if any)
    all_gather x          ->  reduce_scatter sum dy (this rank's part)
    all_gather x counts   ->  reduce-scatter sum dy by the run-time counts:
                              variable_all_to_all dy, counts (part j to
                              rank j), then the P parts summed in rank order
    reduce_scatter sum x  ->  all_gather dy
    variable_all_to_all x, send -> (y, recv)
                          ->  variable_all_to_all dy, recv (the reverse
                              exchange: swapped counts)
    send x to d           ->  recv from d        recv from s -> send dy to s
    sendrecv x to d from s -> sendrecv dy to s from d
    transfer src -> dst   ->  transfer dst -> src, summing over the mesh axes
                              the destination replicates (a partial source
                              receives the replicated cotangent)
    wave                  ->  a wave of its ops' transposes

Each dist op declares its rule with its definition, in `ir/`
(`Transposable.transpose`, called through the `Transposer` interface that
`_Transposer` implements); the local rules below are `LOCAL_RULES`, a
literal table.

Local rules: arith (addf, subf, mulf, divf, negf, select with a scalar or
elementwise condition, extf, truncf, maximumf/minimumf/maxnumf/minnumf),
math (see `_MATH_DERIVATIVES`), tensor (extract, insert, splat,
extract_slice of unit strides, concat, cast, from_elements), `linalg.broadcast` (a sum
`linalg.reduce` over the added dimensions), a sum `linalg.reduce` (a
broadcast back), `scf.if` (branch by branch) and `scf.for` of a static trip
count (unrolled in `@main_fwd`, see `_loops_unrolled`).

The backward of a dynamic-root broadcast is an all-reduce then a local
selection: an all-reduce of the cotangent keeps the backward one collective
per forward collective (the same count and order on every rank, which is
what the agreement checks), at P times the bytes of a reduce to the root.

    %y = dist.all_reduce sum %x : tensor<4xf32>        // in @main
    // becomes, in @main_bwd(%dy):
    %dx = dist.all_reduce sum %dy : tensor<4xf32>
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import arith, func, math, scf, tensor
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    BFloat16Type,
    DenseArrayBase,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    FunctionType,
    IndexType,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.dialects.linalg.ops import BroadcastOp as LinalgBroadcastOp
from xdsl.dialects.linalg.ops import ReduceOp as LinalgReduceOp
from xdsl.dialects.linalg.ops import YieldOp as LinalgYieldOp
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.traits import IsTerminator

from distir.errors import NotDifferentiable
from distir.ir import tensor_arith
from distir.ir.analysis import is_sum_reduction
from distir.ir.dialect import CollectiveOp, PeerOp
from distir.ir.facts import RunsBodyInPlace, UniformResults
from distir.ir.parsing import describe_op, function_named
from distir.ir.transpose import Cotangents, NoDerivative, Transposable
from distir.ops.all_reduce.ir import sum_all_reduce
from distir.ops.asserts.ir import uniform_check
from distir.ops.groups.ir import group_declarations, on_rank_ops
from distir.ops.reduce.ir import sum_reduce
from distir.ops.reduce_scatter.ir import sum_reduce_scatter
from distir.ops.wave.ir import wave_around
from distir.passes._rewrite_utils import with_location

#: element types that carry gradients
FLOAT_TYPES = (Float16Type, BFloat16Type, Float32Type, Float64Type)


def is_float(t: Attribute) -> bool:
    """Whether values of type `t` carry gradients (float tensors and scalars)."""
    element = t.element_type if isinstance(t, TensorType) else t
    return isinstance(element, FLOAT_TYPES)


@dataclass(frozen=True)
class VJPFunctions:
    """The names and arities of the functions `add_vjp` adds."""

    forward: str
    backward: str
    results: int
    """How many results of `forward` are the entry's (the rest are residuals)."""
    float_inputs: tuple[int, ...]
    """The entry arguments `backward` returns a gradient for, in order."""
    float_results: tuple[int, ...]
    """The entry results `backward` takes a cotangent for, in order."""


def _entry(module: ModuleOp, name: str) -> func.FuncOp:
    function = function_named(module, name)
    if function is None:
        raise NotDifferentiable(f"the module has no entry function @{name}")
    return function


def add_vjp(module: ModuleOp, entry: str = "main") -> VJPFunctions:
    """Adds `@{entry}_fwd` and `@{entry}_bwd` to `module` (see the module
    docstring); raises `NotDifferentiable` naming the first op without a
    transpose rule."""
    function = _entry(module, entry)
    names = (f"{entry}_fwd", f"{entry}_bwd")
    if any(isinstance(op, func.FuncOp) and op.sym_name.data in names for op in module.ops):
        raise NotDifferentiable(f"@{entry} already has {names[0]} or {names[1]}")
    _check_replicated_arguments(module, function)
    working = _loops_unrolled(function)
    groups = {g.name: g.subgroups for g in group_declarations(module)}
    transposer = _Transposer(working, groups)
    backward = transposer.backward(names[1])
    forward = _forward(working, names[0], transposer.residuals)
    module.body.block.insert_op_after(forward, function)
    module.body.block.insert_op_after(backward, forward)
    return VJPFunctions(
        forward=names[0],
        backward=names[1],
        results=len(function.function_type.outputs.data),
        float_inputs=tuple(transposer.float_inputs),
        float_results=tuple(transposer.float_results),
    )


#: the most ops that unrolling the loops of one function may create
MAX_UNROLLED_OPS = 100_000


def _loops_unrolled(function: func.FuncOp) -> func.FuncOp:
    """`function`, or a copy of it whose `scf.for` loops that gradients flow
    through are unrolled (then `@main_fwd` is that copy).

    A loop's backward is the loop's body transposes in reverse iteration
    order, each reading the residuals of its own iteration. Unrolling gives
    exactly that with the straight-line machinery (each iteration's residuals
    are distinct values), and keeps the backward's collectives a fixed
    sequence, the same on every rank. It needs a static trip count and costs
    program size linear in it (capped by MAX_UNROLLED_OPS); a reverse
    `scf.for` over stacked residuals would not, at the price of tensor
    stacking ops distir's local dialects do not have."""
    if not any(isinstance(op, scf.ForOp) and _needs_rule(op) for op in function.walk()):
        return function
    working = function.clone()
    budget = [MAX_UNROLLED_OPS]
    # innermost first (a pre-order walk, reversed)
    for loop in reversed([op for op in working.walk() if isinstance(op, scf.ForOp)]):
        if _needs_rule(loop):
            _unroll(loop, budget)
    return working


def _unroll(loop: scf.ForOp, budget: list[int]) -> None:
    bounds = []
    for value in (loop.lb, loop.ub, loop.step):
        owner = value.owner
        if not (isinstance(owner, arith.ConstantOp) and isinstance(owner.value, IntegerAttr)):
            raise NotDifferentiable(
                f"{describe_op(loop)}: 'scf.for' has no derivative here unless its bounds and "
                "step are constants (a static trip count: its backward is unrolled)"
            )
        bounds.append(owner.value.value.data)
    lower, upper, step = bounds
    body = loop.body.block
    trips = range(lower, upper, step) if step > 0 else range(0)
    budget[0] -= len(trips) * len(body.ops)
    if budget[0] < 0:
        raise NotDifferentiable(
            f"{describe_op(loop)}: 'scf.for' unrolled for its backward would exceed "
            f"{MAX_UNROLLED_OPS} ops"
        )
    parent = loop.parent_block()
    assert parent is not None
    carried = list(loop.iter_args)
    for n, i in enumerate(trips):
        mapping: dict[SSAValue, SSAValue] = {}
        if body.args[0].uses:
            index = arith.ConstantOp(IntegerAttr(i, body.args[0].type))  # type: ignore[arg-type]
            with_location([index], loop.location)  # type: ignore[arg-type]
            parent.insert_op_before(index, loop)
            mapping[body.args[0]] = index.result
        mapping.update(zip(body.args[1:], carried))
        for op in body.ops:
            if isinstance(op, scf.YieldOp):
                carried = [mapping.get(v, v) for v in op.operands]
                break
            clone = op.clone(value_mapper=mapping)
            for result in clone.results:  # each iteration's values named apart
                if result.name_hint:
                    result.name_hint = f"{result.name_hint}_iter{n}"
            parent.insert_op_before(clone, loop)
    for result, value in zip(loop.results, carried):
        result.replace_all_uses_with(value)
    parent.erase_op(loop)


def _forward(function: func.FuncOp, name: str, residuals: Sequence[SSAValue]) -> func.FuncOp:
    """`function` renamed, also returning `residuals` (its own values)."""
    mapping: dict[SSAValue, SSAValue] = {}
    forward = function.clone(value_mapper=mapping)
    forward.sym_name = StringAttr(name)
    ret = forward.body.block.last_op
    assert isinstance(ret, func.ReturnOp)
    extra = [mapping.get(v, v) for v in residuals]
    new_ret = func.ReturnOp(*ret.arguments, *extra)
    new_ret.location = ret.location
    forward.body.block.insert_op_before(new_ret, ret)
    forward.body.block.erase_op(ret)
    outputs = [*function.function_type.outputs.data, *(v.type for v in residuals)]
    forward.function_type = FunctionType.from_lists(
        list(function.function_type.inputs.data), outputs
    )
    return forward


#: the kind of a value that is the same on every rank whatever the inputs
#: (a constant, the group size): it neither makes a value varying nor
#: replicates it over a group
_CONSTANT = object()


#: the argument attribute that declares an entry argument replicated over
#: the world (`{dist.replicated}`) or a group (`{dist.replicated = @tp}`)
REPLICATED_ARGUMENT = "dist.replicated"


def _check_replicated_arguments(module: ModuleOp, function: func.FuncOp) -> None:
    """`{dist.replicated}` takes no value or a declared group's name."""
    declared = {g.name for g in group_declarations(module)}
    for i, attrs in enumerate(function.arg_attrs.data if function.arg_attrs else ()):
        value = attrs.data.get(REPLICATED_ARGUMENT)
        if value is None or isinstance(value, UnitAttr):
            continue
        if not isinstance(value, SymbolRefAttr) or value.root_reference.data not in declared:
            raise NotDifferentiable(
                f"{describe_op(function)}: argument #{i} is marked "
                f"{REPLICATED_ARGUMENT} = {value}, which is not a declared group "
                f"(write {{{REPLICATED_ARGUMENT}}} for the world, or "
                f"{{{REPLICATED_ARGUMENT} = @g}} with `dist.group @g` declared)"
            )


def _replication(
    function: func.FuncOp, groups: dict[str, tuple[tuple[int, ...], ...]]
) -> tuple[dict[SSAValue, Attribute | None], set[Operation], set[Operation]]:
    """The float values of `function`'s body replicated over a group, the
    ops that read their operands as one replicated value, and the
    `dist.pvary`s whose input is replicated over a wider group than theirs.

    As JAX types values invariant or varying in `shard_map`: an argument
    that says so (`REPLICATED_ARGUMENT`) and a result of an op that declares
    `REPLICATED_RESULT` (`dist.psum`) are replicated over their group, and
    so is a local op's result when its operands are all replicated over
    that one group or constants; everything else varies (other arguments,
    other collectives' results, region ops' and calls' results, what
    `dist.rank` decides). Values inside regions count as varying (their ops are
    transposed apart from the replicated ones). A local op that reads a
    replicated value together with a varying one reads it through an
    implicit pvary: the cotangent it sends back is summed over ranks.

    A `dist.pvary` whose input the types prove varying is refused
    (`_varying_over`): the sum over ranks it sends back would count that
    value's cotangent once per rank on top of its own rule. Its other
    inputs are checked at run time to be the same on every rank (the
    agreement compares their digests).

    A pvary over a group whose every subgroup lies inside one subgroup of
    the group its input is replicated over (a world-replicated value, f
    over a tensor-parallel group) reads one value of that wider group: its
    cotangent goes back unsummed, as a varying use's, and is summed over
    the wider group once (`_final`); summed by the pvary too, it would
    count |group| times. A wider group that does not hold the pvary's
    subgroups holds several values of its input: refused."""
    kinds: dict[SSAValue, object] = {}
    as_one: set[Operation] = set()
    through: set[Operation] = set()
    varying = _varying_over(function)
    block = function.body.block
    for i, arg in enumerate(block.args):
        attrs = function.arg_attrs.data[i].data if function.arg_attrs else {}
        if REPLICATED_ARGUMENT in attrs:
            group = attrs[REPLICATED_ARGUMENT]
            kinds[arg] = ("replicated", group if isinstance(group, SymbolRefAttr) else None)
    for op in block.ops:
        if isinstance(op, Transposable) and op.REPLICATED_RESULT:
            for r in op.results:
                kinds[r] = ("replicated", getattr(op, "group", None))
            continue
        if isinstance(op, Transposable) and op.SUMS_COTANGENT:
            origin = varying.get(op.operands[0])
            if origin is not None:
                group = _group_key(origin)
                raise NotDifferentiable(
                    f"{describe_op(op)}: its input is varying over "
                    f"{'@' + group if group else 'the world'} (it comes from "
                    f"{describe_op(origin)}), but pvary's input must be replicated: one "
                    "value every rank holds. Use the value without pvary (it already "
                    "varies), or psum it first"
                )
            kind = kinds.get(op.operands[0])
            if kind is None or kind is _CONSTANT or kind == ("replicated", op.group):  # type: ignore[attr-defined]
                as_one.add(op)
            elif _holds(kind[1], op, groups):  # type: ignore[index]
                through.add(op)
            else:
                wider = kind[1].root_reference.data  # type: ignore[index]
                raise NotDifferentiable(
                    f"{describe_op(op)}: its input is replicated over @{wider}, whose "
                    "subgroups do not each hold one of this pvary's group "
                    f"({'@' + _group_key(op) if _group_key(op) else 'the world'}): it is "
                    "several values there, but pvary's input must be one value"
                )
            continue
        if op.name.startswith("dist.") or op.regions or isinstance(op, func.CallOp):
            if op.has_trait(UniformResults) and not any(is_float(r.type) for r in op.results):
                for r in op.results:
                    kinds[r] = _CONSTANT
            continue
        found = {kinds.get(v) for v in op.operands} - {_CONSTANT}
        if None in found or len(found) > 1:
            continue  # varying
        kind = found.pop() if found else _CONSTANT
        for r in op.results:
            kinds[r] = kind
        if kind is not _CONSTANT:
            as_one.add(op)
    replicated = {
        v: kind[1]  # type: ignore[index]
        for v, kind in kinds.items()
        if kind is not _CONSTANT and is_float(v.type)
    }
    return replicated, as_one, through


def _holds(
    wider: SymbolRefAttr | None, op: Operation, groups: dict[str, tuple[tuple[int, ...], ...]]
) -> bool:
    """Whether every subgroup of `op`'s group lies inside one subgroup of
    `wider` (None: the world, which holds every group)."""
    if wider is None:
        return True
    name = _group_key(op)
    outer = groups.get(wider.root_reference.data)
    if name is None or outer is None or name not in groups:
        return False
    return all(any(set(part) <= set(o) for o in outer) for part in groups[name])


def _group_key(op: Operation) -> str | None:
    """The name of `op`'s group (None: the world)."""
    group = getattr(op, "group", None)
    return group.root_reference.data if isinstance(group, SymbolRefAttr) else None


def _varying_over(function: func.FuncOp) -> dict[SSAValue, Operation]:
    """The float values of `function`'s body the types prove varying, each
    with the collective that made it so: the results of a collective whose
    transpose takes one cotangent per rank (every one but a replicated
    result's, `dist.psum`'s: `dist.pvary`, `dist.all_reduce`,
    `dist.all_gather`, ...), and a local op's results when an operand is
    proven varying. Values of regions and calls are proven nothing.

    Over any group: a value varying over one group is not one value over
    the world, nor over a group whose subgroups it meets in two ranks, and
    the transposes would sum its cotangent over both groups."""
    varying: dict[SSAValue, Operation] = {}
    for op in function.body.block.ops:
        origin: Operation | None = None
        if isinstance(op, CollectiveOp) and isinstance(op, Transposable):
            if op.REPLICATED_RESULT:
                continue
            origin = op
        elif op.name.startswith("dist.") or op.regions or isinstance(op, func.CallOp):
            continue
        else:
            origin = next((varying[v] for v in op.operands if v in varying), None)
        if origin is not None:
            for r in op.results:
                if is_float(r.type):
                    varying[r] = origin
    return varying


#: (transposer, op, result cotangents) -> operand cotangents (None: none)
TransposeRule = Callable[["_Transposer", Operation, list[SSAValue | None]], Cotangents]


def _needs_rule(op: Operation) -> bool:
    """Whether gradients may flow through `op`: it reads a float value, is a
    dist op or region op with a float result, or holds such an op."""
    if any(is_float(v.type) for v in op.operands):
        return True
    if any(is_float(r.type) for r in op.results) and (op.name.startswith("dist.") or op.regions):
        return True
    return any(_needs_rule(inner) for region in op.regions for inner in region.walk())


@dataclass
class _Transposer:
    function: func.FuncOp
    groups: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    """The module's declared groups: name -> subgroups of global ranks."""
    block: Block = field(init=False)
    residuals: list[SSAValue] = field(default_factory=list)
    float_inputs: list[int] = field(default_factory=list)
    float_results: list[int] = field(default_factory=list)
    arguments: Block = field(init=False)
    """The backward function's block, which residual arguments are added to."""
    _residual_args: dict[SSAValue, SSAValue] = field(default_factory=dict)
    _constants: dict[tuple[SSAValue, int], SSAValue] = field(default_factory=dict)
    _blocks: list[Block] = field(default_factory=list)
    """Scratch blocks, kept alive so that their ids (keys of `_constants`) stay unique."""
    _cotangents: dict[SSAValue, SSAValue] = field(default_factory=dict)
    _location: Attribute | None = None
    _replicated: dict[SSAValue, Attribute | None] = field(default_factory=dict)
    """Float values replicated over a group (the group: None for the world)."""
    _as_one: set[Operation] = field(default_factory=set)
    """Ops whose operand cotangents are already those of one replicated value."""
    _through: set[Operation] = field(default_factory=set)
    """pvarys of a value replicated over a wider group: their cotangent goes
    back unsummed, as a varying use's (`_replication`)."""
    _varying: dict[SSAValue, SSAValue] = field(default_factory=dict)
    """Per replicated value, the sum of the cotangents its varying uses sent
    back, summed over ranks once its own op is transposed."""

    # -- building the backward function ---------------------------------------

    def backward(self, name: str) -> func.FuncOp:
        ftype = self.function.function_type
        self.float_results = [i for i, t in enumerate(ftype.outputs.data) if is_float(t)]
        self.float_inputs = [i for i, t in enumerate(ftype.inputs.data) if is_float(t)]
        self.block = Block(arg_types=[ftype.outputs.data[i] for i in self.float_results])
        self.arguments = self.block
        entry = self.function.body.block
        ret = entry.last_op
        assert isinstance(ret, func.ReturnOp)
        self._replicated, self._as_one, self._through = _replication(self.function, self.groups)
        self._location = self.function.location
        for arg, i in zip(self.block.args, self.float_results):
            hint = ret.arguments[i].name_hint
            arg.name_hint = f"d{hint}" if hint else None
            self._seed(ret.arguments[i], arg)
        self.transpose_block(entry)
        results = []
        for i in self.float_inputs:
            value = entry.args[i]
            results.append(self._final(value) or self.zeros_like(value))
        self.emit(func.ReturnOp(*results))
        inputs = [a.type for a in self.block.args]
        outputs = [ftype.inputs.data[i] for i in self.float_inputs]
        backward = func.FuncOp(name, (inputs, outputs), Region(self.block))
        backward.location = self.function.location
        return backward

    def transpose_block(self, block: Block) -> None:
        for op in reversed(list(block.ops)):
            if op.has_trait(IsTerminator):
                continue
            self._location = op.location
            if not _needs_rule(op):
                continue
            if isinstance(op, RunsBodyInPlace):
                self.transpose_wave(op)
                continue
            if isinstance(op, scf.IfOp):
                self.transpose_if(op)
                continue
            rule = _rule(op)
            if rule is None:
                raise NotDifferentiable(
                    f"{describe_op(op)}: '{op.name}' has no derivative (no transpose rule); "
                    "run it on values that do not require grad"
                )
            cotangents = [self._final(r) for r in op.results]
            always = isinstance(op, Transposable) and op.TRANSPOSED_WITHOUT_COTANGENT
            if not always and all(c is None for c in cotangents):
                # No result reaches a float output: no gradient flows here (on
                # every rank alike, since this is decided by the program only).
                continue
            if op in self._through:
                # summed over the input's wider group once, by `_final`
                operand_cotangents: Cotangents = cotangents
            else:
                try:
                    operand_cotangents = rule(self, op, cotangents)
                except NoDerivative as e:
                    raise NotDifferentiable(f"{describe_op(op)}: {e}") from None
            varying = op not in self._as_one
            for operand, cotangent in zip(op.operands, operand_cotangents):
                if cotangent is not None and is_float(operand.type):
                    self.accumulate(operand, cotangent, varying)

    def transpose_wave(self, wave: RunsBodyInPlace) -> None:
        """The transposed wave: the local ops that prepare the transposed
        collectives, then those collectives as one wave, then the local ops
        that use their results. (The wave's ops read no result of each
        other, and so do their transposes.)"""
        body = wave.body_block()
        for result, value in zip(wave.results, wave.yielded()):
            cotangent = self._cotangents.get(result)
            if cotangent is not None:
                self.accumulate(value, cotangent)
        outer, scratch = self.block, Block()
        self._blocks.append(scratch)
        self.block = scratch
        self.transpose_block(body)
        self.block = outer
        ops = list(scratch.ops)
        exchanges = [op for op in ops if isinstance(op, CollectiveOp | PeerOp)]
        needed: set[Operation] = set()
        pending = [v for op in exchanges for v in op.operands]
        while pending:
            owner = pending.pop().owner
            if isinstance(owner, Operation) and owner.parent is scratch and owner not in needed:
                needed.add(owner)
                pending.extend(owner.operands)
        for op in ops:
            scratch.detach_op(op)
        for op in ops:
            if op in needed:
                self.block.add_op(op)
        if len(exchanges) < 2:
            for op in exchanges:
                self.block.add_op(op)
        else:
            values = [r for op in exchanges for r in op.results]
            transposed = wave_around(exchanges)
            with_location([transposed], wave.location)
            self.block.add_op(transposed)
            yielded = transposed.body_block().last_op
            outside = dict(zip(values, transposed.results))
            for value, result in outside.items():
                value.replace_uses_with_if(result, lambda use: use.operation is not yielded)
            self._cotangents = {k: outside.get(v, v) for k, v in self._cotangents.items()}
            self._varying = {k: outside.get(v, v) for k, v in self._varying.items()}
        for op in ops:
            if op not in needed and op not in exchanges:
                self.block.add_op(op)

    def transpose_if(self, op: scf.IfOp) -> None:
        """An `scf.if` on the same condition whose branches are the transposed
        branches, yielding the cotangents of the outer values they read (so a
        send in one branch and a recv in the other become a recv and a send).
        Always emitted when it holds such ops: what each rank runs is decided
        by the program, never by which cotangents happen to exist."""
        outer: list[SSAValue] = []
        for region in op.regions:
            for inner in region.walk():
                for value in inner.operands:
                    owner = value.owner
                    parent = (
                        owner.parent_op() if isinstance(owner, Operation) else (owner.parent_op())
                    )
                    inside = parent is not None and op.is_ancestor(parent)
                    if not inside and is_float(value.type) and value not in outer:
                        outer.append(value)
        condition = self.primal(op.cond)
        result_cotangents = [self._cotangents.get(r) for r in op.results]
        saved = self.block, self._cotangents, self._varying
        branches = []
        for region in (op.true_region, op.false_region):
            self.block, self._cotangents, self._varying = Block(), {}, {}
            if region.blocks:
                body = region.block
                yielded = body.last_op
                assert isinstance(yielded, scf.YieldOp)
                for value, cotangent in zip(yielded.arguments, result_cotangents):
                    if cotangent is not None and is_float(value.type):
                        self.accumulate(value, cotangent)
                self.transpose_block(body)
            # a replicated outer value's uses in a branch are all varying:
            # the sum over ranks is taken outside, once (by `_final`)
            for v, part in list(self._varying.items()):
                self.accumulate(v, part)
            found = [self._cotangents.get(v) for v in outer]
            self.emit(scf.YieldOp(*(c or self.zeros_like(v) for c, v in zip(found, outer))))
            branches.append(Region(self.block))
        self.block, self._cotangents, self._varying = saved
        self._location = op.location
        transposed = self.emit(scf.IfOp(condition, [v.type for v in outer], *branches))
        for value, cotangent in zip(outer, transposed.results):
            self.accumulate(value, cotangent, varying=True)

    # -- values ---------------------------------------------------------------

    def emit(self, op: Operation) -> Operation:
        if self._location is not None:
            with_location([op], self._location)  # type: ignore[arg-type]
        self.block.add_op(op)
        return op

    def accumulate(self, value: SSAValue, cotangent: SSAValue, varying: bool = False) -> None:
        """Adds `cotangent` to `value`'s; `varying`: it comes from a use of
        `value` as a varying value (kept apart when `value` is replicated)."""
        if cotangent.type != value.type:
            cotangent = self.emit(tensor.CastOp(cotangent, value.type)).results[0]
        table = self._varying if varying and value in self._replicated else self._cotangents
        known = table.get(value)
        table[value] = (
            cotangent if known is None else self.emit(arith.AddfOp(known, cotangent)).result
        )

    def _final(self, value: SSAValue) -> SSAValue | None:
        """`value`'s whole cotangent, once every use has sent its part: for a
        replicated value, the sum over its group of what its varying uses
        sent (an implicit pvary's transpose), plus what its replicated uses
        sent (the same on every rank already)."""
        part = self._varying.pop(value, None)
        if part is not None:
            self.accumulate(value, self.all_reduce_sum(part, self._replicated[value]))
        return self._cotangents.get(value)

    def _seed(self, result: SSAValue, cotangent: SSAValue) -> None:
        """The cotangent of an entry result. A replicated result is one value
        and its cotangent one value: every rank must pass the same one (a
        `dist.assert_uniform`, checked with the run's agreement)."""
        if result in self._replicated:
            if not isinstance(cotangent.type, TensorType):
                raise NotDifferentiable(
                    f"{describe_op(result.owner)}: a replicated scalar result has no "
                    "derivative here; return it as a tensor"
                )
            self.emit(uniform_check(cotangent, self._replicated[result]))  # type: ignore[arg-type]
        self.accumulate(result, cotangent)

    def primal(self, value: SSAValue) -> SSAValue:
        """`value` of the forward run, in the backward function: a constant is
        rebuilt, anything else becomes a residual argument."""
        known = self._residual_args.get(value)
        if known is not None:
            return known
        owner = value.owner
        if isinstance(owner, arith.ConstantOp):
            # rebuilt in the block being written (a branch's value is not
            # visible outside it)
            key = (value, id(self.block))
            if key not in self._constants:
                self._constants[key] = self.emit(owner.clone()).results[0]
            return self._constants[key]
        source = value
        if isinstance(owner, Operation) and owner.parent_op() is not self.function:
            region_op = owner.parent_op()
            yielded = (
                list(region_op.yielded()) if isinstance(region_op, RunsBodyInPlace) else []
            )
            if value not in yielded:
                raise NotDifferentiable(
                    f"{describe_op(owner)}: its backward needs this value, which is not "
                    "visible outside its region (yield it from the wave, or compute it "
                    "before the scf.if)"
                )
            source = region_op.results[yielded.index(value)]
        arg = self.arguments.insert_arg(source.type, len(self.arguments.args))
        arg.name_hint = value.name_hint
        self.residuals.append(source)
        self._residual_args[value] = arg
        return arg

    def index(self, number: int) -> SSAValue:
        return self.emit(arith.ConstantOp(IntegerAttr(number, IndexType()))).results[0]

    def shape_of(self, value: SSAValue, primal: bool) -> list[SSAValue | int]:
        """The dims of `value` (a forward value when `primal`), static ones as ints."""
        t = value.type
        assert isinstance(t, TensorType)
        dims: list[SSAValue | int] = []
        for i, size in enumerate(t.get_shape()):
            if size != DYNAMIC_INDEX:
                dims.append(size)
                continue
            source = self.primal(value) if primal else value
            dims.append(self.emit(tensor.DimOp(source, self.index(i))).results[0])
        return dims

    def zeros_like(self, value: SSAValue, primal: bool = True) -> SSAValue:
        t = value.type
        element = t.element_type if isinstance(t, TensorType) else t
        zero = self.emit(arith.ConstantOp(FloatAttr(0.0, element))).results[0]  # type: ignore[arg-type]
        if not isinstance(t, TensorType):
            return zero
        dynamic = [d for d in self.shape_of(value, primal) if isinstance(d, SSAValue)]
        return self.emit(tensor.SplatOp(zero, dynamic, t)).results[0]

    def or_zeros(self, cotangent: SSAValue | None, like: SSAValue) -> SSAValue:
        return cotangent if cotangent is not None else self.zeros_like(like)

    def binary(self, op_type: type[Operation], a: SSAValue, b: SSAValue) -> SSAValue:
        return self.emit(op_type(a, b)).results[0]  # type: ignore[call-arg]

    def on_rank(self, group, rank: SSAValue, kept: SSAValue) -> SSAValue:
        """`kept` on the rank of `group` equal to `rank`, zeros elsewhere."""
        zeros = self.zeros_like(kept, primal=False)
        for op in on_rank_ops(group, rank, kept, zeros):
            last = self.emit(op)
        return last.results[0]

    def all_reduce_sum(self, value: SSAValue, group) -> SSAValue:
        return self.emit(sum_all_reduce(value, group)).results[0]

    def reduce_scatter_sum(self, value: SSAValue, result_type, axis: int, group) -> SSAValue:
        return self.emit(sum_reduce_scatter(value, result_type, axis, group)).results[0]

    def reduce_sum(self, value: SSAValue, root: int, group) -> SSAValue:
        return self.emit(sum_reduce(value, root, group)).results[0]


# -- local ops ----------------------------------------------------------------


def _addf(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    return [cts[0], cts[0]]


def _subf(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    (ct,) = cts
    assert ct is not None
    return [ct, t.emit(arith.NegfOp(ct)).results[0]]


def _negf(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    assert cts[0] is not None
    return [t.emit(arith.NegfOp(cts[0])).results[0]]


def _mulf(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    (ct,) = cts
    assert ct is not None
    a, b = op.operands
    return [t.binary(arith.MulfOp, ct, t.primal(b)), t.binary(arith.MulfOp, ct, t.primal(a))]


def _divf(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    # y = a / b: da = dy / b, db = -dy * y / b
    (ct,) = cts
    assert ct is not None
    b = t.primal(op.operands[1])
    da = t.binary(arith.DivfOp, ct, b)
    db = t.binary(arith.DivfOp, t.binary(arith.MulfOp, ct, t.primal(op.results[0])), b)
    return [da, t.emit(arith.NegfOp(db)).results[0]]


def _select(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    """The cotangent goes to the operand picked (as a whole for a scalar
    condition, element by element for a tensor one)."""
    (ct,) = cts
    assert ct is not None
    c = t.primal(op.operands[0])
    zeros = t.zeros_like(ct, primal=False)
    return [
        None,
        t.emit(tensor_arith.SelectOp(c, ct, zeros)).results[0],
        t.emit(tensor_arith.SelectOp(c, zeros, ct)).results[0],
    ]


def _no_gradient(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    return [None] * len(op.operands)  # piecewise constant, or no result


def _cast(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    return [cts[0]]  # `accumulate` casts back to the operand's type


def _float_cast(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    (ct,) = cts
    assert ct is not None
    widening = isinstance(op, arith.ExtFOp | tensor_arith.ExtFOp)
    back = tensor_arith.TruncFOp if widening else tensor_arith.ExtFOp
    return [t.emit(back(ct, op.operands[0].type)).results[0]]


def _concat(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    (ct,) = cts
    assert ct is not None
    axis = op.dim.value.data  # type: ignore[attr-defined]
    pieces: list[SSAValue | None] = []
    offset: SSAValue | int = 0
    for operand in op.operands:
        sizes = t.shape_of(operand, primal=True)
        offsets: list[SSAValue | int] = [0] * len(sizes)
        offsets[axis] = offset
        piece = tensor.ExtractSliceOp(ct, offsets, sizes, [1] * len(sizes), operand.type)
        pieces.append(t.emit(piece).results[0])
        rows = sizes[axis]
        if isinstance(offset, int) and isinstance(rows, int):
            offset += rows
        else:
            as_value = [t.index(v) if isinstance(v, int) else v for v in (offset, rows)]
            offset = t.binary(arith.AddiOp, as_value[0], as_value[1])
    return pieces


def _extract_slice(t: _Transposer, op: tensor.ExtractSliceOp, cts: list[SSAValue | None]):
    """The cotangent padded with zeros back to the source's shape, one axis
    at a time (a concat of zeros, the cotangent and zeros)."""
    (ct,) = cts
    assert ct is not None
    source = op.source
    source_type = source.type
    assert isinstance(source_type, TensorType)
    strides = op.static_strides.get_values()
    if op.strides or any(stride != 1 for stride in strides):
        raise NotDifferentiable(f"{describe_op(op)}: only a slice of unit strides has a derivative")
    if op.result.type.get_num_dims() != source_type.get_num_dims():  # type: ignore[attr-defined]
        raise NotDifferentiable(f"{describe_op(op)}: a rank-reducing slice has no derivative here")

    def values(static: Sequence[int], dynamic: Sequence[SSAValue]) -> list[SSAValue | int]:
        it = iter(dynamic)
        return [t.primal(next(it)) if v == DYNAMIC_INDEX else v for v in static]

    offsets = values(op.static_offsets.get_values(), op.offsets)
    sizes = values(op.static_sizes.get_values(), op.sizes)
    dims = t.shape_of(source, primal=True)
    padded = ct
    shape = list(sizes)
    for axis, (offset, size, dim) in enumerate(zip(offsets, sizes, dims)):
        after = _minus(t, _minus(t, dim, offset), size)
        pieces = []
        for rows in (offset, after):
            piece_shape = list(shape)
            piece_shape[axis] = rows
            pieces.append(_zeros(t, piece_shape, source_type.element_type))
        shape[axis] = dim
        result_type = TensorType(
            source_type.element_type, [d if isinstance(d, int) else DYNAMIC_INDEX for d in shape]
        )
        padded = t.emit(
            tensor.ConcatOp([pieces[0], padded, pieces[1]], axis, result_type)  # type: ignore[arg-type]
        ).results[0]
    return [padded, *([None] * (len(op.operands) - 1))]


def _linalg_broadcast(t: _Transposer, op: LinalgBroadcastOp, cts: list[SSAValue | None]):
    """The sum of the cotangent over the added dimensions (a `linalg.reduce`
    of `arith.addf` into zeros of the input's shape); `outs` only gives the
    shape and gets no gradient."""
    (ct,) = cts
    assert ct is not None
    x = op.operands[0]
    x_type = x.type
    assert isinstance(x_type, TensorType)
    element = x_type.element_type
    init = _zeros(t, t.shape_of(x, primal=True), element)
    return [_sum_over(t, ct, op.dimensions.get_values(), init), None]


def _splat(t: _Transposer, op: tensor.SplatOp, cts: list[SSAValue | None]):
    """The scalar gets the sum of the cotangent over every dimension."""
    if isinstance(op.operands[0].owner, arith.ConstantOp):
        return [None] * len(op.operands)  # a constant: no gradient to compute
    (ct,) = cts
    assert ct is not None
    ct_type = ct.type
    assert isinstance(ct_type, TensorType)
    element = ct_type.element_type
    total = _sum_over(t, ct, range(ct_type.get_num_dims()), _zeros(t, [], element))
    scalar = t.emit(tensor.ExtractOp(total, [], element)).results[0]
    return [scalar, *([None] * (len(op.operands) - 1))]


def _sum_over(t: _Transposer, value: SSAValue, dims: Sequence[int], init: SSAValue) -> SSAValue:
    """init + the sum of `value` over `dims` (a `linalg.reduce` of `arith.addf`)."""
    element = init.type.element_type  # type: ignore[attr-defined]
    body = Block(arg_types=[element, element])
    total = arith.AddfOp(body.args[0], body.args[1])
    body.add_ops([total, LinalgYieldOp(total.result)])
    dimensions = DenseArrayBase.from_list(i64, list(dims))
    return t.emit(LinalgReduceOp(value, init, dimensions, Region(body))).results[0]


def _linalg_reduce(t: _Transposer, op: LinalgReduceOp, cts: list[SSAValue | None]):
    """A sum reduction: its input gets the cotangent broadcast back over the
    reduced dimensions, its init the cotangent itself."""
    if not is_sum_reduction(op) or not is_float(op.operands[0].type):
        raise NotDifferentiable(
            f"{describe_op(op)}: only a 'linalg.reduce' summing with arith.addf has a derivative"
        )
    (ct,) = cts
    assert ct is not None
    x = op.operands[0]
    sizes = t.shape_of(x, primal=True)
    dynamic = [d for d in sizes if isinstance(d, SSAValue)]
    empty = t.emit(tensor.EmptyOp(dynamic, x.type)).results[0]
    spread = LinalgBroadcastOp(ct, empty, op.dimensions, x.type)
    return [t.emit(spread).results[0], ct]


def _minus(t: _Transposer, a: SSAValue | int, b: SSAValue | int) -> SSAValue | int:
    if isinstance(a, int) and isinstance(b, int):
        return a - b
    left, right = (t.index(v) if isinstance(v, int) else v for v in (a, b))
    return t.binary(arith.SubiOp, left, right)


def _zeros(t: _Transposer, shape: Sequence[SSAValue | int], element: Attribute) -> SSAValue:
    zero = t.emit(arith.ConstantOp(FloatAttr(0.0, element))).results[0]  # type: ignore[arg-type]
    result_type = TensorType(element, [d if isinstance(d, int) else DYNAMIC_INDEX for d in shape])
    dynamic = [d for d in shape if isinstance(d, SSAValue)]
    return t.emit(tensor.SplatOp(zero, dynamic, result_type)).results[0]


def _extract(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    (ct,) = cts
    assert ct is not None
    source, *indices = op.operands
    at = [t.primal(i) for i in indices]
    return [t.emit(tensor.InsertOp(ct, t.zeros_like(source), at)).results[0]]


def _insert(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    (ct,) = cts
    assert ct is not None
    scalar, dest, *indices = op.operands
    at = [t.primal(i) for i in indices]
    d_scalar = t.emit(tensor.ExtractOp(ct, at, scalar.type)).results[0]
    zero = t.zeros_like(scalar)
    d_dest = t.emit(tensor.InsertOp(zero, ct, at)).results[0]
    return [d_scalar, d_dest]


def _from_elements(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    """Each element's cotangent is the cotangent's element at its place
    (the elements fill the static shape in row-major order)."""
    (ct,) = cts
    assert ct is not None
    shape = list(op.results[0].type.get_shape())  # type: ignore[attr-defined]
    gradients = []
    for i, element in enumerate(op.operands):
        at, rest = [], i
        for size in reversed(shape):
            at.append(rest % size)
            rest //= size
        indices = [t.index(k) for k in reversed(at)]
        gradients.append(t.emit(tensor.ExtractOp(ct, indices, element.type)).results[0])
    return gradients


# -- math: each derivative written in the ops it differentiates ---------------------


class _Terms:
    """Builds a derivative's terms in the backward function, elementwise, in
    the cotangent's type (constants are splat to its shape)."""

    def __init__(self, t: _Transposer, op: Operation, ct: SSAValue):
        self.t, self.op, self.ct = t, op, ct

    def x(self, i: int = 0) -> SSAValue:
        return self.t.primal(self.op.operands[i])

    def y(self) -> SSAValue:
        return self.t.primal(self.op.results[0])

    def c(self, value: float) -> SSAValue:
        kind = self.ct.type
        element = kind.element_type if isinstance(kind, TensorType) else kind
        scalar = self.t.emit(arith.ConstantOp(FloatAttr(value, element))).results[0]  # type: ignore[arg-type]
        if not isinstance(kind, TensorType):
            return scalar
        dynamic = [d for d in self.t.shape_of(self.ct, primal=False) if isinstance(d, SSAValue)]
        return self.t.emit(tensor.SplatOp(scalar, dynamic, kind)).results[0]

    def f(self, op_type: type[Operation], a: SSAValue) -> SSAValue:
        return self.t.emit(op_type(a)).results[0]  # type: ignore[call-arg]

    def mul(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.t.binary(arith.MulfOp, a, b)

    def div(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.t.binary(arith.DivfOp, a, b)

    def add(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.t.binary(arith.AddfOp, a, b)

    def sub(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.t.binary(arith.SubfOp, a, b)

    def square(self, a: SSAValue) -> SSAValue:
        return self.mul(a, a)

    def cmp(self, predicate: str, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.t.emit(tensor_arith.CmpfOp(a, b, predicate)).results[0]

    def where(self, condition: SSAValue, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.t.emit(tensor_arith.SelectOp(condition, a, b)).results[0]


#: math op -> its derivative times the cotangent (`d.ct`), elementwise
_MATH_DERIVATIVES: dict[type[Operation], Callable[[_Terms], SSAValue]] = {
    math.ExpOp: lambda d: d.mul(d.ct, d.y()),
    math.Exp2Op: lambda d: d.mul(d.ct, d.mul(d.y(), d.c(0.6931471805599453))),
    math.ExpM1Op: lambda d: d.mul(d.ct, d.add(d.y(), d.c(1.0))),
    math.LogOp: lambda d: d.div(d.ct, d.x()),
    math.Log2Op: lambda d: d.div(d.ct, d.mul(d.x(), d.c(0.6931471805599453))),
    math.Log10Op: lambda d: d.div(d.ct, d.mul(d.x(), d.c(2.302585092994046))),
    math.Log1pOp: lambda d: d.div(d.ct, d.add(d.x(), d.c(1.0))),
    math.SqrtOp: lambda d: d.div(d.mul(d.ct, d.c(0.5)), d.y()),
    math.RsqrtOp: lambda d: d.mul(d.ct, d.div(d.mul(d.y(), d.c(-0.5)), d.x())),
    math.SinOp: lambda d: d.mul(d.ct, d.f(math.CosOp, d.x())),
    math.CosOp: lambda d: d.mul(d.ct, d.mul(d.f(math.SinOp, d.x()), d.c(-1.0))),
    math.TanOp: lambda d: d.mul(d.ct, d.add(d.c(1.0), d.square(d.y()))),
    math.SinhOp: lambda d: d.mul(d.ct, d.f(math.CoshOp, d.x())),
    math.CoshOp: lambda d: d.mul(d.ct, d.f(math.SinhOp, d.x())),
    math.TanhOp: lambda d: d.mul(d.ct, d.sub(d.c(1.0), d.square(d.y()))),
    math.AsinOp: lambda d: d.div(d.ct, d.f(math.SqrtOp, d.sub(d.c(1.0), d.square(d.x())))),
    math.AcosOp: lambda d: d.div(
        d.mul(d.ct, d.c(-1.0)), d.f(math.SqrtOp, d.sub(d.c(1.0), d.square(d.x())))
    ),
    math.AtanOp: lambda d: d.div(d.ct, d.add(d.c(1.0), d.square(d.x()))),
    math.AsinhOp: lambda d: d.div(d.ct, d.f(math.SqrtOp, d.add(d.square(d.x()), d.c(1.0)))),
    math.AcoshOp: lambda d: d.div(d.ct, d.f(math.SqrtOp, d.sub(d.square(d.x()), d.c(1.0)))),
    math.AtanhOp: lambda d: d.div(d.ct, d.sub(d.c(1.0), d.square(d.x()))),
    math.ErfOp: lambda d: d.mul(
        d.ct,
        d.mul(
            d.c(1.1283791670955126),  # 2 / sqrt(pi)
            d.f(math.ExpOp, d.mul(d.square(d.x()), d.c(-1.0))),
        ),
    ),
}


def _math_unary(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    (ct,) = cts
    assert ct is not None
    return [_MATH_DERIVATIVES[type(op)](_Terms(t, op, ct))]


def _absf(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    """The cotangent times the sign of x, 0 at ±0 (torch's `abs` too)."""
    (ct,) = cts
    assert ct is not None
    d = _Terms(t, op, ct)
    x, zeros = d.x(), d.c(0.0)
    positive = t.emit(tensor_arith.CmpfOp(x, zeros, "ogt")).results[0]
    negative = t.emit(tensor_arith.CmpfOp(x, zeros, "olt")).results[0]
    flipped = t.emit(tensor_arith.SelectOp(negative, d.mul(ct, d.c(-1.0)), zeros)).results[0]
    return [t.emit(tensor_arith.SelectOp(positive, ct, flipped)).results[0]]


def _cbrt(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    """d cbrt(x) = 1 / (3 y^2): infinite at 0, as the function's slope."""
    (ct,) = cts
    assert ct is not None
    d = _Terms(t, op, ct)
    return [d.div(ct, d.mul(d.c(3.0), d.square(d.y())))]


def _powf(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    """y = a^b: da = b a^(b-1) (0 where b = 0), db = y log a (0 where a = 0
    and b >= 0): torch's `pow` backward, masks included."""
    (ct,) = cts
    assert ct is not None
    d = _Terms(t, op, ct)
    a, b, zeros = d.x(0), d.x(1), d.c(0.0)
    slope = d.mul(b, d.t.binary(math.PowFOp, a, d.sub(b, d.c(1.0))))
    da = d.where(d.cmp("oeq", b, zeros), zeros, d.mul(ct, slope))
    log_term = d.mul(ct, d.mul(d.y(), d.f(math.LogOp, a)))
    at_zero = d.where(d.cmp("oge", b, zeros), zeros, log_term)
    return [da, d.where(d.cmp("oeq", a, zeros), at_zero, log_term)]


def _atan2(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    """y = atan2(u, v): du = v / (u^2 + v^2), dv = -u / (u^2 + v^2); where
    1 / (u^2 + v^2) overflows (at the origin), 0, as torch's."""
    (ct,) = cts
    assert ct is not None
    d = _Terms(t, op, ct)
    u, v = d.x(0), d.x(1)
    recip = d.div(d.c(1.0), d.add(d.square(u), d.square(v)))
    recip = d.where(d.cmp("oeq", recip, d.c(float("inf"))), d.c(0.0), recip)
    scaled = d.mul(ct, recip)
    return [d.mul(scaled, v), d.mul(scaled, d.mul(u, d.c(-1.0)))]


def _copysign(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    """y = copysign(a, b): da = y / a (±1; 0 where a = 0, as torch), db = 0."""
    (ct,) = cts
    assert ct is not None
    d = _Terms(t, op, ct)
    a, zeros = d.x(0), d.c(0.0)
    ratio = d.where(d.cmp("oeq", a, zeros), zeros, d.div(d.y(), a))
    return [d.mul(ct, ratio), None]


def _extremum(larger: bool, number: bool) -> TransposeRule:
    """The rule of maximumf / minimumf (`number`: maxnumf / minnumf), as
    torch's `maximum`/`minimum` (a tie splits the cotangent in halves) and
    `fmax`/`fmin` (a tie sends it all to the first operand; a NaN operand
    sends it to the other) differentiate."""

    def rule(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
        (ct,) = cts
        assert ct is not None
        d = _Terms(t, op, ct)
        a, b, zeros = d.x(0), d.x(1), d.c(0.0)
        if number:
            first = d.cmp("oge" if larger else "ole", a, b)
            first = d.where(d.cmp("uno", b, b), d.cmp("oeq", zeros, zeros), first)
            return [d.where(first, ct, zeros), d.where(first, zeros, ct)]
        half = d.where(d.cmp("oeq", a, b), d.mul(ct, d.c(0.5)), ct)
        a_loses, b_loses = d.cmp("olt", a, b), d.cmp("ogt", a, b)
        if not larger:
            a_loses, b_loses = b_loses, a_loses
        return [d.where(a_loses, zeros, half), d.where(b_loses, zeros, half)]

    return rule


def _fma(t: _Transposer, op: Operation, cts: list[SSAValue | None]):
    # y = a * b + c
    (ct,) = cts
    assert ct is not None
    a, b, _ = op.operands
    return [t.binary(arith.MulfOp, ct, t.primal(b)), t.binary(arith.MulfOp, ct, t.primal(a)), ct]


#: the transpose rules of xDSL's local ops and their tensor forms
#: (`tensor_arith`); every dist op declares its own (`Transposable`)
LOCAL_RULES: dict[type[Operation], TransposeRule] = {
    **{op_type: _math_unary for op_type in _MATH_DERIVATIVES},
    math.AbsFOp: _absf,
    math.FmaOp: _fma,
    math.CbrtOp: _cbrt,
    math.PowFOp: _powf,
    math.Atan2Op: _atan2,
    math.CopySignOp: _copysign,
    arith.MaximumfOp: _extremum(larger=True, number=False),
    arith.MinimumfOp: _extremum(larger=False, number=False),
    arith.MaxnumfOp: _extremum(larger=True, number=True),
    arith.MinnumfOp: _extremum(larger=False, number=True),
    # piecewise constant: a zero derivative almost everywhere, as torch's
    math.FloorOp: _no_gradient,
    math.CeilOp: _no_gradient,
    math.RoundOp: _no_gradient,
    math.RoundEvenOp: _no_gradient,
    math.TruncOp: _no_gradient,
    arith.AddfOp: _addf,
    arith.SubfOp: _subf,
    arith.NegfOp: _negf,
    arith.MulfOp: _mulf,
    arith.DivfOp: _divf,
    arith.SelectOp: _select,
    tensor_arith.SelectOp: _select,
    arith.CmpfOp: _no_gradient,
    tensor_arith.CmpfOp: _no_gradient,
    arith.FPToSIOp: _no_gradient,
    tensor_arith.FPToSIOp: _no_gradient,
    arith.FPToUIOp: _no_gradient,
    tensor_arith.FPToUIOp: _no_gradient,
    tensor.DimOp: _no_gradient,
    tensor.CastOp: _cast,
    arith.ExtFOp: _float_cast,
    arith.TruncFOp: _float_cast,
    tensor_arith.ExtFOp: _float_cast,
    tensor_arith.TruncFOp: _float_cast,
    tensor.ConcatOp: _concat,
    tensor.ExtractSliceOp: _extract_slice,
    LinalgBroadcastOp: _linalg_broadcast,
    tensor.SplatOp: _splat,
    LinalgReduceOp: _linalg_reduce,
    tensor.ExtractOp: _extract,
    tensor.InsertOp: _insert,
    tensor.FromElementsOp: _from_elements,
}


def _declared(t: _Transposer, op: Operation, cts: list[SSAValue | None]) -> Cotangents:
    assert isinstance(op, Transposable)
    return op.transpose(t, cts)


def _rule(op: Operation) -> TransposeRule | None:
    """The op's transpose rule: its own declaration, or the local table's."""
    return _declared if isinstance(op, Transposable) else LOCAL_RULES.get(type(op))


# -- the pass ---------------------------------------------------------------------


@dataclass(frozen=True)
class VJPPass(ModulePass):
    """Add `@<entry>_fwd` (the entry, returning its residuals too) and
    `@<entry>_bwd` (its backward: cotangents and residuals -> gradients)."""

    name = "vjp"

    entry: str = "main"
    """The function to differentiate."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        add_vjp(op, self.entry)
