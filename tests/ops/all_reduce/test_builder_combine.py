"""The builder's comparisons, selection, casts and math: what they build
prints as the MLIR a person would write, runs as the text does, errors are
`BuilderError`s naming the call and its line, and every built op carries the
Python line that built it."""

from __future__ import annotations

import inspect

import pytest
import torch

import distir
from distir.errors import DistirError
from distir.ir import builder as b
from distir.ir.builder import BuilderError
from distir.ir.parsing import format_location, parse_module

F4 = b.tensor_type("f32", [4])


def _abs_max(x, y):
    x_wins = b.cmpf("oge", b.math("absf", x), b.math("absf", y))
    return b.select(x_wins, x, y)


def test_a_built_abs_max_prints_as_mlir_and_runs() -> None:
    # not commutative: a tie of x and -x keeps the left one (the verifier
    # refutes the marker on (2, -2)), so a rank-order fold
    module = b.build_program(lambda x: b.all_reduce(x, combine=_abs_max), [F4])
    text = str(module)
    assert "%5 = arith.cmpf oge, %3, %4 : tensor<4xf32>" in text
    assert "arith.select %5, %1, %2 : tensor<4xi1>, tensor<4xf32>" in text
    assert str(parse_module(text)) == text
    xs = [torch.tensor([1.0, -3.0, 2.0, 0.0]), torch.tensor([-2.0, 1.0, 1.0, 5.0])]
    for got in distir.compile(module).simulate([[x] for x in xs]):
        assert got.tolist() == [-2.0, -3.0, 2.0, 5.0]


def test_casts_and_comparisons_keep_the_shape() -> None:
    def body(x):
        i = b.cast("fptosi", x, "i32")
        wide = b.cast("extsi", i, "i64")
        back = b.cast("sitofp", wide, "f64")
        small = b.cmpi("slt", i, b.constant_tensor(0, "i32", [4]))
        return back, small, b.math("exp", x), b.math("fma", x, x, x)

    module = b.build_program(body, [F4])
    results = [str(t) for t in module.ops.last.function_type.outputs.data]
    assert results == ["tensor<4xf64>", "tensor<4xi1>", "tensor<4xf32>", "tensor<4xf32>"]
    x = torch.tensor([-1.5, 0.5, 2.7, -0.2])
    ((back, small, e, f),) = distir.compile(module).simulate([[x]])
    assert back.tolist() == [-1.0, 0.0, 2.0, 0.0]
    assert small.tolist() == [True, False, False, False]
    assert torch.allclose(e, x.exp()) and torch.allclose(f, x * x + x)


def _line_of(fragment: str) -> int:
    lines, start = inspect.getsourcelines(test_built_ops_carry_the_line_that_built_them)
    return start + next(i for i, line in enumerate(lines) if fragment in line)


def test_built_ops_carry_the_line_that_built_them() -> None:
    def body(x):
        doubled = b.arith("addf", x, x)  # the addf line
        return b.all_reduce(doubled, "sum")  # the all_reduce line

    module = b.build_program(body, [F4])
    ops = {op.name: op for op in module.walk()}
    here = __file__
    assert format_location(ops["arith.addf"]) == f"{here}:{_line_of('the addf line')}:19"
    assert format_location(ops["dist.all_reduce"]).startswith(
        f"{here}:{_line_of('the all_reduce line')}:"
    )
    assert format_location(ops["func.func"]).startswith(f"{here}:")


@pytest.mark.parametrize(
    ("build", "call", "message"),
    [
        (lambda x: b.arith("addi", x, x), "arith('addi', tensor<4xf32>, tensor<4xf32>)",
         "arith.addi takes integer operands, got tensor<4xf32>; for f32 use arith('addf', ...)"),
        (lambda x: b.cmpf("oggt", x, x), "cmpf('oggt', tensor<4xf32>, tensor<4xf32>)",
         "no cmpf predicate 'oggt'; the predicates are false, oeq, ogt"),
        (lambda x: b.arith("cmpf", x, x), "arith('cmpf', tensor<4xf32>, tensor<4xf32>)",
         "build it with cmpf(...)"),
        (lambda x: b.cast("sitofp", x, "f32"), "cast('sitofp', tensor<4xf32>, 'f32')",
         "should be of base attribute integer_type"),
        (lambda x: b.cast("sitofp", x, "f33"), "cast('sitofp', tensor<4xf32>, 'f33')",
         "no element type 'f33'"),
        (lambda x: b.select(x, x, x), "select(tensor<4xf32>, tensor<4xf32>, tensor<4xf32>)",
         "Expected attribute i1 but got f32"),
        (lambda x: b.math("expp", x), "math('expp', tensor<4xf32>)", "no math op 'expp'"),
        (lambda x: b.arith("addf", x, b.cast("extf", x, "f64")),
         "arith('addf', tensor<4xf32>, tensor<4xf64>)", "needs operands of one type"),
    ],
)  # fmt: skip
def test_bad_builder_calls_are_builder_errors_naming_the_call(build, call, message) -> None:
    with pytest.raises(BuilderError) as info:
        b.build_program(build, [F4])
    assert isinstance(info.value, DistirError)
    text = str(info.value)
    assert text.startswith(f"{call} at {__file__}:"), text
    assert message in text and "\n" not in text


def test_is_generic_tells_a_combine_region_from_a_native_kind() -> None:
    from distir.ir.dialect import AllReduceOp

    generic = b.build_program(lambda x: b.all_reduce(x, combine=_abs_max), [F4])
    native = b.build_program(lambda x: b.all_reduce(x, "max"), [F4])
    found = [
        op.is_generic for m in (generic, native) for op in m.walk() if isinstance(op, AllReduceOp)
    ]
    assert found == [True, False]
