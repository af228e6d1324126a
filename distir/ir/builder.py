"""Building dist programs from Python, without importing xDSL.

Every helper creates one op at the current insertion point (xDSL's
`ImplicitBuilder`, which `build_program` sets up) and returns its result
values, so a program reads like the text it prints:

    def body(x):
        total = all_reduce(x, "sum")
        largest = all_reduce(total, combine=lambda a, b: arith("maxsi", a, b),
                             commutative=True)
        return largest, all_gather(x)

    module = build_program(body, [tensor_type("i64", [8])], groups={"pairs": [[0, 1], [2, 3]]})

A combine region (and a wave's body) comes from a Python callback: it
receives the block arguments `(lhs, rhs, extra...)` (a wave's body: none) and
returns the value(s) to yield; the helper appends the `dist.yield`.

The local ops of a combine are built by `arith`, `cmpf` / `cmpi`, `select`,
`cast`, `math`, and `concat` / `extract_slice` (packed multi-part values):

    def abs_max(a, b):  # a tie (x and -x, NaN) takes maximumf: commutative
        bigger = cmpf("ogt", math("absf", a), math("absf", b))
        smaller = cmpf("olt", math("absf", a), math("absf", b))
        return select(bigger, a, select(smaller, b, arith("maximumf", a, b)))

Every op a helper builds carries the Python call site (`file:line:col` of
the line that called the helper) as its location, so errors found later
(a verifier, a backend, a rank mismatch) point at the program's source. A
helper given operands it cannot build an op from raises `BuilderError`,
naming the call (`arith("addi", f32, f32)`) and its call site.

`HELPERS` maps every op of the dialect to the helper that builds it,
derived from the op table (`distir.ops.table`): each helper lives in its
family's folder (`distir/ops/<family>/build.py`), the shared machinery in
`distir.ir.building`; this module is the public surface that gathers them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from xdsl.builder import ImplicitBuilder
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, UnknownLoc
from xdsl.ir import Attribute, Block, Operation, Region
from xdsl.utils.exceptions import DiagnosticException

from distir.ir.building import (
    Body,
    BuilderError,
    GroupRef,
    Peer,
    Value,
    arith,
    as_values,
    call_site,
    cast,
    cmpf,
    cmpi,
    concat,
    constant_index,
    constant_tensor,
    element_type,
    extract_slice,
    located_at_callers_of,
    math,
    select,
    tensor_type,
)
from distir.ir.parsing import describe_op, find_verify_failure
from distir.ops.all_gather.build import all_gather
from distir.ops.all_reduce.build import all_reduce, all_reduce_add_ciphertext
from distir.ops.all_to_all.build import variable_all_to_all
from distir.ops.asserts.build import assert_reduced, assert_uniform
from distir.ops.broadcast.build import broadcast
from distir.ops.gather_scatter.build import gather, scatter
from distir.ops.groups.build import declare_group, group_size, rank
from distir.ops.p2p.build import recv, send, sendrecv
from distir.ops.reduce.build import reduce
from distir.ops.reduce_scatter.build import reduce_scatter
from distir.ops.replication.build import psum, pvary
from distir.ops.shift.build import shift
from distir.ops.table import helper_names
from distir.ops.transfer.build import declare_mesh, transfer
from distir.ops.wave.build import make_combine_region, wave

__all__ = [
    "HELPERS",
    "Body",
    "BuilderError",
    "GroupRef",
    "Peer",
    "Value",
    "all_gather",
    "all_reduce",
    "all_reduce_add_ciphertext",
    "arith",
    "assert_reduced",
    "assert_uniform",
    "broadcast",
    "build_program",
    "call_site",
    "cast",
    "cmpf",
    "cmpi",
    "concat",
    "constant_index",
    "constant_tensor",
    "declare_group",
    "declare_mesh",
    "element_type",
    "extract_slice",
    "gather",
    "group_size",
    "located_at_callers_of",
    "make_combine_region",
    "math",
    "psum",
    "pvary",
    "rank",
    "recv",
    "reduce",
    "reduce_scatter",
    "scatter",
    "select",
    "send",
    "sendrecv",
    "shift",
    "tensor_type",
    "transfer",
    "variable_all_to_all",
    "wave",
]


def build_program(
    body: Body,
    arg_types: Sequence[Attribute],
    *,
    name: str = "main",
    groups: Mapping[str, Sequence[Sequence[int]]] | None = None,
    meshes: Mapping[str, tuple[Sequence[int], Sequence[int]]] | None = None,
) -> ModuleOp:
    """A verified module holding the group declarations (name -> subgroups),
    the mesh declarations (name -> (shape, ranks)) and `func.func @name`
    whose body is built by `body(*args)`; what `body` returns is returned.
    Ops that no helper located (the function, its return, xDSL ops built
    directly) get the location of this call."""
    site = call_site()
    module = ModuleOp([])
    with ImplicitBuilder(module.body.block):
        for sym, parts in (groups or {}).items():
            declare_group(sym, parts)
        for sym, (shape, ranks) in (meshes or {}).items():
            declare_mesh(sym, shape, ranks)
    block = Block(arg_types=arg_types)
    for i, arg in enumerate(block.args):
        arg.name_hint = f"arg{i}"
    with ImplicitBuilder(block):
        values = as_values(body(*block.args))
        func.ReturnOp(*values)
    fn = func.FuncOp(name, (list(arg_types), [v.type for v in values]), Region(block))
    module.body.block.add_op(fn)
    for op in module.walk():
        if site is not None and isinstance(op.location, UnknownLoc) and op is not module:
            op.location = site
    try:
        module.verify()
    except DiagnosticException as e:
        raise BuilderError(f"the built program does not verify: {_failing(module, e)}") from None
    return module


def _failing(module: ModuleOp, error: Exception) -> str:
    """The verifier's message, prefixed by the op that fails and where it was built."""
    failure = find_verify_failure(module)
    if failure is None:
        return " ".join(str(error).split())
    op, e = failure
    return f"{describe_op(op)}: {' '.join(str(e).split())}"


HELPERS: dict[type[Operation], Callable[..., object]] = {
    op: globals()[name] for op, name in helper_names().items()
}
"""Op class -> the helper that builds it (from the op table)."""
