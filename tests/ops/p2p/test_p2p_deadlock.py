"""`verify-spmd` finds point-to-point deadlocks before anything runs: when
peers, branches and loop bounds follow from the rank and the group size, it
runs every rank's sends and receives and rejects the program if ranks block
forever (two ranks that both receive first, a receive nobody sends)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import distir
from distir.errors import CompileError

T = "tensor<2xf32>"


def two_ranks(rank0: list[str], rank1: list[str]) -> str:
    """Rank 0 runs `rank0` (lines "send" / "recv"), the others `rank1`;
    rank 0 talks to 1 and every other rank to 0."""

    def body(lines: list[str], peer: int) -> str:
        out, last = [], "%x"
        for i, line in enumerate(lines):
            if line == "send":
                out.append(f"    dist.send %x to {peer} : {T}")
            else:
                out.append(f"    %v{peer}_{i} = dist.recv from {peer} : {T}")
                last = f"%v{peer}_{i}"
        out.append(f"    scf.yield {last} : {T}")
        return "\n".join(out)

    return f"""\
func.func @main(%x: {T}) -> {T} {{
  %r = dist.rank : index
  %zero = arith.constant 0 : index
  %is0 = arith.cmpi eq, %r, %zero : index
  %y = scf.if %is0 -> ({T}) {{
{body(rank0, 1)}
  }} else {{
{body(rank1, 0)}
  }}
  func.return %y : {T}
}}
"""


RECV_FIRST = two_ranks(["recv", "send"], ["recv", "send"])


def test_two_ranks_that_both_receive_first_are_rejected_at_compile_time(tmp_path) -> None:
    path = tmp_path / "p.mlir"
    path.write_text(RECV_FIRST)
    with pytest.raises(CompileError) as info:
        distir.compile(path)
    message = str(info.value)
    assert message.startswith("point-to-point deadlock with 2 ranks (and every size up to 8): ")
    assert (
        f"rank 0 waits at 'dist.recv' at {path}:6:5 for rank 1, which waits at 'dist.recv' at {path}:10:5"
        in message
    )
    assert "or exchange with dist.sendrecv" in message


@pytest.mark.slow  # starts distir-opt
def test_distir_opt_verify_spmd_finds_it_too(tmp_path) -> None:
    path = tmp_path / "p.mlir"
    path.write_text(RECV_FIRST)
    done = subprocess.run([sys.executable, "-m", "distir.cli.opt", "-p", "verify-spmd", str(path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0
    assert "point-to-point deadlock with 2 ranks" in done.stderr


def test_a_receive_that_no_rank_sends_is_rejected() -> None:
    with pytest.raises(
        CompileError,
        match="rank 0 waits at 'dist.recv' at <program>:6:5 for rank 1, which has finished without sending it",
    ):
        distir.compile(two_ranks(["recv"], []))


@pytest.mark.parametrize(
    ("rank0", "rank1"),
    [(["send", "recv"], ["recv", "send"]), (["recv", "send"], ["send", "recv"]),
     (["send", "recv"], ["send", "recv"])],
)  # fmt: skip
def test_orders_that_complete_are_accepted_and_run(rank0, rank1) -> None:
    program = distir.compile(two_ranks(rank0, rank1))
    out = program.simulate([[torch.ones(2)], [torch.full((2,), 2.0)]], timeout=30)
    assert out[0].tolist() == [2.0, 2.0] and out[1].tolist() == [1.0, 1.0]


RING_RECV_FIRST = f"""\
func.func @main(%x: {T}) -> {T} {{
  %r = dist.rank : index
  %n = dist.group_size : index
  %one = arith.constant 1 : index
  %r1 = arith.addi %r, %one : index
  %next = arith.remui %r1, %n : index
  %rn = arith.addi %r, %n : index
  %rn1 = arith.subi %rn, %one : index
  %prev = arith.remui %rn1, %n : index
  %y = dist.recv from %prev : {T}
  dist.send %x to %next : {T}
  func.return %y : {T}
}}
"""


def test_a_ring_where_everyone_receives_first_is_a_cycle_at_every_size() -> None:
    with pytest.raises(CompileError, match="point-to-point deadlock with 2 ranks"):
        distir.compile(RING_RECV_FIRST)
    # Sending first is the working ring.
    text = RING_RECV_FIRST.replace(f"  %y = dist.recv from %prev : {T}\n", "")
    text = text.replace("  func.return %y", f"  %y = dist.recv from %prev : {T}\n  func.return %y")
    out = distir.compile(text).simulate([[torch.full((2,), float(r))] for r in range(3)])
    assert [o[0].item() for o in out] == [2.0, 0.0, 1.0]


def test_a_program_right_for_two_ranks_only_is_not_rejected() -> None:
    """Ranks >= 2 would wait for rank 0 forever, but at 2 ranks it runs."""
    distir.compile(two_ranks(["send", "recv"], ["recv", "send"]))


def test_data_dependent_peers_are_left_to_the_runtime() -> None:
    text = f"""\
func.func @main(%x: {T}, %peer: index) -> {T} {{
  %y = dist.recv from %peer : {T}
  dist.send %x to %peer : {T}
  func.return %y : {T}
}}
"""
    distir.compile(text)


# A class of failure: random orders of sends and receives between two ranks. The
# reference simulator is the oracle: what verify-spmd accepts runs to the end; what
# it rejects hangs (a receive that never gets its message, named by the simulator).


@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_verify_spmd_rejects_exactly_the_orders_that_hang(data) -> None:
    n = data.draw(st.integers(1, 3))
    # Each rank receives what the other sends: n messages each way.
    rank0 = data.draw(st.permutations(["send"] * n + ["recv"] * n))
    rank1 = data.draw(st.permutations(["send"] * n + ["recv"] * n))
    text = two_ranks(list(rank0), list(rank1))
    try:
        distir.compile(text)
        rejected = False
    except CompileError as e:
        assert "point-to-point deadlock" in str(e)
        rejected = True
    program = distir.compile(text, verify_spmd=False)
    inputs = [[torch.ones(2)], [torch.full((2,), 2.0)]]
    try:
        # A hang shows as a receive that gets no message within the timeout.
        program.simulate(inputs, timeout=5)
        hung = False
    except distir.errors.DistirError as e:
        assert "no message from group rank" in str(e), e
        hung = True
    assert rejected == hung, (rank0, rank1)


def test_the_simulator_names_a_deadlock_at_once_with_every_rank_s_wait() -> None:
    # Both ranks receive first: no rank can ever send. The simulator sees that
    # every running rank waits with nothing left to change, and says so
    # without waiting for its timeout (an hour here).
    program = distir.compile(two_ranks(["recv", "send"], ["recv", "send"]), verify_spmd=False)
    start = time.monotonic()
    with pytest.raises(distir.errors.DistirError) as raised:
        program.simulate([[torch.ones(2)], [torch.full((2,), 2.0)]], timeout=3600)
    assert time.monotonic() - start < 60
    message = str(raised.value)
    assert "no message from group rank" in message and "can ever come" in message
    assert "deadlock: every rank still running waits (rank 0: 'dist.recv' at" in message
    assert "a message from group rank 1; rank 1: 'dist.recv' at" in message
    assert message.endswith("a message from group rank 0) and none can go on")


def test_a_rank_that_waits_while_another_computes_is_no_deadlock() -> None:
    # Rank 1 receives at once; rank 0 sends only after work of its own (a
    # chain of local ops): waiting alone is not a deadlock.
    work = "\n".join(f"    %w{i} = arith.addf %x, %x : {T}" for i in range(200))
    text = two_ranks(["send"], ["recv"]).replace(
        f"    dist.send %x to 1 : {T}", f"{work}\n    dist.send %w199 to 1 : {T}"
    )
    out = distir.compile(text).simulate([[torch.ones(2)], [torch.zeros(2)]], timeout=60)
    assert torch.equal(out[1], torch.full((2,), 2.0))
