"""Implementations are chosen when a program is bound to a group, by the
group's capabilities (`transport.registry`: the registry keeps each op's
candidates in preference order at compile time, binding takes the first
whose `needs` the transport's `Capabilities` meet).

A fake transport with other capabilities gets another implementation for
the same program; a group no candidate runs on is a named error; and on a
real gloo group of 2 every op family binds to the implementation it ran
with before the choice moved to bind time (the table below, written by
hand from the registry's rule and checked against the code before the
change).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

import distir
from distir.errors import UnsupportedOpError
from distir.ops.all_reduce.torch import NativeAllReduceImplementation
from distir.runtime.launch import launch
from distir.transport.groups import BACKEND_CAPABILITIES, COLLECTIVE_DTYPES
from distir.transport.implementations import distributed_operation_contributions
from distir.transport.protocol import Abort, Capabilities, Needs
from distir.transport.registry import ImplementationRegistry

T = "tensor<4xf32>"
SUM = f"""func.func @main(%x: {T}) -> {T} {{
  %y = dist.all_reduce sum %x : {T}
  func.return %y : {T}
}}"""

CPU = BACKEND_CAPABILITIES["gloo"]
CUDA = BACKEND_CAPABILITIES["nccl"]


@dataclass
class FakeTransport:
    """What binding reads of a group when it chooses: its capabilities and
    the names an error gives."""

    capabilities: Capabilities
    name: str = "fake"
    backend: str = "fake"
    size: int = 2
    rank: int = 0
    log: list[str] = field(default_factory=list)


class CudaSum(NativeAllReduceImplementation):
    """A native all-reduce only a CUDA group may run (as a symmetric-memory
    all-reduce would be): preferred where it is served."""

    name = "cuda-sum"
    priority = 1
    needs = Needs(devices=frozenset({"cuda"}), abort=Abort.COMMUNICATOR)

    def execute(self, invocation, inputs, resources, writable=frozenset()):
        raise AssertionError("cuda-sum ran on a group that does not serve it")


class WideSum(NativeAllReduceImplementation):
    """A native all-reduce that needs its transport to reduce a type no
    c10d backend here declares (the bytes-path alternative is native)."""

    name = "wide-sum"
    priority = 2
    needs = Needs(reduces=frozenset({torch.complex64}))


def _plan(*implementations):
    program = distir.compile(SUM, registry=ImplementationRegistry(implementations))
    (op,) = program.plan.ops
    return program.plan, op


def test_the_same_program_binds_by_the_groups_capabilities() -> None:
    plan, op = _plan(CudaSum(), NativeAllReduceImplementation())
    assert [i.name for i in plan.preferences[op]] == ["cuda-sum", "native"]
    assert plan.implementation_for(op, 2, FakeTransport(CPU)).name == "native"
    assert plan.implementation_for(op, 2, FakeTransport(CUDA)).name == "cuda-sum"
    # The fingerprint covers the choice: a CUDA group and a CPU group do not
    # run the same plan.
    assert plan.bound_fingerprint(2, FakeTransport(CPU)) != plan.bound_fingerprint(
        2, FakeTransport(CUDA)
    )
    assert "native" in plan.describe(2, FakeTransport(CPU))


def test_a_need_no_transport_meets_is_skipped_and_priority_orders_the_rest() -> None:
    plan, op = _plan(NativeAllReduceImplementation(), CudaSum(), WideSum())
    assert [i.name for i in plan.preferences[op]] == ["wide-sum", "cuda-sum", "native"]
    assert plan.implementation_for(op, 2, FakeTransport(CUDA)).name == "cuda-sum"
    wide = Capabilities(
        devices=frozenset({"cpu"}), moves=COLLECTIVE_DTYPES,
        reduces=COLLECTIVE_DTYPES | {torch.complex64}, store=False, abort=Abort.DEADLINE,
    )  # fmt: skip
    assert plan.implementation_for(op, 2, FakeTransport(wide)).name == "wide-sum"


def test_a_candidate_that_runs_anywhere_ends_the_preferences() -> None:
    plan, op = _plan(NativeAllReduceImplementation(), CudaSum())
    # cuda-sum has the higher priority; native serves every transport, so
    # nothing after it could ever be chosen.
    assert [i.name for i in plan.preferences[op]] == ["cuda-sum", "native"]
    plan, op = _plan(CudaSum(), NativeAllReduceImplementation(), WideSum())
    assert [i.name for i in plan.preferences[op]] == ["wide-sum", "cuda-sum", "native"]


def test_no_candidate_for_the_group_is_a_named_error() -> None:
    plan, op = _plan(CudaSum())
    with pytest.raises(UnsupportedOpError) as e:
        plan.implementation_for(op, 2, FakeTransport(CPU, name="world", backend="gloo"))
    text = str(e.value)
    assert text.startswith("'dist.all_reduce' at ") and ":2:" in text, text
    assert "no implementation of dist.all_reduce runs on group world (gloo" in text
    assert "cuda-sum needs devices ['cuda'], communicator abort" in text


#: every need against a capability that has it and one that lacks it
NEEDS_CASES = [
    (Needs(), CPU, True),
    (Needs(devices=frozenset({"cuda"})), CPU, False),
    (Needs(devices=frozenset({"cuda"})), CUDA, True),
    (Needs(devices=frozenset({"cpu"})), CPU, True),
    (Needs(moves=frozenset({torch.float32})), CPU, True),
    (Needs(moves=frozenset({torch.complex64})), CPU, False),
    (Needs(reduces=frozenset({torch.int64, torch.bfloat16})), CPU, True),
    (Needs(reduces=frozenset({torch.int16})), CPU, False),
    (Needs(store=True), CPU, True),
    (
        Needs(store=True),
        Capabilities(frozenset({"cpu"}), frozenset(), frozenset(), False, Abort.DEADLINE),
        False,
    ),  # fmt: skip
    (Needs(abort=Abort.COMMUNICATOR), CPU, False),
    (Needs(abort=Abort.COMMUNICATOR), CUDA, True),
    (Needs(abort=Abort.DEADLINE), CPU, True),
]


@pytest.mark.parametrize(("needs", "capabilities", "met"), NEEDS_CASES)
def test_needs_are_met_field_by_field(needs, capabilities, met) -> None:
    assert needs.met_by(capabilities) is met


# -- on a real gloo group of 2 -------------------------------------------------

#: one program per op family, and what each of its ops binds to on gloo/CPU
#: (by op, in program order)
FAMILY_PROGRAMS: dict[str, tuple[str, list[str]]] = {
    "groups": (
        """
func.func @main(%x: tensor<4xf32>) -> (index, index) {
  %r = dist.rank : index
  %s = dist.group_size : index
  func.return %r, %s : index, index
}""",
        ["group-query", "group-query"],
    ),
    "transfer": (
        """
dist.mesh @rows [2] ranks [0, 1]
dist.mesh @one [1] ranks [1]
func.func @main(%x: tensor<?x4xf32>) -> tensor<?x4xf32> {
  %y = dist.transfer %x from @rows [0, *] to @one [*, *] global [6, 4] : tensor<?x4xf32> -> tensor<?x4xf32>
  func.return %y : tensor<?x4xf32>
}""",
        ["transfer-p2p"],
    ),
    "broadcast": (
        f"""
func.func @main(%x: {T}) -> {T} {{
  %y = dist.broadcast %x root 1 : {T}
  func.return %y : {T}
}}""",
        ["broadcast"],
    ),
    "all_reduce": (
        f"""
func.func @main(%x: {T}) -> ({T}, {T}, {T}, {T}) {{
  %a = dist.all_reduce sum %x : {T}
  %b = dist.all_reduce %x commutative : {T} combine(%l, %r) {{
    %m = arith.maximumf %l, %r : {T}
    dist.yield %m : {T}
  }}
  %c = dist.all_reduce %x : {T} combine(%l, %r) {{
    %m = arith.addf %l, %r : {T}
    dist.yield %m : {T}
  }}
  %d = dist.all_reduce %x commutative algorithm "ring" : {T} combine(%l, %r) {{
    %m = arith.maximumf %l, %r : {T}
    dist.yield %m : {T}
  }}
  func.return %a, %b, %c, %d : {T}, {T}, {T}, {T}
}}""",
        ["native", "recursive-doubling", "recursive-doubling", "ring"],
    ),
    "all_reduce_add_ciphertext": (
        """
func.func @main(%ct: tensor<2x2x8xi64>, %q: tensor<2xi64>) -> tensor<2x2x8xi64> {
  %y = dist.all_reduce_add_ciphertext %ct, %q : tensor<2x2x8xi64>, tensor<2xi64>
  func.return %y : tensor<2x2x8xi64>
}""",
        ["ciphertext-auto"],
    ),
    "all_gather": (
        f"""
func.func @main(%x: {T}) -> tensor<?xf32> {{
  %y = dist.all_gather %x axis 0 : {T} -> tensor<?xf32>
  func.return %y : tensor<?xf32>
}}""",
        ["all-gather"],
    ),
    "reduce_scatter": (
        """
func.func @main(%x: tensor<4x3xf32>) -> tensor<2x3xf32> {
  %y = dist.reduce_scatter sum %x axis 0 : tensor<4x3xf32> -> tensor<2x3xf32>
  func.return %y : tensor<2x3xf32>
}""",
        ["reduce-scatter"],
    ),
    "all_to_all": (
        """
func.func @main(%x: tensor<?x2xi64>, %s: tensor<2xi64>) -> tensor<?x2xi64> {
  %y, %r = dist.variable_all_to_all %x, %s axis 0 : tensor<?x2xi64>, tensor<2xi64> -> tensor<?x2xi64>
  func.return %y : tensor<?x2xi64>
}""",
        ["all-to-all-single"],
    ),
    "replication": (
        """
func.func @main(%x: tensor<3xf64>) -> (tensor<3xf64>, tensor<3xf64>) {
  %p = dist.psum %x : tensor<3xf64>
  %v = dist.pvary %p : tensor<3xf64>
  func.return %p, %v : tensor<3xf64>, tensor<3xf64>
}""",
        ["psum", "pvary"],
    ),
    "gather_scatter": (
        """
func.func @main(%x: tensor<2x3xf32>) -> tensor<?x3xf32> {
  %g = dist.gather %x axis 0 root 0 : tensor<2x3xf32> -> tensor<?x3xf32>
  %s = dist.scatter %g axis 0 root 0 : tensor<?x3xf32> -> tensor<?x3xf32>
  func.return %s : tensor<?x3xf32>
}""",
        ["gather", "scatter"],
    ),
    "reduce": (
        f"""
func.func @main(%x: {T}) -> {T} {{
  %y = dist.reduce sum %x root 0 : {T}
  func.return %y : {T}
}}""",
        ["native-reduce"],
    ),
    "shift": (
        f"""
func.func @main(%x: {T}) -> {T} {{
  %y = dist.shift %x offset 1 rotate : {T}
  func.return %y : {T}
}}""",
        ["shift-all-to-all"],
    ),
    "p2p": (
        """
func.func @main(%x: tensor<8xi64>) -> tensor<8xi64> {
  %r = dist.rank : index
  %zero = arith.constant 0 : index
  %one = arith.constant 1 : index
  %peer = arith.subi %one, %r : index
  %s = dist.sendrecv %x to %peer from %peer : tensor<8xi64> -> tensor<8xi64>
  %is_first = arith.cmpi eq, %r, %zero : index
  %y = scf.if %is_first -> (tensor<8xi64>) {
    dist.send %s to 1 : tensor<8xi64>
    scf.yield %s : tensor<8xi64>
  } else {
    %got = dist.recv from 0 : tensor<8xi64>
    scf.yield %got : tensor<8xi64>
  }
  func.return %y : tensor<8xi64>
}""",
        ["group-query", "sendrecv", "send", "recv"],
    ),
    "asserts": (
        """
func.func @main(%u: tensor<3xi64>) -> tensor<3xi64> {
  dist.assert_uniform %u : tensor<3xi64>
  func.return %u : tensor<3xi64>
}""",
        ["assert-uniform"],
    ),
}


def _bind_every_family(ctx) -> dict[str, list[str]]:
    from distir.runtime.binding import Binding

    bound = {}
    for family, (text, _) in FAMILY_PROGRAMS.items():
        program = distir.compile(text)
        binding = Binding(program.plan, None)
        binding.prepare(30.0)
        bound[family] = [binding.implementations[op].name for op in program.plan.ops]
    return bound


def _capability_runs(ctx) -> dict[str, object]:
    from distir.ops.table import running_families

    out: dict[str, object] = {}
    preferred = ImplementationRegistry([CudaSum(), *distributed_operation_contributions()])
    program = distir.compile(SUM, registry=preferred)
    y = program.run(torch.full((4,), float(ctx.rank + 1)))
    out["sum"] = y.tolist()
    out["bound"] = [i.name for i in program._bindings[None].implementations.values()]
    only_cuda = distir.compile(SUM, registry=ImplementationRegistry([CudaSum()]))
    for attempt in range(2):  # the error is raised again, never a hang
        try:
            only_cuda.run(torch.ones(4))
            out[f"error {attempt}"] = None
        except UnsupportedOpError as e:
            out[f"error {attempt}"] = str(e)
    out["families"] = sorted(f.name for f in running_families())
    return out


@pytest.mark.multirank
@pytest.mark.timeout(180)
def test_every_op_family_binds_on_gloo_as_before() -> None:
    results = launch(_bind_every_family, 2, pass_context=True, timeout=150)
    expected = {family: names for family, (_, names) in FAMILY_PROGRAMS.items()}
    assert results == [expected, expected]


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_a_cuda_only_candidate_is_skipped_on_gloo_and_none_is_a_named_error() -> None:
    results = launch(_capability_runs, 2, pass_context=True, timeout=90)
    for rank, out in enumerate(results):
        assert out["sum"] == [3.0] * 4
        assert out["bound"] == ["native"]
        for attempt in range(2):
            text = out[f"error {attempt}"]
            assert text is not None and text.startswith("'dist.all_reduce' at "), (rank, text)
            assert "runs on group world (gloo, devices ['cpu']): cuda-sum needs" in text
    # Every running family is in the table above.
    assert results[0]["families"] == sorted(
        f for f in FAMILY_PROGRAMS if f != "all_reduce_add_ciphertext"
    )
