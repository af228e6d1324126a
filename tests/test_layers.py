"""The package's layers import one way, as its folders say:

    ir <- passes;  ir <- core <- transport <- runtime <- cli
    (ir/modular.py, the int64 headroom proof, is torch-free, for passes;
    he/ (rns, seal, ntt and threshold's arithmetic) sits beside transport;
    aggregation, the threshold protocol made of distir programs, above runtime)

`ir/` and `passes/` never import torch (distir-opt and other IR-only tools
stay light); no module imports a higher layer, or a private name of another
module; the import graph, counting every import statement (function-level
ones included), has no cycle. An op family (`ops/<family>/`) spans layers
by module name: `semantics` on the core's layer, `torch` on the
transport's, the rest IR. Every dist op has exactly one semantics record and
one default Torch implementation, both derived from the op table
(`distir.ops.table`), and the code specific to an op lives in its family
folder (what is left outside is listed, as debt).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

import pytest

from distir.core.records import OpSemantics

PACKAGE = Path(__file__).resolve().parents[1] / "distir"

#: layer -> rank; a module may import modules of its own rank or lower
LAYERS = {
    "durations": 0,
    "errors": 1, "ir": 1,
    "passes": 2,
    "core": 3,
    "he": 4, "transport": 4,
    "runtime": 5, "": 5,  # the package facade (distir.compile, ...) is the runtime's
    "aggregation": 6, "ddp": 6, "bench": 6, "cli": 7,
}  # fmt: skip
#: a module of an op family (`ops.<family>.<name>`) sits on the layer of its
#: name: the records on the execution core's, the Torch implementations on
#: the transport's; every other module of a family (and the op table) is IR
OPS_LAYERS = {"semantics": "core", "torch": "transport"}
TORCH_FREE = ("ir", "passes", "errors", "durations")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(p for p in parts if p != "__init__")
        found[name] = path
    return found


MODULES = _modules()


def _layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "ops":  # an op family: its layer is in its modules' names
        return OPS_LAYERS.get(parts[2] if len(parts) > 2 else "", "ir")
    for layer in sorted(LAYERS, key=len, reverse=True):
        if layer and (module == layer or module.startswith(layer + ".")):
            return layer
    return ""


@functools.cache
def _imports(path: Path) -> list[tuple[str, list[str], bool]]:
    """(module, imported names, at top level) of every import of distir or
    torch (read once per file: several tests walk every module)."""
    tree = ast.parse(path.read_text())
    found = []
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [a.name for a in node.names], id(node) in top))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found.append((alias.name, [], id(node) in top))
    return found


def _internal(module: str) -> str | None:
    if module == "distir":
        return ""
    return module[len("distir.") :] if module.startswith("distir.") else None


@pytest.mark.parametrize("name", sorted(MODULES), ids=lambda n: n or "distir")
def test_imports_point_down_the_layers(name: str) -> None:
    mine = LAYERS[_layer(name)]
    for module, names, _top in _imports(MODULES[name]):
        target = _internal(module)
        if target is None:
            continue
        theirs = LAYERS[_layer(target)]
        assert theirs <= mine, f"distir.{name} (layer {_layer(name)!r}) imports {module}"
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert not private, f"distir.{name} imports private names {private} from {module}"


@pytest.mark.parametrize(
    "name", sorted(n for n in MODULES if _layer(n) in TORCH_FREE), ids=lambda n: n
)
def test_ir_and_passes_import_no_torch(name: str) -> None:
    for module, _names, _top in _imports(MODULES[name]):
        assert module.split(".")[0] not in ("torch", "numpy"), f"distir.{name} imports {module}"


def _import_graph() -> dict[str, set[str]]:
    """module -> the distir modules it imports, by every import statement:
    function-level ones too (a deferred import hides a cycle from the
    interpreter, not from the reader) and those under TYPE_CHECKING."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        edges = set()
        for module, names, _top in _imports(path):
            target = _internal(module)
            if target is None:
                continue
            submodules = {f"{target}.{n}" for n in names} & MODULES.keys()
            edges |= submodules or ({target} & MODULES.keys())
        graph[name] = edges - {name}
    graph["passes"] |= _lazy_pass_modules()
    semantics, torch = _lazy_family_modules()
    graph["core.semantics"] |= semantics
    graph["transport.implementations"] |= torch
    return graph


def _lazy_pass_modules() -> set[str]:
    """The pass modules `distir.passes` imports by name (`importlib`), from its
    declared table: edges of the import graph like any import statement."""
    from distir.passes import PASS_CLASSES

    return {f"passes.{module}" for module, _cls in PASS_CLASSES.values()}


def _lazy_family_modules() -> tuple[set[str], set[str]]:
    """The family modules the semantics list and the default implementations
    import by name (`importlib`), from the op table: edges like any import."""
    from distir.ops.table import running_families

    families = running_families()
    return (
        {f.semantics_module.removeprefix("distir.") for f in families},
        {f.torch_module.removeprefix("distir.") for f in families},
    )


def test_the_op_table_names_every_family_folder() -> None:
    from distir.ops.table import FAMILIES

    folders = {p.name for p in (PACKAGE / "ops").iterdir() if (p / "__init__.py").exists()}
    assert {f.name for f in FAMILIES} == folders
    semantics, torch = _lazy_family_modules()
    assert semantics | torch <= MODULES.keys()
    on_disk = {n for n in MODULES if n.startswith("ops.") and n.count(".") == 2}
    assert {n for n in on_disk if n.endswith(".semantics")} == semantics
    assert {n for n in on_disk if n.endswith(".torch")} == torch


def test_op_specific_tests_lie_in_family_folders() -> None:
    """tests/ops/<family>/ holds the tests of one family: each folder there
    is a family of the table."""
    from distir.ops.table import FAMILIES

    tests = Path(__file__).resolve().parent / "ops"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith("_")}
    assert folders <= {f.name for f in FAMILIES}


def test_the_pass_table_names_every_pass_module() -> None:
    helpers = {"passes", "passes.options", "passes._rewrite_utils"}
    on_disk = {n for n in MODULES if _layer(n) == "passes"} - helpers
    assert _lazy_pass_modules() == on_disk


def test_only_the_pass_table_imports_by_name() -> None:
    # Imports by string are invisible to the import graph unless declared as
    # the pass table is; any other use of importlib.import_module would hide edges.
    # The op table's two readers import the family modules it names, and
    # `_import_graph` adds those edges.
    users = sorted(
        name for name, path in MODULES.items() if "import_module(" in path.read_text()
    )
    assert users == ["core.semantics", "passes", "transport.implementations"]


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_cycle() -> None:
    cycles = [sorted(c) for c in _cycles(_import_graph())]
    assert not cycles, f"import cycles (function-level imports included): {cycles}"


def test_the_cycle_finder_sees_function_level_imports() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [frozenset({"a", "b", "c"})]
    source = "def f():\n    from distir.core import simulator as reference\n"
    tree_imports = [
        (node.module, [a.name for a in node.names])
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom)
    ]
    assert tree_imports == [("distir.core", ["simulator"])]


# Every op has one semantics record and one Torch implementation -------------------


def _roundtrip_programs() -> dict[str, str]:
    """Every dist op in every syntax variant (tests/ir/test_roundtrip.py)."""
    path = Path(__file__).resolve().parent / "ir" / "test_roundtrip.py"
    spec = importlib.util.spec_from_file_location("_layers_roundtrip", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PROGRAMS


def test_every_dist_op_has_exactly_one_semantics_record() -> None:
    from distir.core.kernels import LOCAL_KERNELS
    from distir.core.semantics import LOCAL_CHECK_KERNELS, SEMANTICS
    from distir.ir.dialect import GroupOp, MeshOp, WaveOp, YieldOp, dist_ops
    from distir.ir.facts import LocalCheck, Structural

    structural = {GroupOp, MeshOp, YieldOp, WaveOp}  # declarations, terminator, wave
    for op in dist_ops():
        records = [r for r in SEMANTICS if r.op is op]
        if op in structural or op in LOCAL_CHECK_KERNELS:
            assert not records, f"{op.name} is structural or a local kernel, yet has a record"
        else:
            assert len(records) == 1, f"{op.name} has {len(records)} semantics records"
            assert type(records[0]).reference is not OpSemantics.reference, op.name
    assert {r.op for r in SEMANTICS} <= set(dist_ops())
    # The dist ops with a local kernel are exactly those the IR declares local checks.
    assert [op for op in dist_ops() if op in LOCAL_CHECK_KERNELS] == [
        op for op in dist_ops() if op.has_trait(LocalCheck)
    ]
    assert not set(dist_ops()) & set(LOCAL_KERNELS), "a dist op's kernel lies in the core"
    # the ops the core executes nothing for are exactly those declaring it
    assert {op for op in dist_ops() if op.has_trait(Structural)} == structural
    assert [op.name for op in dist_ops() if op.has_trait(LocalCheck)] == ["dist.assert_reduced"]


def test_every_dist_op_has_exactly_one_default_torch_implementation() -> None:
    """Each op (each form of it: a native and a generic all-reduce) is run by
    exactly one implementation of `distributed_operation_contributions()`
    besides the algorithms, the named alternatives a program or the runtime
    may choose instead (`ops.all_reduce.torch.algorithm_contributions`, the
    reduce-scatter's `schedule_contributions`)."""
    from distir.core.semantics import SEMANTICS, semantics_of
    from distir.ir.parsing import parse_module
    from distir.ops.all_reduce.torch import algorithm_contributions
    from distir.ops.reduce_scatter.torch import schedule_contributions
    from distir.transport.implementations import distributed_operation_contributions

    algorithms = {type(a) for a in [*algorithm_contributions(), *schedule_contributions()]}
    defaults = [i for i in distributed_operation_contributions() if type(i) not in algorithms]
    seen = set()
    for name, text in _roundtrip_programs().items():
        for op in parse_module(text).walk():
            if semantics_of(type(op)) is None:
                continue
            seen.add(type(op))
            running = [
                i.name for i in defaults if isinstance(op, i.operation_types) and i.matches(op)
            ]
            assert len(running) == 1, f"{op} ({name}): implementations {running}"
    assert seen == {r.op for r in SEMANTICS}, "an op with a record is in no program"


def _table_writes(path: Path) -> list[str]:
    """`TABLE[key] = ...` anywhere in a module (a registration decorator's
    body, a loop at import time) where TABLE is one of its module-level
    constants: a table filled as a side effect of importing."""
    tree = ast.parse(path.read_text())
    constants = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name) and target.id.isupper()
    }
    return [
        f"{path.name}:{node.lineno}: {ast.unparse(target)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AugAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Subscript)
        and isinstance(target.value, ast.Name)
        and target.value.id in constants
    ]


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _layer(n) != "bench"), ids=str)
def test_no_module_fills_a_table_on_import(name: str) -> None:
    """Op semantics, kernels, implementations, builder helpers and transpose
    rules are declared tables and records handed around explicitly (or
    methods of the op), as xDSL hands `@register_impls` classes to its
    interpreter; importing a module registers nothing. (`bench/`, the
    benchmark harness, is left out: its family table is filled by a loop.)"""
    assert not _table_writes(MODULES[name])


def test_the_table_write_finder_sees_a_registration_decorator(tmp_path: Path) -> None:
    source = tmp_path / "registering.py"
    source.write_text(
        "RULES = {}\n"
        "def rule(op):\n"
        "    def register(f):\n"
        "        RULES[op] = f\n"
        "        return f\n"
        "    return register\n"
    )
    assert _table_writes(source) == ["registering.py:4: RULES[op]"]


# Everything specific to one op lives in its family folder --------------------

#: passes a user selects that rewrite the all-reduce: transformations of the
#: op, not part of it (they read its facts: `AllReduceOp.computed_kind`,
#: `.elementwise`, `.default_algorithm`, the known-combine builder)
OPTIMISATION_PASSES = {
    "passes.bucket_all_reduces",
    "passes.defer_modular_reduction",
    "passes.lower_ciphertext_add",
    "passes.recognize_native_reductions",
    "passes.select_all_reduce_algorithm",
    "passes.print_transfer_maps",
}
NOT_THE_OP = OPTIMISATION_PASSES | {
    "ir.dialect",  # the dialect's re-exports
    "ops.table",  # the op table
    "bench.dispatch",  # a stand-in implementation that measures the runtime's dispatch
    "ir.shard",  # MLIR's shard dialect: op classes of its own that share dist's names
    "passes.convert_shard_to_dist",  # a conversion a user selects: builds dist ops
}

#: modules outside an op's family that still name it: the debt left of
#: issue 35, to shrink, never to grow (empty: the analyses ask the ops'
#: facts — `Structural`, `RunsBodyInPlace`, `DeclaresRanks`, `RankQuery`,
#: a peer op's `TRAFFIC` — and the families build their own ops for passes)
NOT_YET_IN_THEIR_FAMILY: dict[str, set[str]] = {}


@functools.cache
def _names_in_code(path: Path) -> frozenset[str]:
    """Every name the module's code uses (imports, names, attributes), not
    its docstrings or comments (read once per file: every op's test asks)."""
    tree = ast.parse(path.read_text())
    # xDSL's own dialects share op names with dist's (`scf.YieldOp`):
    # an attribute of an imported xDSL module is that dialect's op
    foreign = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("xdsl")
        for alias in node.names
    }
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id not in foreign:
                names.add(node.id)
        elif isinstance(node, ast.Attribute):
            if not (isinstance(node.value, ast.Name) and node.value.id in foreign):
                names.add(node.attr)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("xdsl")):
                names.update(alias.asname or alias.name for alias in node.names)
    return frozenset(names)


def _place(module: str) -> str:
    """A module, or the op family it belongs to."""
    parts = module.split(".")
    if parts[0] == "ops" and len(parts) > 2:
        return ".".join(parts[:2])
    return module


def _places_naming(op_name: str) -> set[str]:
    return {
        _place(name)
        for name, path in MODULES.items()
        if name not in NOT_THE_OP and op_name in _names_in_code(path)
    }


def _family_ops() -> list[tuple[str, str]]:
    from distir.ops.table import FAMILIES

    return [(family.name, op.__name__) for family in FAMILIES for op in family.ops]


@pytest.mark.parametrize(("family", "op_name"), _family_ops(), ids=lambda v: v)
def test_an_ops_code_lives_in_its_family_folder(family: str, op_name: str) -> None:
    """Definition (syntax, verifier, facts, transpose rule), builder helper,
    semantics record and Torch implementations lie in `distir/ops/<family>/`: to read one op
    end to end, open that folder. Other families may name it (a transpose
    rule builds another family's op; `xdsl`'s `linalg.broadcast` shares
    `BroadcastOp`'s name); passes ask the op (traits, methods) instead.

    A new op needs, besides its folder and its line in `distir/ops/table.py`
    (its ops and the names of their helpers): its helper re-exported by
    `distir/ir/builder.py` (tests/ir/test_op_coverage.py checks); a case in
    `runtime/requirements.py` only when its static types fix the group size
    (the `ImpliesGroupSize` fact); a family in `distir/bench/families.py`; its
    meaning in the independent oracle (`tests/oracle.py`) and its values in
    the strategies (`tests/strategies.py`), which tests/ops/test_new_op_places.py
    lists op by op and checks; its syntax cases (tests/ir/test_roundtrip.py, tests/filecheck/
    dialect/ops.mlir) and invalid programs (tests/ir/test_verifiers.py), which
    tests/ir/test_op_coverage.py checks; and its tests in tests/ops/<family>/."""
    from distir.ir import dialect

    home = f"ops.{family}"
    assert _place(getattr(dialect, op_name).__module__.removeprefix("distir.")) == home
    found = _places_naming(op_name)
    outside = {p for p in found if not p.startswith("ops.")}
    allowed = NOT_YET_IN_THEIR_FAMILY.get(op_name, set())
    assert outside <= allowed, f"{op_name} is named outside its family in {sorted(outside - allowed)}"


def test_the_debt_list_is_exact() -> None:
    """Each entry of `NOT_YET_IN_THEIR_FAMILY` still names its op: a module
    that stops naming it leaves the list."""
    for op_name, places in NOT_YET_IN_THEIR_FAMILY.items():
        assert places <= _places_naming(op_name), op_name


def test_the_place_finder_reads_code_not_docstrings(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text('"""Mentions AllReduceOp."""\nfrom x import TransferOp\ny = a.WaveOp\n')
    assert {"TransferOp", "WaveOp"} <= _names_in_code(source)
    assert "AllReduceOp" not in _names_in_code(source)
    xdsl_ops = tmp_path / "n.py"
    xdsl_ops.write_text(
        "from xdsl.dialects import scf\nfrom xdsl.dialects.linalg import YieldOp\n"
        "from distir.ir.dialect import WaveOp\na = scf.YieldOp\nb = YieldOp\nc = d.ShiftOp\n"
    )
    # xDSL's ops of the same name are not dist's; any other attribute may be
    assert {"WaveOp", "ShiftOp"} <= _names_in_code(xdsl_ops)
    assert not {"scf", "YieldOp"} & _names_in_code(xdsl_ops)
    assert _place("ops.all_reduce.torch.ring") == "ops.all_reduce"
    assert _place("ops.broadcast.ir") == "ops.broadcast"
    assert _place("runtime.binding") == "runtime.binding"


def test_transpose_rules_are_declared_with_the_dist_ops() -> None:
    """A dist op's transpose rule is a method of its class (as JAX keeps a
    primitive's transpose in its block); the pass keeps only xDSL's local
    ops' rules, in a literal table."""
    from distir.ir.dialect import dist_ops
    from distir.ir.transpose import Transposable
    from distir.passes.vjp import LOCAL_RULES

    assert sorted(op.name for op in dist_ops() if issubclass(op, Transposable)) == [
        "dist.all_gather",
        "dist.all_reduce",
        "dist.assert_uniform",
        "dist.broadcast",
        "dist.gather",
        "dist.psum",
        "dist.pvary",
        "dist.recv",
        "dist.reduce",
        "dist.reduce_scatter",
        "dist.scatter",
        "dist.send",
        "dist.sendrecv",
        "dist.shift",
        "dist.transfer",
        "dist.variable_all_to_all",
    ]
    assert not [op for op in LOCAL_RULES if op.name.startswith("dist.")]
