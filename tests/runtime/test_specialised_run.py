"""The specialised run of a binding agrees with the general path.

`Program.run` takes, after a binding's first general run, the run its
rules specialised for that binding (`distir.runtime.specialised`): guards
on what can change between runs, and the general path whenever one fails.
A program with `specialise = False` always takes the general path, which
defines what a run does. `run_async(..., on_backend_thread=True)` of a
trusted program that is one collective submits it on the calling thread
(`specialised_submit`); on the general path it is queued as always. Drawn sequences of runs (inputs of the declared
type or not, strided, transposed, expanded, negation views, efficient zero
tensors, inputs that require grad, previous results passed back, donated
or not) must give, on both paths: the same results (and values an oracle
in plain torch computes: at one rank a sum or a broadcast is the input's
value), the same aliasing of results and inputs, the same version counter
moves, and the same refusals with the same named errors.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

import distir
from distir.errors import DistirError
from distir.runtime.launch import launch
from distir.runtime.specialised import direct_collective
from distir.transport.domain import domain_for, reset_domain

#: name -> (IR, input (dtype, shape) per argument, what each result is in
#: plain torch from the ranks' inputs: ("sum", i) the sum of input i over
#: ranks, ("root", i) rank 0's input i, ("own", i) the rank's own input i,
#: ("const", v) a constant)
PROGRAMS: dict[str, tuple[str, list[tuple[torch.dtype, tuple[int, ...]]], list[tuple]]] = {
    "all-reduce f32": (
        """
func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %y = dist.all_reduce sum %x : tensor<2x3xf32>
  func.return %y : tensor<2x3xf32>
}""",
        [(torch.float32, (2, 3))],
        [("sum", 0)],
    ),
    "all-reduce i64": (
        """
func.func @main(%x: tensor<3x2xi64>) -> tensor<3x2xi64> {
  %y = dist.all_reduce sum %x : tensor<3x2xi64>
  func.return %y : tensor<3x2xi64>
}""",
        [(torch.int64, (3, 2))],
        [("sum", 0)],
    ),
    "broadcast": (
        """
func.func @main(%x: tensor<2x2xf64>) -> tensor<2x2xf64> {
  %y = dist.broadcast %x root 0 : tensor<2x2xf64>
  func.return %y : tensor<2x2xf64>
}""",
        [(torch.float64, (2, 2))],
        [("root", 0)],
    ),
    "two sums and a constant": (
        """
func.func @main(%x: tensor<2x2xi64>, %y: tensor<2x2xi64>) -> (tensor<2x2xi64>, tensor<2x2xi64>, tensor<2x2xi64>) {
  %a = dist.all_reduce sum %x : tensor<2x2xi64>
  %b = dist.all_reduce sum %y : tensor<2x2xi64>
  %c = arith.constant dense<7> : tensor<2x2xi64>
  func.return %a, %b, %c : tensor<2x2xi64>, tensor<2x2xi64>, tensor<2x2xi64>
}""",
        [(torch.int64, (2, 2)), (torch.int64, (2, 2))],
        [("sum", 0), ("sum", 1), ("const", 7)],
    ),
    "a sum and its input": (
        """
func.func @main(%x: tensor<2x2xf32>) -> (tensor<2x2xf32>, tensor<2x2xf32>) {
  %y = dist.all_reduce sum %x : tensor<2x2xf32>
  func.return %y, %x : tensor<2x2xf32>, tensor<2x2xf32>
}""",
        [(torch.float32, (2, 2))],
        [("sum", 0), ("own", 0)],
    ),
    "dynamic all-reduce": (
        """
func.func @main(%x: tensor<?xf32>) -> tensor<?xf32> {
  %y = dist.all_reduce sum %x : tensor<?xf32>
  func.return %y : tensor<?xf32>
}""",
        [(torch.float32, (5,))],
        [("sum", 0)],
    ),
}

#: the programs whose specialised run submits their one collective itself
#: (`distir.runtime.specialised.direct_collective`)
DIRECT = {"all-reduce f32", "all-reduce i64", "broadcast"}

#: how a run's input is made (each accepted, copied or refused by name)
KINDS = [
    "contiguous",
    "strided",
    "transposed",
    "expanded",
    "negated",
    "zero tensor",
    "requires grad",
    "previous result",
    "wrong dtype",
    "wrong shape",
    "not a tensor",
    "meta",
    # the same Python object given another dtype or a negative bit through
    # `.data =` (its version counter does not move): a guard that cached
    # what it saw per object would take it for what it was
    "previous, data as another dtype",
    "previous, data negated",
    "data as another dtype",
    "parameter",
    "inference tensor",
]

#: a dtype of the same item size (what `.data = x.view(dtype)` may switch to)
SAME_SIZE = {
    torch.float32: torch.int32,
    torch.int32: torch.float32,
    torch.float64: torch.int64,
    torch.int64: torch.float64,
}


@st.composite
def run_sequences(draw, max_runs: int = 5) -> tuple[str, bool, list[dict]]:
    """A program, its agreement mode, and runs: per run its donation, an
    arity change (rarely) and, per input, a kind and a value seed."""
    name = draw(st.sampled_from(sorted(PROGRAMS)))
    trusted = draw(st.booleans())
    arity = len(PROGRAMS[name][1])
    runs = []
    for _ in range(draw(st.integers(1, max_runs))):
        runs.append(
            {
                "donate": draw(st.booleans()),
                "kinds": [
                    draw(st.sampled_from(KINDS[:8]) | st.sampled_from(KINDS)) for _ in range(arity)
                ],
                "seed": draw(st.integers(0, 2**16)),
                "extra": draw(st.integers(0, 19)) == 0,  # one input too many
                # through run, run_async, or run_async(on_backend_thread=True)
                "queued": draw(st.sampled_from(["run", "queued", "backend thread"])),
            }
        )
    return name, trusted, runs


def make_input(
    kind: str,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    seed: int,
    rank: int,
    previous: Any,
) -> Any:
    """Input `kind` of `dtype` and `shape` with values from `seed` and `rank`
    (the same tensor, as a new object, every time it is asked for)."""
    g = torch.Generator().manual_seed(seed * 7 + rank)
    if kind == "previous result" and isinstance(previous, torch.Tensor):
        return previous
    if kind == "previous, data as another dtype" and isinstance(previous, torch.Tensor):
        previous.data = previous.detach().view(SAME_SIZE[previous.dtype])
        return previous
    if kind == "previous, data negated" and isinstance(previous, torch.Tensor):
        if previous.dtype.is_floating_point:
            previous.data = previous.detach()._neg_view()
        return previous
    if dtype.is_floating_point:
        value = torch.randint(-50, 50, shape, generator=g).to(dtype) / 4
    else:
        value = torch.randint(-50, 50, shape, generator=g).to(dtype)
    if kind == "strided":
        wide = torch.zeros(*shape[:-1], shape[-1] * 2, dtype=dtype)
        wide[..., ::2] = value
        return wide[..., ::2]
    if kind == "transposed" and len(shape) == 2:
        return value.t().contiguous().t()
    if kind == "expanded":
        return value[:1].expand(shape) if shape[0] > 1 else value
    if kind == "negated" and dtype.is_floating_point:
        return (-value)._neg_view()
    if kind == "zero tensor":
        return torch._efficientzerotensor(shape, dtype=dtype)
    if kind == "requires grad" and dtype.is_floating_point:
        return value.requires_grad_()
    if kind == "wrong dtype":
        return value.to(torch.int32 if dtype.is_floating_point else torch.float32)
    if kind == "wrong shape":
        return value.reshape(-1)[: value.numel() - 1].clone()
    if kind == "not a tensor":
        return value.tolist()
    if kind == "meta":
        return torch.empty(shape, dtype=dtype, device="meta")
    if kind == "data as another dtype":
        value.data = value.view(SAME_SIZE[dtype])
    if kind == "parameter":
        return torch.nn.Parameter(value, requires_grad=False)
    if kind == "inference tensor":
        with torch.inference_mode():
            return value.clone()
    return value


def play(program: Any, group: Any, name: str, runs: list[dict], rank: int) -> list[tuple]:
    """Runs `runs` on `group` and returns each run's outcome: its results'
    values, which results alias which input, the inputs' version moves and
    values afterwards; or the error's type and text."""
    _, specs, _ = PROGRAMS[name]
    warm = [make_input("contiguous", dtype, shape, 0, rank, None) for dtype, shape in specs]
    program.run(*warm, group=group)  # the binding's general run: specialised from here on
    previous: list[Any] = [None] * len(specs)
    outcomes = []
    for spec in runs:
        inputs = [
            make_input(kind, dtype, shape, spec["seed"] + i, rank, previous[i])
            for i, (kind, (dtype, shape)) in enumerate(zip(spec["kinds"], specs))
        ]
        if spec["extra"]:
            inputs.append(inputs[0])
        tensors = [x for x in inputs if isinstance(x, torch.Tensor) and x.device.type != "meta"]
        versions = [_version(x) for x in tensors]
        completed = domain_for(group).completed
        try:
            if spec["queued"] != "run":
                future = program.run_async(
                    *inputs,
                    group=group,
                    donate=spec["donate"],
                    on_backend_thread=spec["queued"] == "backend thread",
                )
                results = future.wait()
            else:
                results = program.run(*inputs, group=group, donate=spec["donate"])
        except DistirError as e:
            outcomes.append(("refused", type(e).__name__, str(e)))
            reset_domain(group)  # an input refusal leaves the group working
            continue
        results = results if isinstance(results, tuple) else (results,)
        aliasing = [[_storage(r) is not None and _storage(r) == _storage(x) for x in inputs]
                    for r in results]  # fmt: skip
        outcomes.append(
            (
                "ran",
                [r.detach().clone() for r in results],
                aliasing,
                [v if v is None else _version(x) - v for x, v in zip(tensors, versions)],
                [x.detach().clone() for x in tensors],
                # the run position distir.recover agrees on moves once per run
                domain_for(group).completed - completed,
            )
        )
        previous = [
            results[i] if i < len(results) and results[i].shape == inputs[i].shape else None
            for i in range(len(specs))
        ]
    return outcomes


def _version(x: torch.Tensor) -> int | None:
    """A tensor's version counter (None: an inference tensor has none)."""
    return None if x.is_inference() else x._version


def _storage(x: Any) -> int | None:
    """The address of a tensor's storage (None: it has none)."""
    if not isinstance(x, torch.Tensor) or x.device.type == "meta" or x._is_zerotensor():
        return None
    return x.untyped_storage().data_ptr() if x.numel() else None


def expected_values(
    name: str, inputs_per_rank: list[list[torch.Tensor]], rank: int
) -> list[torch.Tensor]:
    """What `rank`'s results are, from plain torch on every rank's input values."""
    _, _, results = PROGRAMS[name]
    expected = []
    for what, arg in results:
        if what == "sum":
            expected.append(sum(x[arg].detach().clone() for x in inputs_per_rank))
        elif what == "root":
            expected.append(inputs_per_rank[0][arg].detach().clone())
        elif what == "own":
            expected.append(inputs_per_rank[rank][arg].detach().clone())
        else:
            expected.append(torch.full((2, 2), arg, dtype=torch.int64))
    return expected


def same_outcome(general: tuple, specialised: tuple) -> None:
    assert general[0] == specialised[0], (general, specialised)
    if general[0] == "refused":
        assert general[1:] == specialised[1:]
        return
    for a, b in zip(general[1], specialised[1], strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert general[2] == specialised[2]  # aliasing
    assert general[3] == specialised[3]  # version moves
    for a, b in zip(general[4], specialised[4], strict=True):
        assert torch.equal(a, b)  # the inputs afterwards
    assert general[5] == specialised[5] == 1  # runs counted for recover's resume


@pytest.fixture(scope="module")
def programs(one_rank_world):
    """Per program and mode: (general, specialised), compiled once."""
    compiled = {}
    for name, (source, _, _) in PROGRAMS.items():
        for trusted in (False, True):
            general = distir.compile(source, agreement=not trusted)
            general.specialise = False
            compiled[name, trusted] = (general, distir.compile(source, agreement=not trusted))
    return compiled


@given(run_sequences())
@settings(max_examples=examples(1.0))
def test_the_specialised_run_agrees_with_the_general_path(programs, drawn):
    name, trusted, runs = drawn
    general, specialised = programs[name, trusted]
    group_g, group_s = dist.new_group([0]), dist.new_group([0])
    try:
        expected = play(general, group_g, name, runs, 0)
        got = play(specialised, group_s, name, runs, 0)
        binding = specialised._bindings[group_s]
        assert binding.specialised, "no specialised run was made"
        assert (direct_collective(binding) is not None) == (name in DIRECT)
    finally:
        dist.destroy_process_group(group_g)
        dist.destroy_process_group(group_s)
    for e, g in zip(expected, got, strict=True):
        same_outcome(e, g)
    # Against plain torch: at one rank each result is its input's value
    # (runs that pass a previous result back read a value not redrawn here).
    specs = PROGRAMS[name][1]
    for position, (spec, outcome) in enumerate(zip(runs, expected)):
        previous = any(kind.startswith("previous") for kind in spec["kinds"])
        if outcome[0] != "ran" or (position and previous):
            continue
        inputs = [
            make_input(kind, dtype, shape, spec["seed"] + i, 0, None)
            for i, (kind, (dtype, shape)) in enumerate(zip(spec["kinds"], specs))
        ]
        for want, have in zip(expected_values(name, [inputs], 0), outcome[1], strict=True):
            assert torch.equal(want.to(have.dtype), have)


def test_a_failed_guard_takes_the_general_path(programs):
    """A run whose input the specialisation cannot take (a negation view)
    runs the general path, which copies it; the next plain run is
    specialised again."""
    _, specialised = programs["all-reduce f32", True]
    group = dist.new_group([0])
    x = torch.arange(6.0).reshape(2, 3)
    specialised.run(x, group=group)
    fast = specialised._bindings[group].specialised[False]
    calls = []
    specialised._bindings[group].specialised[False] = lambda inputs: calls.append(1) or fast(inputs)
    y = specialised.run((-x)._neg_view(), group=group)
    assert torch.equal(y, x) and calls == [1]
    assert torch.equal(specialised.run(x, group=group), x) and calls == [1, 1]
    dist.destroy_process_group(group)


@pytest.mark.parametrize("donate", [True, False])
@pytest.mark.parametrize("change", ["another dtype", "negation view"])
def test_an_input_changed_through_data_is_seen(programs, change, donate):
    """The same tensor object passed back after `.data =` gave it another
    dtype (an int32 view of its memory) or a negative bit, neither of which
    moves its version counter: both paths refuse it with the same error, or
    run on its value (the negation), never on its old reading."""
    outcomes = []
    for program in programs["all-reduce f32", True]:
        group = dist.new_group([0])
        try:
            x = torch.arange(6.0).reshape(2, 3) + 1
            for _ in range(3):  # specialised from the second run on
                x = program.run(x, group=group, donate=True)
            if change == "another dtype":
                x.data = x.detach().view(torch.int32)
            else:
                x.data = x.detach()._neg_view()
            try:
                outcomes.append(("ran", program.run(x, group=group, donate=donate).clone()))
            except DistirError as e:
                outcomes.append(("refused", type(e).__name__, str(e)))
                reset_domain(group)
        finally:
            dist.destroy_process_group(group)
    general, specialised = outcomes
    if change == "another dtype":
        assert general[0] == "refused" and general[1] == "ProgramInputError"
        assert general == specialised
    else:
        want = -(torch.arange(6.0).reshape(2, 3) + 1)  # plain torch: the view's value
        assert general[0] == specialised[0] == "ran"
        assert torch.equal(general[1], want) and torch.equal(specialised[1], want)


def test_queued_runs_take_the_specialised_path(programs):
    """A program only ever queued (a DDP hook's) gets its specialised run
    after its first queued run, and the next queued runs take it."""
    name = "all-reduce f32"
    source = PROGRAMS[name][0]
    program = distir.compile(source, agreement=False)
    group = dist.new_group([0])
    try:
        x = torch.arange(6.0).reshape(2, 3)
        assert torch.equal(program.run_async(x.clone(), group=group, donate=True).wait(), x)
        binding = program._bindings[group]
        fast = binding.specialised[True]
        calls = []

        def counted(inputs, *claimed):
            calls.append(claimed)
            return fast(inputs, *claimed)

        binding.specialised[True] = counted
        for _ in range(3):
            assert torch.equal(program.run_async(x.clone(), group=group, donate=True).wait(), x)
        assert len(calls) == 3 and all(who is not None for who, _ in calls)
    finally:
        dist.destroy_process_group(group)


def test_backend_thread_runs_submit_on_the_calling_thread(programs):
    """A trusted one-collective program's `run_async(on_backend_thread=True)`
    after its first run submits without the worker: the input not donated
    is read at submission (changing it at once changes nothing), a run
    started from the future's callback is refused with `ConcurrentRun`
    (it would race the submitting thread), and with a run queued on the
    worker the submission queues behind it."""
    from distir.errors import ConcurrentRun

    program = distir.compile(PROGRAMS["all-reduce f32"][0], agreement=False)
    group = dist.new_group([0])
    try:
        x = torch.arange(6.0).reshape(2, 3)
        program.run_async(x.clone(), group=group).wait()  # agreed; specialised
        binding = program._bindings[group]
        submit, calls = binding.submitted[False], []
        binding.submitted[False] = lambda inputs: calls.append(1) or submit(inputs)
        y = x.clone()
        future = program.run_async(y, group=group, on_backend_thread=True)
        y.add_(100)
        assert torch.equal(future.wait(), x) and calls == [1]
        # A callback added before the work completes runs on the backend's
        # thread; one added after, at once on this thread (then it may run).
        seen = []

        def callback(done):
            off_thread = threading.current_thread() is not threading.main_thread()
            try:
                program.run(x, group=group)
                seen.append((off_thread, "ran"))
            except ConcurrentRun as e:
                seen.append((off_thread, str(e)))

        for _ in range(50):
            future = program.run_async(x, group=group, on_backend_thread=True)
            future.add_done_callback(callback)
            future.wait()
            if any(off for off, _ in seen):
                break
        assert any(off for off, _ in seen), "no callback ran on the backend's thread"
        for off_thread, what in seen:
            if off_thread:
                assert "callback of a run submitted directly" in what
            else:
                assert what == "ran"
        calls.clear()
        release = threading.Event()
        held = binding.gate.submit("held", lambda who: release.wait(20))  # the worker waits
        queued = program.run_async(x, group=group, on_backend_thread=True)
        assert calls == [1] and not queued.done()  # behind the held run
        release.set()
        held.wait()
        assert torch.equal(queued.wait(), x)
    finally:
        reset_domain(group)
        dist.destroy_process_group(group)


@pytest.mark.parametrize("trusted", [True, False])
def test_a_queued_input_changed_before_its_specialised_run_is_refused(programs, trusted):
    """The check a queued run makes when it starts (its donated input not
    changed since `run_async`) holds on the specialised path too."""
    from distir.errors import ProgramInputError

    program = distir.compile(PROGRAMS["all-reduce f32"][0], agreement=not trusted)
    group = dist.new_group([0])
    try:
        program.run_async(torch.ones(2, 3), group=group, donate=True).wait()
        binding = program._bindings[group]
        fast, calls = binding.specialised[True], []
        binding.specialised[True] = lambda inputs, *claimed: calls.append(1) or fast(
            inputs, *claimed
        )
        release = threading.Event()
        held = binding.gate.submit("held", lambda who: release.wait(20))  # the worker waits
        x = torch.ones(2, 3)
        queued = program.run_async(x, group=group, donate=True)
        x.add_(1)
        release.set()
        held.wait()
        with pytest.raises(ProgramInputError, match="modified in place after run_async"):
            queued.wait()
        assert calls == [1]
    finally:
        reset_domain(group)
        dist.destroy_process_group(group)


def _ranks_play(ctx, drawn: list[tuple[str, bool, list[dict]]]) -> list:
    out = []
    for name, trusted, runs in drawn:
        source = PROGRAMS[name][0]
        general = distir.compile(source, agreement=not trusted)
        general.specialise = False
        specialised = distir.compile(source, agreement=not trusted)
        group_g = dist.new_group([0, 1])
        group_s = dist.new_group([0, 1])
        out.append(
            (
                play(general, group_g, name, runs, ctx.rank),
                play(specialised, group_s, name, runs, ctx.rank),
            )
        )
        direct = direct_collective(specialised._bindings[group_s])
        assert (direct is not None) == (name in DIRECT), name
    return out


@pytest.mark.multirank
@given(st.lists(run_sequences(max_runs=3), min_size=4, max_size=4))
@settings(max_examples=examples(0.05))
def test_on_gloo_ranks_both_paths_agree(drawn):
    # Every rank makes the same kinds of input (a refusal is every rank's).
    per_rank = launch(_ranks_play, 2, drawn, pass_context=True, timeout=240)
    for rank_outcomes in per_rank:
        for general, specialised in rank_outcomes:
            for e, g in zip(general, specialised, strict=True):
                same_outcome(e, g)
    # Against plain torch, for runs of fresh inputs on both ranks.
    for index, (name, _, runs) in enumerate(drawn):
        specs = PROGRAMS[name][1]
        for position, spec in enumerate(runs):
            if position and any(kind.startswith("previous") for kind in spec["kinds"]):
                continue
            inputs = [
                [
                    make_input(kind, dtype, shape, spec["seed"] + i, rank, None)
                    for i, (kind, (dtype, shape)) in enumerate(zip(spec["kinds"], specs))
                ]
                for rank in range(2)
            ]
            for rank in range(2):
                outcome = per_rank[rank][index][0][position]
                if outcome[0] != "ran":
                    continue
                want = expected_values(name, inputs, rank)
                for w, have in zip(want, outcome[1], strict=True):
                    assert torch.equal(w.to(have.dtype), have)


def _late_peer(ctx) -> tuple[str, float]:
    import time

    program = distir.compile(PROGRAMS["all-reduce f32"][0], agreement=False, deadline=2)
    x = torch.ones(2, 3)
    program.run_async(x, on_backend_thread=True).wait()  # agreed: direct from here on
    assert program._bindings[None].submitted
    dist.barrier()
    if ctx.rank == 1:
        time.sleep(5)  # never joins the run within rank 0's deadline
        return "late", 0.0
    start = time.monotonic()
    future = program.run_async(x, on_backend_thread=True)
    try:
        future.wait()
        outcome = "completed"
    except DistirError as e:
        outcome = type(e).__name__
    waited = time.monotonic() - start
    try:
        program.run(x)
    except DistirError as e:
        outcome += f", then {type(e).__name__}"
    return outcome, waited


@pytest.mark.multirank
def test_a_backend_thread_run_whose_peer_is_late_ends_at_its_deadline():
    """The backend's own timeout is a direct run's deadline: a peer that
    never joins is `DeadlineExceeded` within the deadline plus 2 s, and
    the group is poisoned after it."""
    outcomes = launch(_late_peer, 2, pass_context=True, timeout=60)
    outcome, waited = outcomes[0]
    assert outcome == "DeadlineExceeded, then Poisoned", outcomes
    assert 1.9 <= waited <= 4.0, waited
