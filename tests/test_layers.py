"""The package's layers import one way, as its folders say:

    ir <- passes;  ir <- interpreters <- backends <- runtime <- cli
    (he: modular.py is torch-free, for passes; rns, seal, ntt and threshold's
    arithmetic sit beside backends; aggregation, the threshold protocol made
    of distir programs, above runtime)

`ir/` and `passes/` never import torch (distir-opt and other IR-only tools
stay light); no module imports a higher layer, or a private name of another
module; the import graph has no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "distir"

#: layer -> rank; a module may import modules of its own rank or lower
LAYERS = {
    "durations": 0,
    "errors": 1, "ir": 1, "he.modular": 1,
    "passes": 2,
    "interpreters": 3,
    "he": 4, "backends": 4,
    "runtime": 5, "": 5,  # the package facade (distir.compile, ...) is the runtime's
    "aggregation": 6, "ddp": 6, "bench": 6, "cli": 7,
}  # fmt: skip
TORCH_FREE = ("ir", "passes", "he.modular", "errors", "durations")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(p for p in parts if p != "__init__")
        found[name] = path
    return found


MODULES = _modules()


def _layer(module: str) -> str:
    for layer in sorted(LAYERS, key=len, reverse=True):
        if layer and (module == layer or module.startswith(layer + ".")):
            return layer
    return ""


def _imports(path: Path) -> list[tuple[str, list[str], bool]]:
    """(module, imported names, at top level) of every import of distir or torch."""
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
    return module[len("distir."):] if module.startswith("distir.") else None


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


def test_the_import_graph_has_no_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        edges = set()
        for module, names, top in _imports(path):
            target = _internal(module)
            if target is None or not top:  # deferred imports break no import-time cycle
                continue
            for candidate in (*(f"{target}.{n}" for n in names), target):
                if candidate in MODULES:
                    edges.add(candidate)
                    break
        graph[name] = edges - {name}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for succ in graph.get(node, ()):
            if state.get(succ) == 1:
                cycle = path[path.index(succ):] + [succ] if succ in path else [node, succ]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if succ not in state:
                visit(succ, [*path, succ])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
