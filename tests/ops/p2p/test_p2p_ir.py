"""The point-to-point, wave, mesh and transfer ops: syntax and verifiers."""

from __future__ import annotations

import io

import pytest
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from distir.ir.parsing import parse_module

PROGRAM = """\
builtin.module {
  dist.mesh @train [2, 2] ranks [0, 1, 2, 3]
  dist.mesh @infer [3] ranks [4, 5, 6]
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%x: tensor<4xf32>, %w: tensor<?x?xf32>, %p: index) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<?x?xf32>) {
    dist.send %x to 1 : tensor<4xf32>
    dist.send %x to %p group @pairs : tensor<4xf32>
    %r = dist.recv from 0 : tensor<4xf32>
    %s = dist.sendrecv %x to %p from 1 : tensor<4xf32> -> tensor<4xf32>
    %a, %b = dist.wave {
      %0 = dist.all_reduce sum %x : tensor<4xf32>
      %1 = dist.broadcast %x root 0 : tensor<4xf32>
      dist.yield %0, %1 : tensor<4xf32>, tensor<4xf32>
    } : tensor<4xf32>, tensor<4xf32>
    %t = dist.transfer %w from @train [0, *] partial [1] to @infer [*, 0] global [4, 6] : tensor<?x?xf32> -> tensor<?x?xf32>
    func.return %r, %s, %a, %t : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<?x?xf32>
  }
}"""


def test_every_new_op_round_trips_in_custom_and_generic_form():
    module = parse_module(PROGRAM)
    module.verify()
    assert str(module) == PROGRAM
    buffer = io.StringIO()
    Printer(stream=buffer, print_generic_format=True).print_op(module)
    again = parse_module(buffer.getvalue())
    assert again.is_structurally_equivalent(module)
    assert str(again) == PROGRAM


def _module(body: str, decls: str = "") -> str:
    return f"""{decls}
func.func @main(%x: tensor<4xf32>, %w: tensor<?x?xf32>) -> tensor<4xf32> {{
{body}
  func.return %x : tensor<4xf32>
}}"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            _module("""  %a, %b = dist.wave {
    %0 = dist.all_reduce sum %x : tensor<4xf32>
    %1 = dist.all_reduce sum %0 : tensor<4xf32>
    dist.yield %0, %1 : tensor<4xf32>, tensor<4xf32>
  } : tensor<4xf32>, tensor<4xf32>"""),
            "reads the result of another op of the same wave",
        ),
        (
            _module("""  %a = dist.wave {
    %0 = arith.addf %x, %x : tensor<4xf32>
    dist.yield %0 : tensor<4xf32>
  } : tensor<4xf32>"""),
            "may hold only collectives and point-to-point ops, found 'arith.addf'",
        ),
        (
            _module("""  %a = dist.wave {
    %0 = dist.all_reduce sum %x : tensor<4xf32>
    dist.yield %0 : tensor<4xf32>
  } : tensor<8xf32>"""),
            "must yield values of its result types",
        ),
        (_module("", "dist.mesh @m [2, 2] ranks [0, 1, 2]"), "needs 4 ranks, got 3"),
        (_module("", "dist.mesh @m [2] ranks [1, 1]"), "ranks must be distinct"),
        (
            _module(
                "  %t = dist.transfer %w from @m [0, 0] to @m [*, *] global [4, 4] "
                ": tensor<?x?xf32> -> tensor<?x?xf32>",
                "dist.mesh @m [2, 2] ranks [0, 1, 2, 3]",
            ),
            "shards two dims over one mesh axis",
        ),
        (
            _module(
                "  %t = dist.transfer %w from @m [0, *] partial [0] to @m [*, *] global [4, 4] "
                ": tensor<?x?xf32> -> tensor<?x?xf32>",
                "dist.mesh @m [2, 2] ranks [0, 1, 2, 3]",
            ),
            "partial axis 0 must be a mesh axis of @m that shards no dim",
        ),
        (
            _module(
                "  %t = dist.transfer %w from @m [2, *] to @m [*, *] global [4, 4] "
                ": tensor<?x?xf32> -> tensor<?x?xf32>",
                "dist.mesh @m [2, 2] ranks [0, 1, 2, 3]",
            ),
            "names a mesh axis that mesh @m (rank 2) lacks",
        ),
        (
            _module(
                "  %t = dist.transfer %w from @nope [0, *] to @m [*, *] global [4, 4] "
                ": tensor<?x?xf32> -> tensor<?x?xf32>",
                "dist.mesh @m [2, 2] ranks [0, 1, 2, 3]",
            ),
            "names mesh @nope but no `dist.mesh` of that name",
        ),
        (
            _module(
                "  %t = dist.transfer %w from @m [0] to @m [*, *] global [4, 4] "
                ": tensor<?x?xf32> -> tensor<?x?xf32>",
                "dist.mesh @m [2, 2] ranks [0, 1, 2, 3]",
            ),
            "source layout has 1 entries for a rank-2 tensor",
        ),
        (
            _module("  dist.send %x to 2 group @g : tensor<4xf32>", "dist.group @g [[0, 1]]"),
            "destination 2 is outside group @g of size 2",
        ),
    ],
)
def test_invalid_programs_name_the_broken_rule(text: str, message: str):
    module = parse_module(text, "bad.mlir")
    with pytest.raises(VerifyException, match=message.replace("(", r"\(").replace(")", r"\)")):
        module.verify()
