"""Every dist op, in every syntax variant, prints back exactly as written, and
its generic form re-parses to the same module."""

from __future__ import annotations

from io import StringIO

import pytest
from xdsl.printer import Printer

from distir.ir import ReductionKind
from distir.ir.parsing import make_context, parse_module

# Each program is written exactly as xDSL prints it, so `str(parse(p)) == p`.
PROGRAMS: dict[str, str] = {
    "broadcast_static_root": """\
builtin.module {
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %y = dist.broadcast %x root 2 : tensor<4xf32>
    func.return %y : tensor<4xf32>
  }
}""",
    "broadcast_dynamic_root": """\
builtin.module {
  func.func @main(%x: tensor<4xf32>, %r: index) -> tensor<4xf32> {
    %y = dist.broadcast %x root %r : tensor<4xf32>
    func.return %y : tensor<4xf32>
  }
}""",
    "broadcast_group_and_attributes": """\
builtin.module {
  dist.group @tp [[0, 1], [2, 3]]
  func.func @main(%x: tensor<4xf32>, %r: index) -> (tensor<4xf32>, tensor<4xf32>) {
    %y = dist.broadcast %x root 1 group @tp {note = "static"} : tensor<4xf32>
    %z = dist.broadcast %x root %r group @tp : tensor<4xf32>
    func.return %y, %z : tensor<4xf32>, tensor<4xf32>
  }
}""",
    "rank_queries": """\
builtin.module {
  dist.group @row [[0, 1, 2, 3]]
  func.func @main() -> (index, index, index, index) {
    %r = dist.rank : index
    %p = dist.group_size : index
    %gr = dist.rank group @row : index
    %gp = dist.group_size group @row {tag = 7 : i64} : index
    func.return %r, %p, %gr, %gp : index, index, index, index
  }
}""",
    "all_reduce_native_kinds": "\n".join(
        [
            "builtin.module {",
            "  func.func @main(%x: tensor<8xi32>) -> tensor<8xi32> {",
            "    %r0 = dist.all_reduce sum %x : tensor<8xi32>",
            *(
                f"    %r{i + 1} = dist.all_reduce {k.value} %r{i} : tensor<8xi32>"
                for i, k in enumerate(list(ReductionKind)[1:])
            ),
            f"    func.return %r{len(ReductionKind) - 1} : tensor<8xi32>",
            "  }",
            "}",
        ]
    ),
    "all_reduce_native_group_commutative_algorithm": """\
builtin.module {
  dist.group @dp [[0, 2], [1, 3]]
  func.func @main(%x: tensor<2x8xf32>) -> tensor<2x8xf32> {
    %y = dist.all_reduce max %x group @dp commutative algorithm "ring" {tag = 1 : i64} : tensor<2x8xf32>
    func.return %y : tensor<2x8xf32>
  }
}""",
    "all_reduce_generic": """\
builtin.module {
  func.func @main(%x: tensor<4xi64>) -> tensor<4xi64> {
    %y = dist.all_reduce %x : tensor<4xi64> combine(%a, %b) {
      %c = arith.addi %a, %b : tensor<4xi64>
      dist.yield %c : tensor<4xi64>
    }
    func.return %y : tensor<4xi64>
  }
}""",
    "all_reduce_generic_extras_commutative_group": """\
builtin.module {
  dist.group @g [[0, 1]]
  func.func @main(%x: tensor<3x4xi64>, %m: tensor<3x4xi64>, %n: tensor<3x4xi64>) -> tensor<3x4xi64> {
    %y = dist.all_reduce %x, %m, %n group @g commutative algorithm "tree" : tensor<3x4xi64>, tensor<3x4xi64>, tensor<3x4xi64> combine(%a, %b, %mod, %unused) {
      %s = arith.addi %a, %b : tensor<3x4xi64>
      %r = arith.remui %s, %mod : tensor<3x4xi64>
      dist.yield %r : tensor<3x4xi64>
    }
    func.return %y : tensor<3x4xi64>
  }
}""",
    "ciphertext_default_basis": """\
builtin.module {
  func.func @main(%ct: tensor<2x3x16xi64>, %q: tensor<3xi64>) -> tensor<2x3x16xi64> {
    %y = dist.all_reduce_add_ciphertext %ct, %q : tensor<2x3x16xi64>, tensor<3xi64>
    func.return %y : tensor<2x3x16xi64>
  }
}""",
    "ciphertext_basis_bits_group": """\
builtin.module {
  dist.group @g [[0, 1, 2]]
  func.func @main(%ct: tensor<?x16xi64>, %q: tensor<?xi64>) -> tensor<?x16xi64> {
    %y = dist.all_reduce_add_ciphertext %ct, %q basis "P" max_modulus_bits 50 group @g : tensor<?x16xi64>, tensor<?xi64>
    %z = dist.all_reduce_add_ciphertext %y, %q max_modulus_bits 62 : tensor<?x16xi64>, tensor<?xi64>
    func.return %z : tensor<?x16xi64>
  }
}""",
    "assert_reduced": """\
builtin.module {
  func.func @main(%ct: tensor<2x3x16xi64>, %q: tensor<3xi64>) {
    dist.assert_reduced %ct, %q : tensor<2x3x16xi64>, tensor<3xi64>
    dist.assert_reduced %ct, %q max_modulus_bits 60 : tensor<2x3x16xi64>, tensor<3xi64>
    func.return
  }
}""",
    "assert_uniform": """\
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%q: tensor<3xi64>) {
    dist.assert_uniform %q : tensor<3xi64>
    dist.assert_uniform %q group @pairs : tensor<3xi64>
    func.return
  }
}""",
    "all_gather_even": """\
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%x: tensor<2x4xf32>) -> (tensor<?x4xf32>, tensor<2x8xf32>) {
    %y = dist.all_gather %x axis 0 : tensor<2x4xf32> -> tensor<?x4xf32>
    %z = dist.all_gather %x axis 1 group @pairs : tensor<2x4xf32> -> tensor<2x8xf32>
    func.return %y, %z : tensor<?x4xf32>, tensor<2x8xf32>
  }
}""",
    "all_gather_uneven": """\
builtin.module {
  func.func @main(%x: tensor<?x4xf32>, %c: tensor<4xi64>) -> tensor<?x4xf32> {
    %y = dist.all_gather %x counts(%c : tensor<4xi64>) axis 0 {tag = 3 : i64} : tensor<?x4xf32> -> tensor<?x4xf32>
    func.return %y : tensor<?x4xf32>
  }
}""",
    "pvary_psum": """\
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%x: tensor<4x6xf32> {dist.replicated}, %i: tensor<?xi64>) -> (tensor<4x6xf32>, tensor<?xi64>) {
    %y = dist.pvary %x : tensor<4x6xf32>
    %z = dist.psum %y group @pairs : tensor<4x6xf32>
    %w = dist.psum %i : tensor<?xi64>
    func.return %z, %w : tensor<4x6xf32>, tensor<?xi64>
  }
}""",
    "reduce_scatter": """\
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%x: tensor<4x6xf32>, %i: tensor<?x2xi64>) -> (tensor<?x6xf32>, tensor<4x3xf32>, tensor<?x2xi64>) {
    %y = dist.reduce_scatter sum %x axis 0 : tensor<4x6xf32> -> tensor<?x6xf32>
    %z = dist.reduce_scatter max %x axis 1 group @pairs : tensor<4x6xf32> -> tensor<4x3xf32>
    %w = dist.reduce_scatter bxor %i axis 0 {tag = 3 : i64} : tensor<?x2xi64> -> tensor<?x2xi64>
    func.return %y, %z, %w : tensor<?x6xf32>, tensor<4x3xf32>, tensor<?x2xi64>
  }
}""",
    "reduce_scatter_generic_uneven": """\
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%x: tensor<5x3xi64>, %q: tensor<3xi64>) -> (tensor<?x3xi64>, tensor<?x3xi64>) {
    %y = dist.reduce_scatter %x, %q counts [4, 1] axis 0 group @pairs commutative : tensor<5x3xi64> -> tensor<?x3xi64>, tensor<3xi64> combine(%lhs, %rhs, %m) {
      %s = arith.addi %lhs, %rhs : tensor<5x3xi64>
      dist.yield %s : tensor<5x3xi64>
    }
    %z = dist.reduce_scatter sum %x counts [2, 3] axis 0 : tensor<5x3xi64> -> tensor<?x3xi64>
    func.return %y, %z : tensor<?x3xi64>, tensor<?x3xi64>
  }
}""",
    "gather_scatter": """\
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%x: tensor<2x6xf32>, %c: tensor<2xi64>, %u: tensor<?x6xf32>) -> (tensor<4x6xf32>, tensor<2x?xf32>, tensor<?x6xf32>, tensor<?x6xf32>) {
    %y = dist.gather %x axis 0 root 1 group @pairs : tensor<2x6xf32> -> tensor<4x6xf32>
    %z = dist.scatter %x axis 1 root 0 {tag = 3 : i64} : tensor<2x6xf32> -> tensor<2x?xf32>
    %g = dist.gather %u counts(%c : tensor<2xi64>) axis 0 root 0 group @pairs : tensor<?x6xf32> -> tensor<?x6xf32>
    %s = dist.scatter %u counts(%c : tensor<2xi64>) axis 0 root 1 group @pairs : tensor<?x6xf32> -> tensor<?x6xf32>
    func.return %y, %z, %g, %s : tensor<4x6xf32>, tensor<2x?xf32>, tensor<?x6xf32>, tensor<?x6xf32>
  }
}""",
    "reduce": """\
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%x: tensor<4x6xf32>, %i: tensor<?x2xi64>) -> (tensor<4x6xf32>, tensor<?x2xi64>) {
    %y = dist.reduce max %x root 1 group @pairs : tensor<4x6xf32>
    %w = dist.reduce bxor %i root 0 {tag = 3 : i64} : tensor<?x2xi64>
    func.return %y, %w : tensor<4x6xf32>, tensor<?x2xi64>
  }
}""",
    "shift": """\
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%x: tensor<4x6xf32>, %i: tensor<?x2xi64>) -> (tensor<4x6xf32>, tensor<?x2xi64>) {
    %y = dist.shift %x offset 1 rotate group @pairs : tensor<4x6xf32>
    %w = dist.shift %i offset -2 {tag = 3 : i64} : tensor<?x2xi64>
    func.return %y, %w : tensor<4x6xf32>, tensor<?x2xi64>
  }
}""",
    "variable_all_to_all": """\
builtin.module {
  dist.group @ep [[0, 1, 2, 3]]
  func.func @main(%x: tensor<?x16xf32>, %c: tensor<4xi64>, %t: tensor<8x?xbf16>, %d: tensor<?xi32>) -> (tensor<?x16xf32>, tensor<4xi64>, tensor<8x?xbf16>, tensor<?xi32>) {
    %y, %rc = dist.variable_all_to_all %x, %c axis 0 group @ep : tensor<?x16xf32>, tensor<4xi64> -> tensor<?x16xf32>
    %u, %urc = dist.variable_all_to_all %t, %d axis 1 : tensor<8x?xbf16>, tensor<?xi32> -> tensor<8x?xbf16>
    func.return %y, %rc, %u, %urc : tensor<?x16xf32>, tensor<4xi64>, tensor<8x?xbf16>, tensor<?xi32>
  }
}""",
    "groups": """\
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  dist.group @odd [[1, 3, 5]]
  dist.group @ragged [[0], [1, 2, 3]] {note = "uneven"}
}""",
    "point_to_point": """\
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%x: tensor<4xf32>, %peer: index) -> (tensor<4xf32>, tensor<4xf32>, tensor<8xf32>, tensor<4xf32>) {
    dist.send %x to 1 : tensor<4xf32>
    dist.send %x to %peer group @pairs {tag = 1 : i64} : tensor<4xf32>
    %a = dist.recv from 0 : tensor<4xf32>
    %b = dist.recv from %peer group @pairs : tensor<4xf32>
    %c = dist.sendrecv %x to 1 from %peer : tensor<4xf32> -> tensor<8xf32>
    %d = dist.sendrecv %x to %peer from 0 group @pairs : tensor<4xf32> -> tensor<4xf32>
    func.return %a, %b, %c, %d : tensor<4xf32>, tensor<4xf32>, tensor<8xf32>, tensor<4xf32>
  }
}""",
    "waves": """\
builtin.module {
  func.func @main(%x: tensor<4xf32>, %y: tensor<8xi64>) -> (tensor<4xf32>, tensor<8xi64>) {
    %s, %t = dist.wave {
      %0 = dist.all_reduce sum %x : tensor<4xf32>
      %1 = dist.broadcast %y root 0 : tensor<8xi64>
      dist.send %x to 1 : tensor<4xf32>
      dist.yield %0, %1 : tensor<4xf32>, tensor<8xi64>
    } : tensor<4xf32>, tensor<8xi64>
    dist.wave {
      dist.send %x to 0 : tensor<4xf32>
      dist.yield
    }
    func.return %s, %t : tensor<4xf32>, tensor<8xi64>
  }
}""",
    "meshes_and_transfers": """\
builtin.module {
  dist.mesh @train [2, 2] ranks [0, 1, 2, 3]
  dist.mesh @serve [4] ranks [4, 5, 6, 7] {note = "inference"}
  func.func @main(%x: tensor<2x4xf32>, %p: tensor<4x8xf32>) -> (tensor<2x8xf32>, tensor<1x8xf32>) {
    %y = dist.transfer %x from @train [0, 1] to @serve [*, 0] global [4, 8] : tensor<2x4xf32> -> tensor<2x8xf32>
    %z = dist.transfer %p from @train [*, 1] partial [0] to @serve [0, *] global [4, 8] {tag = 2 : i64} : tensor<4x8xf32> -> tensor<1x8xf32>
    func.return %y, %z : tensor<2x8xf32>, tensor<1x8xf32>
  }
}""",
}


def _generic(module) -> str:
    out = StringIO()
    Printer(stream=out, print_generic_format=True).print_op(module)
    return out.getvalue()


@pytest.mark.parametrize("name", PROGRAMS)
def test_custom_form_prints_back_identically(name: str) -> None:
    text = PROGRAMS[name]
    module = parse_module(text)
    module.verify()
    assert str(module) == text


@pytest.mark.parametrize("name", PROGRAMS)
def test_generic_form_reparses_to_the_same_module(name: str) -> None:
    module = parse_module(PROGRAMS[name])
    generic = _generic(module)
    assert '"dist.' in generic
    again = parse_module(generic, ctx=make_context())
    again.verify()
    assert again.is_structurally_equivalent(module)
    assert str(again) == str(module)
    assert _generic(again) == generic


def test_every_reduction_kind_is_covered() -> None:
    text = PROGRAMS["all_reduce_native_kinds"]
    assert all(f"dist.all_reduce {k.value} " in text for k in ReductionKind)
