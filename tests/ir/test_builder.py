"""Programs built with `distir.ir.builder` verify and print as the text a
person would write."""

from __future__ import annotations

import pytest
from xdsl.dialects import arith

from distir.ir import builder as b
from distir.ir.parsing import parse_module


def _check(module, expected: str) -> None:
    module.verify()
    assert str(module) == expected
    # What the builder makes is what the parser makes of its text.
    assert parse_module(expected).is_structurally_equivalent(module)


def test_tensor_type() -> None:
    assert str(b.tensor_type("f32", [None, 4])) == "tensor<?x4xf32>"
    assert str(b.tensor_type("i64", [2, 3, 16])) == "tensor<2x3x16xi64>"


def test_rank_queries_and_broadcast() -> None:
    def body(x):
        r = b.rank()
        p = b.group_size("pairs")
        static = b.broadcast(x, 1, group="pairs")
        dynamic = b.broadcast(static, r)
        return dynamic, p

    module = b.build_program(body, [b.tensor_type("f32", [4])], groups={"pairs": [[0, 1], [2, 3]]})
    _check(
        module,
        """\
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%arg0: tensor<4xf32>) -> (tensor<4xf32>, index) {
    %0 = dist.rank : index
    %1 = dist.group_size group @pairs : index
    %2 = dist.broadcast %arg0 root 1 group @pairs : tensor<4xf32>
    %3 = dist.broadcast %2 root %0 : tensor<4xf32>
    func.return %3, %1 : tensor<4xf32>, index
  }
}""",
    )


@pytest.mark.parametrize("kind", ["sum", "prod", "min", "max", "band", "bor", "bxor"])
def test_native_all_reduce(kind: str) -> None:
    module = b.build_program(lambda x: b.all_reduce(x, kind), [b.tensor_type("i32", [8])])
    _check(
        module,
        f"""\
builtin.module {{
  func.func @main(%arg0: tensor<8xi32>) -> tensor<8xi32> {{
    %0 = dist.all_reduce {kind} %arg0 : tensor<8xi32>
    func.return %0 : tensor<8xi32>
  }}
}}""",
    )


def test_generic_all_reduce_with_extra_and_commutative() -> None:
    def body(x, m):
        def combine(lhs, rhs, mod):
            return arith.RemUIOp(arith.AddiOp(lhs, rhs), mod)

        return b.all_reduce(x, combine=combine, extras=[m], commutative=True, group="g")

    t = b.tensor_type("i64", [4])
    module = b.build_program(body, [t, t], groups={"g": [[0, 1]]})
    _check(
        module,
        """\
builtin.module {
  dist.group @g [[0, 1]]
  func.func @main(%arg0: tensor<4xi64>, %arg1: tensor<4xi64>) -> tensor<4xi64> {
    %0 = dist.all_reduce %arg0, %arg1 group @g commutative : tensor<4xi64>, tensor<4xi64> combine(%1, %2, %3) {
      %4 = arith.addi %1, %2 : tensor<4xi64>
      %5 = arith.remui %4, %3 : tensor<4xi64>
      dist.yield %5 : tensor<4xi64>
    }
    func.return %0 : tensor<4xi64>
  }
}""",
    )


def test_all_reduce_needs_exactly_one_of_kind_and_combine() -> None:
    t = b.tensor_type("f32", [4])
    with pytest.raises(ValueError, match="exactly one of"):
        b.build_program(lambda x: b.all_reduce(x), [t])
    with pytest.raises(ValueError, match="exactly one of"):
        b.build_program(lambda x: b.all_reduce(x, "sum", combine=lambda p, q: p), [t])


def test_ciphertext_add() -> None:
    def body(ct, q):
        return b.all_reduce_add_ciphertext(ct, q, modulus_basis="P", max_modulus_bits=60)

    module = b.build_program(body, [b.tensor_type("i64", [2, 3, 16]), b.tensor_type("i64", [3])])
    _check(
        module,
        """\
builtin.module {
  func.func @main(%arg0: tensor<2x3x16xi64>, %arg1: tensor<3xi64>) -> tensor<2x3x16xi64> {
    %0 = dist.all_reduce_add_ciphertext %arg0, %arg1 basis "P" max_modulus_bits 60 : tensor<2x3x16xi64>, tensor<3xi64>
    func.return %0 : tensor<2x3x16xi64>
  }
}""",
    )


def test_even_and_uneven_all_gather() -> None:
    def body(x, counts):
        even = b.all_gather(x, axis=1)
        sized = b.all_gather(x, result_type=b.tensor_type("f32", [8, 4]), group="pairs")
        uneven = b.all_gather(x, counts=counts)
        return even, sized, uneven

    module = b.build_program(
        body,
        [b.tensor_type("f32", [4, 4]), b.tensor_type("i64", [2])],
        groups={"pairs": [[0, 1], [2, 3]]},
    )
    _check(
        module,
        """\
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%arg0: tensor<4x4xf32>, %arg1: tensor<2xi64>) -> (tensor<4x?xf32>, tensor<8x4xf32>, tensor<?x4xf32>) {
    %0 = dist.all_gather %arg0 axis 1 : tensor<4x4xf32> -> tensor<4x?xf32>
    %1 = dist.all_gather %arg0 axis 0 group @pairs : tensor<4x4xf32> -> tensor<8x4xf32>
    %2 = dist.all_gather %arg0 counts(%arg1 : tensor<2xi64>) axis 0 : tensor<4x4xf32> -> tensor<?x4xf32>
    func.return %0, %1, %2 : tensor<4x?xf32>, tensor<8x4xf32>, tensor<?x4xf32>
  }
}""",
    )


def test_variable_all_to_all() -> None:
    def body(x, counts):
        y, recv = b.variable_all_to_all(x, counts, group="ep")
        return y, recv

    module = b.build_program(
        body,
        [b.tensor_type("f32", [None, 16]), b.tensor_type("i64", [4])],
        groups={"ep": [[0, 1, 2, 3]]},
    )
    _check(
        module,
        """\
builtin.module {
  dist.group @ep [[0, 1, 2, 3]]
  func.func @main(%arg0: tensor<?x16xf32>, %arg1: tensor<4xi64>) -> (tensor<?x16xf32>, tensor<4xi64>) {
    %0, %1 = dist.variable_all_to_all %arg0, %arg1 axis 0 group @ep : tensor<?x16xf32>, tensor<4xi64> -> tensor<?x16xf32>
    func.return %0, %1 : tensor<?x16xf32>, tensor<4xi64>
  }
}""",
    )


def test_build_program_verifies_what_it_builds() -> None:
    from distir.errors import DistirError

    with pytest.raises(DistirError, match="needs an integer element type") as info:
        b.build_program(lambda x: b.all_reduce(x, "bor"), [b.tensor_type("f32", [4])])
    assert f"'dist.all_reduce' at {__file__}:" in str(info.value)


def test_program_without_results_and_custom_name() -> None:
    module = b.build_program(lambda: None, [], name="noop")
    _check(
        module,
        """\
builtin.module {
  func.func @noop() {
    func.return
  }
}""",
    )


def test_point_to_point_with_static_and_computed_peers() -> None:
    """A ring shift: the next rank is computed from the rank and the size."""

    def body(x):
        one = b.constant_index(1)
        nxt = b.arith("remui", b.arith("addi", b.rank(), one), b.group_size())
        shifted = b.sendrecv(x, nxt, 0)
        wider = b.sendrecv(x, 1, nxt, result_type=b.tensor_type("f32", [8]), group="pairs")
        b.send(shifted, 1, group="pairs")
        b.send(shifted, nxt)
        got = b.recv(0, b.tensor_type("f32", [4]), group="pairs")
        from_next = b.recv(nxt, b.tensor_type("f32", [4]))
        return shifted, wider, got, from_next

    module = b.build_program(body, [b.tensor_type("f32", [4])], groups={"pairs": [[0, 1], [2, 3]]})
    _check(
        module,
        """\
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%arg0: tensor<4xf32>) -> (tensor<4xf32>, tensor<8xf32>, tensor<4xf32>, tensor<4xf32>) {
    %0 = arith.constant 1 : index
    %1 = dist.rank : index
    %2 = arith.addi %1, %0 : index
    %3 = dist.group_size : index
    %4 = arith.remui %2, %3 : index
    %5 = dist.sendrecv %arg0 to %4 from 0 : tensor<4xf32> -> tensor<4xf32>
    %6 = dist.sendrecv %arg0 to 1 from %4 group @pairs : tensor<4xf32> -> tensor<8xf32>
    dist.send %5 to 1 group @pairs : tensor<4xf32>
    dist.send %5 to %4 : tensor<4xf32>
    %7 = dist.recv from 0 group @pairs : tensor<4xf32>
    %8 = dist.recv from %4 : tensor<4xf32>
    func.return %5, %6, %7, %8 : tensor<4xf32>, tensor<8xf32>, tensor<4xf32>, tensor<4xf32>
  }
}""",
    )


def test_wave_yields_what_its_body_returns() -> None:
    def body(g1, g2):
        s1, s2 = b.wave(lambda: (b.all_reduce(g1, "sum"), b.all_reduce(g2, "sum")))
        (root,) = b.wave(lambda: b.broadcast(g1, 0))
        assert b.wave(lambda: b.send(g2, 1)) == ()
        return s1, s2, root

    module = b.build_program(body, [b.tensor_type("f32", [16]), b.tensor_type("f32", [4, 8])])
    _check(
        module,
        """\
builtin.module {
  func.func @main(%arg0: tensor<16xf32>, %arg1: tensor<4x8xf32>) -> (tensor<16xf32>, tensor<4x8xf32>, tensor<16xf32>) {
    %0, %1 = dist.wave {
      %2 = dist.all_reduce sum %arg0 : tensor<16xf32>
      %3 = dist.all_reduce sum %arg1 : tensor<4x8xf32>
      dist.yield %2, %3 : tensor<16xf32>, tensor<4x8xf32>
    } : tensor<16xf32>, tensor<4x8xf32>
    %4 = dist.wave {
      %5 = dist.broadcast %arg0 root 0 : tensor<16xf32>
      dist.yield %5 : tensor<16xf32>
    } : tensor<16xf32>
    dist.wave {
      dist.send %arg1 to 1 : tensor<4x8xf32>
      dist.yield
    }
    func.return %0, %1, %4 : tensor<16xf32>, tensor<4x8xf32>, tensor<16xf32>
  }
}""",
    )


def test_meshes_and_transfers() -> None:
    def body(w):
        to_columns = b.transfer(
            w,
            source_mesh="train",
            source_layout=[0, None],
            source_partial=[1],
            dest_mesh="infer",
            dest_layout=[None, 0],
            global_shape=[4, 6],
        )
        back = b.transfer(
            to_columns,
            source_mesh="infer",
            source_layout=[None, 0],
            dest_mesh="train",
            dest_layout=[None, None],
            global_shape=[4, 6],
            result_type=b.tensor_type("f32", [4, 6]),
        )
        return to_columns, back

    module = b.build_program(
        body,
        [b.tensor_type("f32", [None, None])],
        meshes={"train": ([2, 2], [0, 1, 2, 3]), "infer": ([3], [3, 4, 5])},
    )
    _check(
        module,
        """\
builtin.module {
  dist.mesh @train [2, 2] ranks [0, 1, 2, 3]
  dist.mesh @infer [3] ranks [3, 4, 5]
  func.func @main(%arg0: tensor<?x?xf32>) -> (tensor<?x?xf32>, tensor<4x6xf32>) {
    %0 = dist.transfer %arg0 from @train [0, *] partial [1] to @infer [*, 0] global [4, 6] : tensor<?x?xf32> -> tensor<?x?xf32>
    %1 = dist.transfer %0 from @infer [*, 0] to @train [*, *] global [4, 6] : tensor<?x?xf32> -> tensor<4x6xf32>
    func.return %0, %1 : tensor<?x?xf32>, tensor<4x6xf32>
  }
}""",
    )


def test_a_transfer_between_undeclared_meshes_is_rejected() -> None:
    from distir.errors import DistirError

    def body(w):
        return b.transfer(
            w,
            source_mesh="train",
            source_layout=[0],
            dest_mesh="train",
            dest_layout=[None],
            global_shape=[4],
        )

    with pytest.raises(DistirError, match="no `dist.mesh` of that name"):
        b.build_program(body, [b.tensor_type("f32", [None])])


def test_declarations_come_in_the_order_given() -> None:
    module = b.build_program(
        lambda: None,
        [],
        groups={"rows": [[0, 1], [2, 3]], "cols": [[0, 2], [1, 3]]},
        meshes={"grid": ([2, 2], [0, 1, 2, 3])},
    )
    assert [op.name for op in module.ops] == ["dist.group", "dist.group", "dist.mesh", "func.func"]
    assert str(module).splitlines()[1:4] == [
        "  dist.group @rows [[0, 1], [2, 3]]",
        "  dist.group @cols [[0, 2], [1, 3]]",
        "  dist.mesh @grid [2, 2] ranks [0, 1, 2, 3]",
    ]


def test_assert_reduced_and_constants() -> None:
    def body(ct):
        q = b.constant_tensor([97, 101, 103])
        b.assert_reduced(ct, q)
        b.assert_reduced(ct, q, max_modulus_bits=7)
        halves = b.constant_tensor(0.5, "f32", [2])
        grid = b.constant_tensor([1, 2, 3, 4, 5, 6], "i32", [2, 3])
        return halves, grid, b.constant_index(3)

    module = b.build_program(body, [b.tensor_type("i64", [3, 8])])
    _check(
        module,
        """\
builtin.module {
  func.func @main(%arg0: tensor<3x8xi64>) -> (tensor<2xf32>, tensor<2x3xi32>, index) {
    %0 = arith.constant dense<[97, 101, 103]> : tensor<3xi64>
    dist.assert_reduced %arg0, %0 : tensor<3x8xi64>, tensor<3xi64>
    dist.assert_reduced %arg0, %0 max_modulus_bits 7 : tensor<3x8xi64>, tensor<3xi64>
    %1 = arith.constant dense<5.000000e-01> : tensor<2xf32>
    %2 = arith.constant dense<[[1, 2, 3], [4, 5, 6]]> : tensor<2x3xi32>
    %3 = arith.constant 3 : index
    func.return %1, %2, %3 : tensor<2xf32>, tensor<2x3xi32>, index
  }
}""",
    )


def test_a_generic_combine_needs_no_xdsl_import() -> None:
    def body(x, m):
        return b.all_reduce(
            x,
            combine=lambda lhs, rhs, mod: b.arith("remui", b.arith("addi", lhs, rhs), mod),
            extras=[m],
            commutative=True,
        )

    t = b.tensor_type("i64", [4])
    module = b.build_program(body, [t, t])
    _check(
        module,
        """\
builtin.module {
  func.func @main(%arg0: tensor<4xi64>, %arg1: tensor<4xi64>) -> tensor<4xi64> {
    %0 = dist.all_reduce %arg0, %arg1 commutative : tensor<4xi64>, tensor<4xi64> combine(%1, %2, %3) {
      %4 = arith.addi %1, %2 : tensor<4xi64>
      %5 = arith.remui %4, %3 : tensor<4xi64>
      dist.yield %5 : tensor<4xi64>
    }
    func.return %0 : tensor<4xi64>
  }
}""",
    )


def test_reduce_scatter_helper() -> None:
    def body(x):
        sized = b.reduce_scatter(x, result_type=b.tensor_type("f32", [2, 4]), group="pairs")
        return sized, b.reduce_scatter(x, "max", axis=1)

    module = b.build_program(
        body, [b.tensor_type("f32", [4, 4])], groups={"pairs": [[0, 1], [2, 3]]}
    )
    module.verify()
    text = str(module)
    assert (
        "dist.reduce_scatter sum %arg0 axis 0 group @pairs : tensor<4x4xf32> -> tensor<2x4xf32>"
        in text
    )
    assert "dist.reduce_scatter max %arg0 axis 1 : tensor<4x4xf32> -> tensor<4x?xf32>" in text


def test_reduce_scatter_helper_takes_counts_and_a_combine() -> None:
    def body(x):
        uneven = b.reduce_scatter(x, "sum", counts=[3, 1])
        mine = b.reduce_scatter(x, None, counts=[1, 3], commutative=True,
                                combine=lambda p, q: b.arith("maximumf", p, q))  # fmt: skip
        return uneven, mine

    module = b.build_program(body, [b.tensor_type("f32", [4, 4])])
    module.verify()
    text = str(module)
    assert ("dist.reduce_scatter sum %arg0 counts [3, 1] axis 0 : tensor<4x4xf32> -> "
            "tensor<?x4xf32>") in text  # fmt: skip
    assert "dist.reduce_scatter %arg0 counts [1, 3] axis 0 commutative" in text
    assert "arith.maximumf" in text
    with pytest.raises(ValueError, match="needs a `kind` or a `combine`"):
        b.build_program(lambda x: b.reduce_scatter(x, None), [b.tensor_type("f32", [4])])
def test_gather_and_scatter_helpers() -> None:
    def body(x, counts):
        sized = b.gather(x, 1, result_type=b.tensor_type("f32", [8, 4]), group="pairs")
        return sized, b.scatter(x, axis=1), b.gather(x, 0, counts=counts)

    module = b.build_program(
        body,
        [b.tensor_type("f32", [4, 4]), b.tensor_type("i64", [2])],
        groups={"pairs": [[0, 1], [2, 3]]},
    )
    module.verify()
    text = str(module)
    assert (
        "dist.gather %arg0 axis 0 root 1 group @pairs : tensor<4x4xf32> -> tensor<8x4xf32>"
        in text
    )
    assert "dist.scatter %arg0 axis 1 root 0 : tensor<4x4xf32> -> tensor<4x?xf32>" in text
    assert (
        "dist.gather %arg0 counts(%arg1 : tensor<2xi64>) axis 0 root 0 : "
        "tensor<4x4xf32> -> tensor<?x4xf32>" in text
    )


def test_reduce_helper() -> None:
    module = b.build_program(
        lambda x: (b.reduce(x), b.reduce(x, "max", 1, group="pairs")),
        [b.tensor_type("f32", [4])],
        groups={"pairs": [[0, 1], [2, 3]]},
    )
    module.verify()
    text = str(module)
    assert "dist.reduce sum %arg0 root 0 : tensor<4xf32>" in text
    assert "dist.reduce max %arg0 root 1 group @pairs : tensor<4xf32>" in text
    with pytest.raises(b.BuilderError, match="mean"):
        b.build_program(lambda x: b.reduce(x, "mean"), [b.tensor_type("f32", [4])])


def test_shift_helper() -> None:
    module = b.build_program(
        lambda x: (b.shift(x), b.shift(x, -2, rotate=True, group="pairs")),
        [b.tensor_type("f32", [4])],
        groups={"pairs": [[0, 1], [2, 3]]},
    )
    module.verify()
    text = str(module)
    assert "dist.shift %arg0 offset 1 : tensor<4xf32>" in text
    assert "dist.shift %arg0 offset -2 rotate group @pairs : tensor<4xf32>" in text


def test_an_unknown_arith_op_is_named() -> None:
    with pytest.raises(ValueError, match="no arith op 'frobnicate'; known: .*addi"):
        b.build_program(lambda x: b.arith("frobnicate", x, x), [b.tensor_type("i64", [4])])


def every_op_program():
    """One program built with every helper of `HELPERS`: each op of the
    dialect appears in it (checked by test_op_coverage)."""
    f32x4, i64x4 = b.tensor_type("f32", [4]), b.tensor_type("i64", [4])

    def body(x, counts, ct, q):
        r = b.rank("pairs")
        total = b.all_reduce(x, "sum", group="pairs")
        largest = b.all_reduce(x, combine=lambda p, s: b.arith("maximumf", p, s))
        root = b.broadcast(total, r)
        summed = b.all_reduce_add_ciphertext(ct, q, max_modulus_bits=40)
        b.assert_reduced(summed, q)
        b.assert_uniform(q)
        gathered = b.all_gather(x, counts=counts)
        scattered = b.reduce_scatter(x, "sum", group="pairs")
        to_root = b.gather(x, 1, counts=counts)
        from_root = b.scatter(x, 0, group="pairs")
        reduced = b.reduce(x, "max", 1, group="pairs")
        shifted = b.shift(x, -1, rotate=True)
        varying = b.pvary(x)
        summed_once = b.psum(varying)
        rows, recv_counts = b.variable_all_to_all(x, counts)
        (waved,) = b.wave(lambda: b.broadcast(x, 1))
        b.send(x, b.constant_index(1))
        got = b.recv(0, f32x4)
        swapped = b.sendrecv(x, 1, 0)
        moved = b.transfer(
            x,
            source_mesh="m",
            source_layout=[0],
            dest_mesh="m",
            dest_layout=[None],
            global_shape=[8],
        )
        return (
            b.group_size(),
            largest,
            root,
            gathered,
            scattered,
            to_root,
            from_root,
            reduced,
            shifted,
            summed_once,
            rows,
            recv_counts,
            waved,
            got,
            swapped,
            moved,
        )

    return b.build_program(
        body,
        [f32x4, i64x4, b.tensor_type("i64", [3, 16]), b.tensor_type("i64", [3])],
        groups={"pairs": [[0, 1], [2, 3]]},
        meshes={"m": ([2], [0, 1])},
    )


def test_every_op_program_round_trips() -> None:
    module = every_op_program()
    assert parse_module(str(module)).is_structurally_equivalent(module)


#: every binary/unary arith op of one operand family, and the op the error
#: suggests for the other family (None: no counterpart)
INTEGER_ARITH = {"addi": "addf", "subi": "subf", "muli": "mulf", "divsi": "divf",
                 "divui": "divf", "ceildivsi": None, "ceildivui": None, "floordivsi": None,
                 "remsi": None, "remui": None, "andi": None, "ori": None, "xori": None,
                 "shli": None, "shrsi": None, "shrui": None, "maxsi": "maximumf",
                 "maxui": "maximumf", "minsi": "minimumf", "minui": "minimumf",
                 "addui_extended": None, "mulsi_extended": None,
                 "mului_extended": None}  # fmt: skip
FLOAT_ARITH = {"addf": "addi", "subf": "subi", "mulf": "muli", "divf": "divsi",
               "maximumf": "maxsi", "minimumf": "minsi", "maxnumf": "maxsi",
               "minnumf": "minsi", "negf": None}  # fmt: skip


@pytest.mark.parametrize(
    ("name", "other", "wrong", "right"),
    [(n, o, "f32", "i64") for n, o in INTEGER_ARITH.items()]
    + [(n, o, "i64", "f32") for n, o in FLOAT_ARITH.items()],
)
def test_an_arith_op_on_the_other_families_type_names_the_op_and_the_fix(
    name, other, wrong, right
) -> None:
    family = "integer" if name in INTEGER_ARITH else "float"
    with pytest.raises(b.BuilderError) as info:
        b.build_program(lambda x: b.arith(name, x, x), [b.tensor_type(wrong, [4])])
    message = str(info.value)
    assert f"arith.{name} takes {family} operands, got tensor<4x{wrong}>" in message
    assert "Unexpected attribute" not in message
    if other is None:
        assert "use arith(" not in message
    else:
        assert f"for {wrong} use arith({other!r}, ...)" in message
        # the suggestion builds on that type
        b.build_program(lambda x: b.arith(other, x, x), [b.tensor_type(wrong, [4])])


def test_a_misspelt_name_gets_a_suggestion() -> None:
    with pytest.raises(b.BuilderError, match=r"no native reduction 'summ' \(did you mean 'sum'\?\); "
                       r"the native reductions are sum, prod, min, max, band, bor, bxor"):  # fmt: skip
        b.build_program(lambda x: b.all_reduce(x, "summ"), [b.tensor_type("f32", [4])])
    with pytest.raises(b.BuilderError, match=r"no arith op 'adf' \(did you mean 'addf'\?\)"):
        b.build_program(lambda x: b.arith("adf", x, x), [b.tensor_type("f32", [4])])
    # the reduce-scatter's kind the same way (was a bare ValueError)
    with pytest.raises(b.BuilderError, match=r"no native reduction 'mean'; the native reductions"):
        b.build_program(lambda x: b.reduce_scatter(x, "mean"), [b.tensor_type("f32", [4])])
    # a native kind still builds
    b.build_program(lambda x: b.all_reduce(x, "sum"), [b.tensor_type("f32", [4])])
