"""Every distir pass on every example program leaves IR that verifies and
that prints and parses back to the same text, in custom and generic syntax.

Each pass runs with its defaults and, where its options change what it
does, with options that make it rewrite more (the examples declare no group
sizes, so `defer-modular-reduction` needs `max-group-size` to act at all).
"""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from xdsl.printer import Printer

from distir.errors import NotDifferentiable
from distir.ir.parsing import make_context, parse_module
from distir.passes import DISTIR_PASSES, parse_pipeline

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.mlir"))

# Pipeline specs per pass; a pass not named here runs with its defaults. A
# pass with a required option must be named (else the run below fails with
# "needs option").
OPTIONS: dict[str, list[str]] = {
    "defer-modular-reduction": ["", "{max-group-size=8 remarks=true}"],
    "bucket-all-reduces": ["", "{max-op-bytes=1048576 min-ops=2}"],
    "select-all-reduce-algorithm": ["", "{commutative=recursive-doubling}"],
    "print-transfer-maps": ["", "{to-stderr=true}"],
}
#: (pass, example) a pass refuses by design, naming the op (vjp: the generic
#: combines have no derivative, nor have shard ops before their conversion;
#: tests/autodiff checks the message)
REFUSED = {("vjp", "custom_combine"), ("vjp", "abs_max"), ("vjp", "shard_grid")}
CASES = [
    pytest.param(name + spec, path, id=f"{name}{spec}-{path.stem}")
    for name in DISTIR_PASSES
    for spec in OPTIONS.get(name, [""])
    for path in EXAMPLES
]


def _generic(module) -> str:
    out = StringIO()
    Printer(stream=out, print_generic_format=True).print_op(module)
    return out.getvalue()


def test_every_pass_and_every_example_is_covered() -> None:
    assert len(EXAMPLES) >= 10
    assert {p.values[0].split("{")[0] for p in CASES} == set(DISTIR_PASSES)
    assert set(OPTIONS) <= set(DISTIR_PASSES)


@pytest.mark.parametrize(("pipeline", "path"), CASES)
def test_pass_output_verifies_and_round_trips(pipeline: str, path: Path) -> None:
    ctx = make_context()
    module = parse_module(path.read_text(), str(path), ctx)
    module.verify()
    if (pipeline.split("{")[0], path.stem) in REFUSED:
        with pytest.raises(NotDifferentiable):
            parse_pipeline(pipeline).apply(ctx, module)
        return
    parse_pipeline(pipeline).apply(ctx, module)
    module.verify()
    printed = str(module)
    again = parse_module(printed, "printed.mlir")
    again.verify()
    assert str(again) == printed
    from_generic = parse_module(_generic(module), "generic.mlir")
    from_generic.verify()
    assert str(from_generic) == printed
