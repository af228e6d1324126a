"""Hypothesis strategies over the whole value domain, and the differential
cases built from them.

A drawn `DrawnCase` is a program (IR text written here, from the dialect's
syntax), every rank's inputs, how each input is laid out in memory, and what
every rank must hold afterwards according to `tests/oracle.py`. The same
draws run in the simulator (tests/differential/test_simulator_vs_oracle.py)
and on real gloo ranks (tests/differential/test_ranks_vs_oracle.py).

Values: NaN, ±Inf, -0.0, the smallest subnormal and the largest finite
value of each float type, the extremes of each integer type, empty and
zero-width dimensions, zero counts; layouts: contiguous, strided (every
other element of a larger buffer), transposed and stride-0 (expanded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import oracle
import torch
from hypothesis import strategies as st
from rank_server import Case
from rank_server import apply_layout as apply_layout

#: IR element type -> torch dtype: every element type the README lists.
ELEMENT_TYPES: dict[str, torch.dtype] = {
    "i1": torch.bool,
    "i8": torch.int8,
    "i16": torch.int16,
    "i32": torch.int32,
    "i64": torch.int64,
    "si8": torch.int8,
    "si16": torch.int16,
    "si32": torch.int32,
    "si64": torch.int64,
    "ui8": torch.uint8,
    "ui16": torch.uint16,
    "ui32": torch.uint32,
    "ui64": torch.uint64,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f32": torch.float32,
    "f64": torch.float64,
}
FLOAT_TYPES = ("f16", "bf16", "f32", "f64")
SIGNLESS_INT_TYPES = ("i8", "i16", "i32", "i64")
INT_TYPES = tuple(t for t in ELEMENT_TYPES if t not in FLOAT_TYPES and t != "i1")
NATIVE_KINDS = ("sum", "prod", "min", "max", "band", "bor", "bxor")
BITWISE_KINDS = ("band", "bor", "bxor")

#: Pipelines every drawn case is re-run under: a pass never changes a result.
PIPELINES = (
    "",
    "recognize-native-reductions",
    "select-all-reduce-algorithm{group-size=3}",
    "bucket-all-reduces",
    "lower-ciphertext-add",
    "defer-modular-reduction{max-group-size=8}",
    "canonicalize,cse",
)
#: Implementations a generic all-reduce may be bound to.
GENERIC_ALGORITHMS = ("", "gather-fold", "ring", "halving-doubling", "recursive-doubling")


def tensor_type(shape: tuple[int | None, ...], element: str) -> str:
    return "tensor<" + "".join(("?" if d is None else str(d)) + "x" for d in shape) + element + ">"


# -- values -------------------------------------------------------------------


def float_specials(dtype: torch.dtype) -> list[float]:
    info = torch.finfo(dtype)
    return [math.nan, math.inf, -math.inf, -0.0, 0.0, info.max, -info.max, info.tiny,
            info.smallest_normal / 2 ** (info.bits // 4), 1.0, -1.0, 0.5]  # fmt: skip


def int_extremes(dtype: torch.dtype) -> list[int]:
    if dtype == torch.bool:
        return [0, 1]
    info = torch.iinfo(dtype)
    return [info.min, info.max, 0, 1, -1 if info.min < 0 else 2, info.min + 1, info.max - 1]


def elements(dtype: torch.dtype, finite: bool = False) -> st.SearchStrategy:
    """One element of `dtype`, its specials drawn often."""
    if dtype == torch.bool:
        return st.booleans()
    if dtype.is_floating_point:
        specials = [v for v in float_specials(dtype) if not finite or math.isfinite(v)]
        width = 16 if dtype == torch.float16 else 32 if dtype != torch.float64 else 64
        info = torch.finfo(dtype)
        plain = st.floats(
            -info.max, info.max, width=width, allow_nan=False, allow_infinity=False
        ) | st.integers(-8, 8).map(float)
        return st.sampled_from(specials) | plain
    info = torch.iinfo(dtype)
    return st.sampled_from(int_extremes(dtype)) | st.integers(info.min, info.max)


@st.composite
def tensors(draw, dtype: torch.dtype, shape: tuple[int, ...], finite: bool = False) -> torch.Tensor:
    n = math.prod(shape)
    values = draw(st.lists(elements(dtype, finite), min_size=n, max_size=n))
    if dtype == torch.bfloat16:  # drawn as float32, rounded once
        return torch.tensor(values, dtype=torch.float32).to(dtype).reshape(shape)
    return torch.tensor(values, dtype=dtype).reshape(shape)


def shapes(min_dims: int = 1, max_dims: int = 2, max_side: int = 3) -> st.SearchStrategy:
    """Static shapes, zero-width dimensions included."""
    return st.lists(st.integers(0, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


LAYOUTS = ("contiguous", "strided", "transposed", "expanded", "negated")

#: integer dtypes a negation view exists for (torch has no negative bit for
#: bool, and no negation of an unsigned integer)
_NEGATABLE = (torch.int8, torch.int16, torch.int32, torch.int64)


def negatable(dtype: torch.dtype) -> bool:
    """Whether a tensor of `dtype` can be passed as a negation view."""
    return dtype.is_floating_point or dtype in _NEGATABLE


@st.composite
def laid_out(draw, value: torch.Tensor) -> tuple[torch.Tensor, str]:
    """A layout for `value`; "expanded" (stride 0 along dim 0) also makes the
    value uniform along that dim, so the oracle sees what the rank builds."""
    options = ["contiguous", "strided"]
    if value.dim() >= 2:
        options.append("transposed")
    if value.dim() >= 1 and value.shape[0] >= 2:
        options.append("expanded")
    if negatable(value.dtype):
        options.append("negated")  # memory holds -value, the negative bit set
    layout = draw(st.sampled_from(options))
    if layout == "expanded":
        value = value[:1].expand(value.shape).clone()
    return value, layout


# -- cases --------------------------------------------------------------------


@dataclass
class DrawnCase:
    """A program, every rank's inputs and layouts, every rank's expectation."""

    name: str
    source: str
    inputs: list[list[torch.Tensor]]
    expected: list[list[oracle.Expected]]
    layouts: list[list[str]] = field(default_factory=list)
    implementations: tuple[tuple[str, str], ...] = ()
    #: pipelines that apply to this case (the rest are run too: no-ops)
    pipelines: tuple[str, ...] = PIPELINES

    def case(
        self, pipeline: str = "", donate: tuple[int, ...] = (), saved_by_autograd: bool = False
    ) -> Case:
        return Case(
            name=self.name,
            source=self.source,
            inputs=self.inputs,
            layouts=self.layouts or [["contiguous"] * len(x) for x in self.inputs],
            pipeline=pipeline,
            implementations=self.implementations,
            donate=donate,
            saved_by_autograd=saved_by_autograd,
        )


def _func(args: list[str], results: list[str], body: list[str], header: str = "") -> str:
    signature = ", ".join(f"%a{i}: {t}" for i, t in enumerate(args))
    lines = [header] if header else []
    lines.append(f"func.func @main({signature}) -> ({', '.join(results)}) {{")
    lines += ["  " + line for line in body]
    lines.append("}")
    return "\n".join(lines) + "\n"


@st.composite
def per_rank_inputs(draw, world: int, dtype: torch.dtype, shape: tuple[int, ...], finite=False):
    """Every rank's value and layout for one argument."""
    values, layouts = [], []
    for _ in range(world):
        value, layout = draw(laid_out(draw(tensors(dtype, shape, finite))))
        values.append(value)
        layouts.append(layout)
    return values, layouts


def _transpose(rows: list[list]) -> list[list]:
    return [list(r) for r in zip(*rows)]


def query_cases(world: int) -> st.SearchStrategy[DrawnCase]:
    body = ["%r = dist.rank : index", "%n = dist.group_size : index",
            "func.return %r, %n : index, index"]  # fmt: skip
    expected = [r + n for r, n in zip(oracle.rank(world), oracle.group_size(world))]
    return st.just(DrawnCase("rank/group_size", _func([], ["index", "index"], body),
                             [[] for _ in range(world)], expected))  # fmt: skip


@st.composite
def broadcast_cases(draw, world: int) -> DrawnCase:
    element = draw(st.sampled_from(list(ELEMENT_TYPES)))
    dtype = ELEMENT_TYPES[element]
    shape = draw(shapes())
    root = draw(st.integers(0, world - 1))
    xs, layouts = draw(per_rank_inputs(world, dtype, shape))
    t = tensor_type(shape, element)
    body = [f"%y = dist.broadcast %a0 root {root} : {t}", f"func.return %y : {t}"]
    return DrawnCase(f"broadcast root {root} {t}", _func([t], [t], body),
                     [[x] for x in xs], oracle.broadcast(xs, root), [[lay] for lay in layouts])  # fmt: skip


@st.composite
def native_all_reduce_cases(draw, world: int, kinds=NATIVE_KINDS) -> DrawnCase:
    kind = draw(st.sampled_from(kinds))
    candidates = [e for e in ELEMENT_TYPES if kind not in BITWISE_KINDS or e not in FLOAT_TYPES]
    element = draw(st.sampled_from(candidates))
    dtype = ELEMENT_TYPES[element]
    shape = draw(shapes())
    xs, layouts = draw(per_rank_inputs(world, dtype, shape))
    t = tensor_type(shape, element)
    body = [f"%y = dist.all_reduce {kind} %a0 : {t}", f"func.return %y : {t}"]
    return DrawnCase(f"all_reduce {kind} {t}", _func([t], [t], body), [[x] for x in xs],
                     oracle.native_all_reduce(kind, xs), [[lay] for lay in layouts])  # fmt: skip


_COMBINE_TYPES = {
    "addi": SIGNLESS_INT_TYPES, "muli": SIGNLESS_INT_TYPES, "maxsi": SIGNLESS_INT_TYPES,
    "minsi": SIGNLESS_INT_TYPES, "maxui": SIGNLESS_INT_TYPES, "minui": SIGNLESS_INT_TYPES,
    "andi": SIGNLESS_INT_TYPES + ("i1",), "ori": SIGNLESS_INT_TYPES + ("i1",),
    "xori": SIGNLESS_INT_TYPES + ("i1",), "addf": FLOAT_TYPES, "mulf": FLOAT_TYPES,
    "maximumf": FLOAT_TYPES, "minimumf": FLOAT_TYPES,
    "first": ("i64", "f32", "i1"), "last": ("i64", "f64", "i8"),
}  # fmt: skip


@st.composite
def generic_all_reduce_cases(draw, world: int) -> DrawnCase:
    combine = draw(st.sampled_from(sorted(oracle.GENERIC_COMBINES)))
    element = draw(st.sampled_from(_COMBINE_TYPES[combine]))
    dtype = ELEMENT_TYPES[element]
    _, commutative_op = oracle.GENERIC_COMBINES[combine]
    commutative = commutative_op and draw(st.booleans())
    algorithm = draw(st.sampled_from(GENERIC_ALGORITHMS))
    shape = draw(shapes())
    xs, layouts = draw(per_rank_inputs(world, dtype, shape))
    t = tensor_type(shape, element)
    if combine == "first":
        region = [f"  dist.yield %lhs : {t}"]
    elif combine == "last":
        region = [f"  dist.yield %rhs : {t}"]
    else:
        region = [f"  %c = arith.{combine} %lhs, %rhs : {t}", f"  dist.yield %c : {t}"]
    marker = " commutative" if commutative else ""
    body = [f"%y = dist.all_reduce %a0{marker} : {t} combine(%lhs, %rhs) {{", *region, "}",
            f"func.return %y : {t}"]  # fmt: skip
    impls = (("dist.all_reduce", algorithm),) if algorithm else ()
    return DrawnCase(
        f"generic {combine}{marker} {t} [{algorithm or 'default'}]",
        _func([t], [t], body), [[x] for x in xs],
        oracle.generic_all_reduce(combine, xs, commutative), [[lay] for lay in layouts],
        implementations=impls,
    )  # fmt: skip


@st.composite
def ciphertext_cases(draw, world: int) -> DrawnCase:
    limbs = draw(st.integers(1, 3))
    coeffs = draw(st.integers(0, 4))
    batch = draw(st.integers(1, 2))
    bits = draw(st.sampled_from([None, 60]))
    top = (1 << 60) if bits else (1 << 62)
    moduli = draw(st.lists(st.sampled_from([2, 3, top - 1, top - 93]) | st.integers(2, top - 1),
                           min_size=limbs, max_size=limbs))  # fmt: skip
    shape = (batch, limbs, coeffs)
    cts = []
    for _ in range(world):
        flat = []
        for _b in range(batch):
            for q in moduli:
                flat += draw(st.lists(st.sampled_from([0, q - 1]) | st.integers(0, q - 1),
                                      min_size=coeffs, max_size=coeffs))  # fmt: skip
        cts.append(torch.tensor(flat, dtype=torch.int64).reshape(shape))
    t, tq = tensor_type(shape, "i64"), tensor_type((limbs,), "i64")
    attr = f" max_modulus_bits {bits}" if bits else ""
    body = [f"%y = dist.all_reduce_add_ciphertext %a0, %a1{attr} : {t}, {tq}",
            f"func.return %y : {t}"]  # fmt: skip
    q = torch.tensor(moduli, dtype=torch.int64)
    return DrawnCase(f"ciphertext sum {t}{attr}", _func([t, tq], [t], body),
                     [[ct, q.clone()] for ct in cts], oracle.ciphertext_sum(cts, moduli))  # fmt: skip


@st.composite
def all_gather_cases(draw, world: int) -> DrawnCase:
    element = draw(st.sampled_from(list(ELEMENT_TYPES)))
    dtype = ELEMENT_TYPES[element]
    uneven = draw(st.booleans())
    if not uneven:
        shape = draw(shapes(1, 3))
        axis = draw(st.integers(0, len(shape) - 1))
        xs, layouts = draw(per_rank_inputs(world, dtype, shape))
        t = tensor_type(shape, element)
        out = list(shape)
        out[axis] *= world
        to = tensor_type(tuple(out), element)
        body = [f"%y = dist.all_gather %a0 axis {axis} : {t} -> {to}", f"func.return %y : {to}"]
        return DrawnCase(f"all_gather axis {axis} {t}", _func([t], [to], body), [[x] for x in xs],
                         oracle.all_gather(xs, axis), [[lay] for lay in layouts])  # fmt: skip
    width = draw(st.integers(0, 2))
    counts = draw(st.lists(st.integers(0, 3), min_size=world, max_size=world))
    xs, layouts = [], []
    for r in range(world):
        x, layout = draw(laid_out(draw(tensors(dtype, (counts[r], width)))))
        xs.append(x)
        layouts.append(layout)
    t = tensor_type((None, width), element)
    tc = tensor_type((world,), "i64")
    c = torch.tensor(counts, dtype=torch.int64)
    body = [f"%y = dist.all_gather %a0 counts(%a1 : {tc}) axis 0 : {t} -> {t}",
            f"func.return %y : {t}"]  # fmt: skip
    return DrawnCase(f"all_gather counts {counts} {t}", _func([t, tc], [t], body),
                     [[x, c.clone()] for x in xs], oracle.all_gather(xs, 0),
                     [[lay, "contiguous"] for lay in layouts])  # fmt: skip


@st.composite
def reduce_scatter_cases(draw, world: int) -> DrawnCase:
    kind = draw(st.sampled_from(NATIVE_KINDS))
    candidates = [e for e in ELEMENT_TYPES if kind not in BITWISE_KINDS or e not in FLOAT_TYPES]
    element = draw(st.sampled_from(candidates))
    dtype = ELEMENT_TYPES[element]
    shape = list(draw(shapes(1, 3)))
    axis = draw(st.integers(0, len(shape) - 1))
    shape[axis] *= world
    xs, layouts = draw(per_rank_inputs(world, dtype, tuple(shape)))
    t = tensor_type(tuple(shape), element)
    out = list(shape)
    out[axis] //= world
    to = tensor_type(tuple(out), element)
    body = [f"%y = dist.reduce_scatter {kind} %a0 axis {axis} : {t} -> {to}",
            f"func.return %y : {to}"]  # fmt: skip
    return DrawnCase(f"reduce_scatter {kind} axis {axis} {t}", _func([t], [to], body),
                     [[x] for x in xs], oracle.reduce_scatter(kind, xs, axis),
                     [[lay] for lay in layouts])  # fmt: skip


#: the reduce-scatter's schedules a case may ask for by name ("" = its choice)
REDUCE_SCATTER_SCHEDULES = ("", "ring", "direct")


def _modular_add_reduce_scatter(t, tq, to, counts, axis) -> str:
    """A generic reduce-scatter whose region is `lower-ciphertext-add`'s
    modular add, recorded as `known_combine`, printed by xDSL."""
    from xdsl.dialects.builtin import StringAttr
    from xdsl.ir import Block

    from distir.ops.all_reduce.ir import KNOWN_COMBINE, MODULAR_ADD, modular_add_region
    from distir.ops.reduce_scatter.ir import ReduceScatterOp

    block = Block(arg_types=[t, tq])
    block.args[0].name_hint, block.args[1].name_hint = "a0", "a1"
    op = ReduceScatterOp(block.args[0], to, combine=modular_add_region(t, tq),
                         extras=[block.args[1]], commutative=True, counts=counts, axis=axis)  # fmt: skip
    op.attributes[KNOWN_COMBINE] = StringAttr(MODULAR_ADD)
    op.result.name_hint = "y"
    block.add_op(op)
    return str(op)


@st.composite
def general_reduce_scatter_cases(draw, world: int) -> DrawnCase:
    """Native kinds and combine regions (every combine the generic
    all-reduce is tested with, and the ciphertext modular add), even and
    uneven counts, any axis, every schedule that computes it exactly."""
    combine = draw(st.sampled_from(["native", "modular-add", *sorted(oracle.GENERIC_COMBINES)]))
    uneven = draw(st.booleans())
    if combine == "modular-add":
        limbs = draw(st.integers(1, 3))
        shape = [draw(st.integers(0, 2)), limbs, draw(st.integers(0, 3))]
        axis = draw(st.sampled_from([0, 2]))
        shape[axis] *= world
        element, dtype = "i64", torch.int64
    else:
        if combine == "native":
            kind = draw(st.sampled_from(NATIVE_KINDS))
            candidates = [e for e in ELEMENT_TYPES if kind not in BITWISE_KINDS or e not in FLOAT_TYPES]
            element = draw(st.sampled_from(candidates))
        else:
            element = draw(st.sampled_from(_COMBINE_TYPES[combine]))
        dtype = ELEMENT_TYPES[element]
        shape = list(draw(shapes(1, 3)))
        axis = draw(st.integers(0, len(shape) - 1))
        shape[axis] *= world
    if uneven:
        counts = draw(st.lists(st.integers(0, 3), min_size=world, max_size=world))
        shape[axis] = sum(counts)
    else:
        counts = None
    shape_t = tuple(shape)
    t = tensor_type(shape_t, element)
    out = list(shape_t)
    out[axis] = None if uneven else shape[axis] // world
    to = tensor_type(tuple(out), element)
    counts_text = f" counts [{', '.join(map(str, counts))}]" if uneven else ""
    if combine == "modular-add":
        from xdsl.dialects.builtin import DYNAMIC_INDEX, TensorType, i64

        moduli = draw(st.lists(st.sampled_from([2, 3, (1 << 62) - 57]) | st.integers(2, (1 << 62) - 1),
                               min_size=shape[1], max_size=shape[1]))  # fmt: skip
        xs = []
        for _ in range(world):
            flat = []
            for index in range(math.prod(shape)):
                q = moduli[(index // shape[2]) % shape[1]]
                flat.append(draw(st.sampled_from([0, q - 1]) | st.integers(0, q - 1)))
            xs.append(torch.tensor(flat, dtype=torch.int64).reshape(shape_t))
        tq = tensor_type((shape[1],), "i64")
        op_text = _modular_add_reduce_scatter(
            TensorType(i64, shape), TensorType(i64, [shape[1]]),
            TensorType(i64, [DYNAMIC_INDEX if d is None else d for d in out]), counts, axis)
        body = [*op_text.splitlines(), f"func.return %y : {to}"]
        total = oracle.ciphertext_sum(xs, moduli)[0][0]
        q = torch.tensor(moduli, dtype=torch.int64)
        return DrawnCase(f"reduce_scatter modular-add{counts_text} axis {axis} {t}",
                         _func([t, tq], [to], body), [[x, q.clone()] for x in xs],
                         oracle.scattered(total, world, axis, counts))  # fmt: skip
    xs, layouts = draw(per_rank_inputs(world, dtype, shape_t))
    if combine == "native":
        head = f"%y = dist.reduce_scatter {kind} %a0{counts_text} axis {axis}"
        commutative, region, name = True, [], kind
        total = oracle.native_all_reduce(kind, xs)[0][0]
    else:
        _, commutative_op = oracle.GENERIC_COMBINES[combine]
        commutative = commutative_op and draw(st.booleans())
        marker = " commutative" if commutative else ""
        head = f"%y = dist.reduce_scatter %a0{counts_text} axis {axis}{marker}"
        if combine in ("first", "last"):
            region = [f"  dist.yield %{'lhs' if combine == 'first' else 'rhs'} : {t}", "}"]
        else:
            region = [f"  %c = arith.{combine} %lhs, %rhs : {t}", f"  dist.yield %c : {t}", "}"]
        name = f"{combine}{marker}"
        total = oracle.generic_all_reduce(combine, xs, commutative)[0][0]
    schedules = REDUCE_SCATTER_SCHEDULES if commutative else ("", "direct")
    schedule = draw(st.sampled_from(schedules))
    tail = " combine(%lhs, %rhs) {" if region else ""
    body = [f"{head} : {t} -> {to}{tail}", *region, f"func.return %y : {to}"]
    impls = (("dist.reduce_scatter", schedule),) if schedule else ()
    return DrawnCase(
        f"reduce_scatter {name}{counts_text} axis {axis} {t} [{schedule or 'default'}]",
        _func([t], [to], body), [[x] for x in xs], oracle.scattered(total, world, axis, counts),
        [[lay] for lay in layouts], implementations=impls,
    )  # fmt: skip


@st.composite
def gather_scatter_cases(draw, world: int) -> DrawnCase:
    """`dist.gather` or `dist.scatter`, even along any axis or uneven (counts
    with zeros) along axis 0, to or from any root."""
    op = draw(st.sampled_from(["gather", "scatter"]))
    element = draw(st.sampled_from(list(ELEMENT_TYPES)))
    dtype = ELEMENT_TYPES[element]
    root = draw(st.integers(0, world - 1))
    if draw(st.booleans()):
        shape = list(draw(shapes(1, 3)))
        axis = draw(st.integers(0, len(shape) - 1))
        whole = list(shape)
        whole[axis] *= world
        t_in, t_out = (shape, whole) if op == "gather" else (whole, shape)
        xs, layouts = draw(per_rank_inputs(world, dtype, tuple(t_in)))
        t, to = tensor_type(tuple(t_in), element), tensor_type(tuple(t_out), element)
        expected = oracle.gather(xs, axis, root) if op == "gather" else oracle.scatter(xs, axis, root)
        body = [f"%y = dist.{op} %a0 axis {axis} root {root} : {t} -> {to}",
                f"func.return %y : {to}"]  # fmt: skip
        return DrawnCase(f"{op} axis {axis} root {root} {t}", _func([t], [to], body),
                         [[x] for x in xs], expected, [[lay] for lay in layouts])  # fmt: skip
    width = draw(st.integers(0, 2))
    counts = draw(st.lists(st.integers(0, 3), min_size=world, max_size=world))
    xs, layouts = [], []
    for r in range(world):
        rows = counts[r] if op == "gather" else sum(counts)
        x, layout = draw(laid_out(draw(tensors(dtype, (rows, width)))))
        xs.append(x)
        layouts.append(layout)
    t = tensor_type((None, width), element)
    tc = tensor_type((world,), "i64")
    c = torch.tensor(counts, dtype=torch.int64)
    expected = oracle.gather(xs, 0, root) if op == "gather" else oracle.scatter(xs, 0, root, counts)
    body = [f"%y = dist.{op} %a0 counts(%a1 : {tc}) axis 0 root {root} : {t} -> {t}",
            f"func.return %y : {t}"]  # fmt: skip
    return DrawnCase(f"{op} counts {counts} root {root} {t}", _func([t, tc], [t], body),
                     [[x, c.clone()] for x in xs], expected,
                     [[lay, "contiguous"] for lay in layouts])  # fmt: skip


@st.composite
def reduce_cases(draw, world: int) -> DrawnCase:
    kind = draw(st.sampled_from(NATIVE_KINDS))
    candidates = [e for e in ELEMENT_TYPES if kind not in BITWISE_KINDS or e not in FLOAT_TYPES]
    element = draw(st.sampled_from(candidates))
    shape = draw(shapes())
    root = draw(st.integers(0, world - 1))
    xs, layouts = draw(per_rank_inputs(world, ELEMENT_TYPES[element], shape))
    t = tensor_type(shape, element)
    body = [f"%y = dist.reduce {kind} %a0 root {root} : {t}", f"func.return %y : {t}"]
    return DrawnCase(f"reduce {kind} root {root} {t}", _func([t], [t], body), [[x] for x in xs],
                     oracle.reduce(kind, xs, root), [[lay] for lay in layouts])  # fmt: skip


@st.composite
def shift_cases(draw, world: int) -> DrawnCase:
    element = draw(st.sampled_from(list(ELEMENT_TYPES)))
    shape = draw(shapes(0, 2))
    offset = draw(st.integers(-world - 1, world + 1))
    rotate = draw(st.booleans())
    xs, layouts = draw(per_rank_inputs(world, ELEMENT_TYPES[element], shape))
    t = tensor_type(shape, element)
    ring = " rotate" if rotate else ""
    body = [f"%y = dist.shift %a0 offset {offset}{ring} : {t}", f"func.return %y : {t}"]
    return DrawnCase(f"shift {offset}{ring} {t}", _func([t], [t], body), [[x] for x in xs],
                     oracle.shift(xs, offset, rotate), [[lay] for lay in layouts])  # fmt: skip


@st.composite
def all_to_all_cases(draw, world: int) -> DrawnCase:
    element = draw(st.sampled_from(list(ELEMENT_TYPES)))
    dtype = ELEMENT_TYPES[element]
    width = draw(st.integers(0, 2))
    sends = [draw(st.lists(st.integers(0, 2), min_size=world, max_size=world))
             for _ in range(world)]  # fmt: skip
    xs, layouts = [], []
    for r in range(world):
        x, layout = draw(laid_out(draw(tensors(dtype, (sum(sends[r]), width)))))
        xs.append(x)
        layouts.append(layout)
    t = tensor_type((None, width), element)
    tc = tensor_type((world,), "i64")
    body = [f"%y, %rc = dist.variable_all_to_all %a0, %a1 axis 0 : {t}, {tc} -> {t}",
            f"func.return %y, %rc : {t}, {tc}"]  # fmt: skip
    inputs = [[x, torch.tensor(s, dtype=torch.int64)] for x, s in zip(xs, sends)]
    return DrawnCase(f"variable_all_to_all {sends} {t}", _func([t, tc], [t, tc], body), inputs,
                     oracle.variable_all_to_all(xs, sends, 0),
                     [[lay, "contiguous"] for lay in layouts])  # fmt: skip


@st.composite
def p2p_cases(draw, world: int) -> DrawnCase:
    element = draw(st.sampled_from(list(ELEMENT_TYPES)))
    dtype = ELEMENT_TYPES[element]
    shape = draw(shapes())
    xs, layouts = draw(per_rank_inputs(world, dtype, shape))
    t = tensor_type(shape, element)
    if draw(st.booleans()):
        body = ["%n = dist.group_size : index", "%r = dist.rank : index",
                "%one = arith.constant 1 : index", "%r1 = arith.addi %r, %one : index",
                "%next = arith.remui %r1, %n : index", "%rn = arith.addi %r, %n : index",
                "%rm = arith.subi %rn, %one : index", "%prev = arith.remui %rm, %n : index",
                f"%y = dist.sendrecv %a0 to %next from %prev : {t} -> {t}",
                f"func.return %y : {t}"]  # fmt: skip
        expected, name = oracle.ring_shift(xs), f"sendrecv ring {t}"
    else:
        last = world - 1
        body = ["%r = dist.rank : index", "%zero = arith.constant 0 : index",
                f"%last = arith.constant {last} : index",
                "%is0 = arith.cmpi eq, %r, %zero : index",
                "%islast = arith.cmpi eq, %r, %last : index",
                f"%y = scf.if %is0 -> ({t}) {{", f"  dist.send %a0 to {last} : {t}",
                f"  scf.yield %a0 : {t}", "} else {", f"  %z = scf.if %islast -> ({t}) {{",
                f"    %got = dist.recv from 0 : {t}", f"    scf.yield %got : {t}",
                "  } else {", f"    scf.yield %a0 : {t}", "  }", f"  scf.yield %z : {t}", "}",
                f"func.return %y : {t}"]  # fmt: skip
        expected, name = oracle.send_to_last(xs), f"send 0 -> {last} {t}"
    return DrawnCase(name, _func([t], [t], body), [[x] for x in xs], expected,
                     [[lay] for lay in layouts])  # fmt: skip


@st.composite
def wave_cases(draw, world: int) -> DrawnCase:
    element = draw(st.sampled_from(["i8", "i32", "i64", "f32", "f64", "ui8"]))
    dtype = ELEMENT_TYPES[element]
    shape = draw(shapes())
    xs, layouts = draw(per_rank_inputs(world, dtype, shape))
    t = tensor_type(shape, element)
    body = ["%s, %m = dist.wave {", f"  %0 = dist.all_reduce sum %a0 : {t}",
            f"  %1 = dist.all_reduce max %a0 : {t}", f"  dist.yield %0, %1 : {t}, {t}",
            f"}} : {t}, {t}", f"func.return %s, %m : {t}, {t}"]  # fmt: skip
    sums = oracle.native_all_reduce("sum", xs)
    maxes = oracle.native_all_reduce("max", xs)
    return DrawnCase(f"wave sum+max {t}", _func([t], [t, t], body), [[x] for x in xs],
                     [a + b for a, b in zip(sums, maxes)], [[lay] for lay in layouts])  # fmt: skip


@st.composite
def transfer_cases(draw, world: int) -> DrawnCase:
    element = draw(st.sampled_from(["i32", "i64", "f32", "f64"]))
    dtype = ELEMENT_TYPES[element]
    kind = draw(st.sampled_from(["gather", "scatter", "partial"]))
    rows, cols = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    ranks = ", ".join(str(r) for r in range(world))
    header = f"dist.mesh @m [{world}] ranks [{ranks}]"
    t = tensor_type((None, None), element)
    finite = kind == "partial"  # sums: the native family covers the specials
    if kind == "gather":  # rows sharded -> replicated
        shape = (rows, cols)
        xs, layouts = draw(per_rank_inputs(world, dtype, shape, finite))
        layout_text = f"from @m [0, *] to @m [*, *] global [{rows * world}, {cols}]"
        expected = oracle.transfer_sharded_to_replicated(xs, 0)
    elif kind == "scatter":  # replicated -> columns sharded
        full, layout = draw(laid_out(draw(tensors(dtype, (rows, cols * world)))))
        xs, layouts = [full.clone() for _ in range(world)], [layout] * world
        layout_text = f"from @m [*, *] to @m [*, 0] global [{rows}, {cols * world}]"
        expected = oracle.transfer_replicated_to_sharded(full, world, 1)
    else:  # partial sums -> replicated
        shape = (rows, cols)
        xs = [draw(tensors(dtype, shape, finite=True).map(lambda v: v.clamp(-1000, 1000).round()))
              for _ in range(world)]  # fmt: skip
        layouts = ["contiguous"] * world
        layout_text = f"from @m [*, *] partial [0] to @m [*, *] global [{rows}, {cols}]"
        expected = oracle.transfer_partial_to_replicated(xs)
    body = [f"%y = dist.transfer %a0 {layout_text} : {t} -> {t}", f"func.return %y : {t}"]
    return DrawnCase(f"transfer {layout_text} {element}", _func([t], [t], body, header),
                     [[x] for x in xs], expected, [[lay] for lay in layouts])  # fmt: skip


FAMILIES = {
    "queries": query_cases,
    "broadcast": broadcast_cases,
    "native": native_all_reduce_cases,
    "generic": generic_all_reduce_cases,
    "ciphertext": ciphertext_cases,
    "all_gather": all_gather_cases,
    "reduce_scatter": reduce_scatter_cases,
    "reduce_scatter_general": general_reduce_scatter_cases,
    "gather_scatter": gather_scatter_cases,
    "reduce": reduce_cases,
    "shift": shift_cases,
    "all_to_all": all_to_all_cases,
    "p2p": p2p_cases,
    "wave": wave_cases,
    "transfer": transfer_cases,
}


def any_case(world: int) -> st.SearchStrategy[DrawnCase]:
    return st.one_of(*(family(world) for family in FAMILIES.values()))


def examples(fraction: float) -> int:
    """`fraction` of the active hypothesis profile's example count (at least
    one): profiles `ci` (the default) and `dev` are set in tests/conftest.py."""
    from hypothesis import settings

    return max(1, round(settings.default.max_examples * fraction))
