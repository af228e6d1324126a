"""`distir.launch` and `distir-run` own their rank processes: signals are
forwarded, ranks are waited for together, none survives its parent (not even
a SIGKILLed one), and what ranks could not import is refused up front."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import distir
from distir.runtime.launch import LaunchError, launch

ROOT = Path(__file__).resolve().parents[2]
# "At once" after a signal: far below what the signalled run would take, far
# above the launcher's 1 s grace, so a loaded machine does not fail it.
SIGNAL_EXIT_BOUND_S = 10.0
LONG_RUN = ["examples/all_reduce.mlir", "--nproc", "2", "--repeat", "1000000000", "--timeout", "200"]


# Rank processes, seen from outside -----------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # The command name may hold spaces: fields start after its closing paren.
    return text[text.rindex(")") + 2 :].split()


def _start_time(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[19] if fields else None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _children(parent: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True)
    return list(map(int, found.stdout.split()))


def rank_processes(parent: int) -> dict[int, str]:
    """pid -> start time of the rank processes `parent` started: spawned
    children, or children of its fork server (not its multiprocessing
    resource tracker, not the fork server itself)."""
    ranks = {}
    for pid in _children(parent):
        command = _cmdline(pid)
        candidates = _children(pid) if "forkserver" in command else [pid]
        for rank in candidates:
            start = _start_time(rank)
            if start is not None and ("spawn_main" in command or rank != pid):
                ranks[rank] = start
    return ranks


def alive(ranks: dict[int, str]) -> list[int]:
    """The processes of `ranks` that still run (zombies and reused pids do not)."""
    left = []
    for pid, start in ranks.items():
        fields = _stat(pid)
        if fields and fields[0] != "Z" and fields[19] == start:
            left.append(pid)
    return left


def wait_for_ranks(proc: subprocess.Popen, count: int, *, running: bool, timeout: float = 90):
    """The rank processes of `proc` once `count` exist; with `running`, once
    each has entered its rank (named distir-rank-N) rather than still
    starting its interpreter."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        ranks = rank_processes(proc.pid)
        if len(ranks) == count and (
            not running or all(_comm(pid).startswith("distir-rank-") for pid in ranks)
        ):
            return ranks
        time.sleep(0.02)
    proc.kill()
    raise AssertionError(f"{count} ranks did not start: {proc.communicate()}")


def wait_for_files(proc: subprocess.Popen, paths: list[Path], timeout: float = 90) -> None:
    """Returns once every one of `paths` exists: each written by a rank when
    it reaches a point of its run (an event, rather than a guessed sleep)."""
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert proc.poll() is None, proc.communicate()
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"ranks did not reach {paths}: {proc.communicate()}")
        time.sleep(0.02)


def assert_gone_within(ranks: dict[int, str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while alive(ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = alive(ranks)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"rank processes {survivors} outlived their parent"


def start(args: list[str], **kwargs) -> subprocess.Popen:
    # A session of its own: signals reach only the process they are sent to.
    return subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, **kwargs,
    )


def start_distir_run(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return start([sys.executable, "-m", "distir.cli.run", *args], env=env)


#: inputs for LONG_RUN's program that also tell the test, by a file per
#: rank, that the rank is past its start-up and about to enter its runs
MARKING_INPUTS = """\
import os
from pathlib import Path

import torch


def make_inputs(rank, world_size):
    Path(os.environ["DISTIR_TEST_MARKS"], f"rank{rank}").touch()
    return [torch.arange(8, dtype=torch.int64), torch.full((8,), 7, dtype=torch.int64)]
"""


# distir-run ------------------------------------------------------------------------------


@pytest.mark.multirank
@pytest.mark.timeout(150)
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_distir_run_stops_every_rank_and_exits_at_once(
    tmp_path, signum, status
) -> None:
    inputs = tmp_path / "inputs.py"
    inputs.write_text(MARKING_INPUTS)
    env = dict(os.environ, DISTIR_TEST_MARKS=str(tmp_path))
    proc = start_distir_run(*LONG_RUN, "--inputs", str(inputs), env=env)
    ranks = wait_for_ranks(proc, 2, running=True)
    wait_for_files(proc, [tmp_path / "rank0", tmp_path / "rank1"])  # past start-up
    sent = time.monotonic()
    os.kill(proc.pid, signum)  # the parent only, as `kill PID` does
    out, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    assert proc.returncode == status, (proc.returncode, err)
    # The launcher's grace is 1 s; left alone the run lasts 200 s. The margin
    # is for a loaded machine, where ranks with torch loaded take time to die.
    assert took < SIGNAL_EXIT_BOUND_S, f"exited {took:.1f} s after {signum.name}"
    assert "Traceback" not in err + out, err
    assert f"({signum.name}); no rank is left running" in err
    assert_gone_within(ranks, 3.0)


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_a_signal_while_ranks_start_is_not_a_traceback_and_stops_them() -> None:
    proc = start_distir_run(*LONG_RUN)
    # Their interpreters are still starting: the signal must not reach them as
    # a KeyboardInterrupt in the middle of an import.
    ranks = wait_for_ranks(proc, 2, running=False)
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err + out, err
    assert_gone_within(ranks, 3.0)


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_no_rank_outlives_a_sigkilled_distir_run() -> None:
    proc = start_distir_run(*LONG_RUN)
    ranks = wait_for_ranks(proc, 2, running=True)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert_gone_within(ranks, 5.0)


@pytest.mark.multirank
@pytest.mark.timeout(150)
def test_no_rank_outlives_a_parent_sigkilled_while_it_starts_them() -> None:
    proc = start_distir_run(*LONG_RUN)
    ranks = wait_for_ranks(proc, 2, running=False)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    # A rank that had not yet asked to die with its parent sees, once it
    # does, that its parent is gone, and exits (interpreter start-up on a
    # loaded machine takes seconds).
    assert_gone_within(ranks, 30.0)


# distir.launch from a script ----------------------------------------------------------------


SCRIPT = """\
import sys
import time
from pathlib import Path

import distir


def sleeper(ctx, marks):
    Path(marks, f"rank{ctx.rank}").touch()  # the test's event: this rank runs
    time.sleep(600)


if __name__ == "__main__":
    try:
        distir.launch(sleeper, 2, sys.argv[1], pass_context=True, timeout=300)
    except KeyboardInterrupt:
        print("KeyboardInterrupt from launch", flush=True)
        sys.exit(7)
"""


@pytest.mark.multirank
@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("signum", "status", "printed"),
    [(signal.SIGINT, 7, "KeyboardInterrupt from launch"), (signal.SIGTERM, -signal.SIGTERM, "")],
)
def test_launch_forwards_a_signal_then_lets_it_act_on_the_caller(
    tmp_path, signum, status, printed
) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = start([sys.executable, str(script), str(tmp_path)], env=env)
    ranks = wait_for_ranks(proc, 2, running=True)
    wait_for_files(proc, [tmp_path / "rank0", tmp_path / "rank1"])  # inside `sleeper`
    sent = time.monotonic()
    os.kill(proc.pid, signum)
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < SIGNAL_EXIT_BOUND_S  # left alone: 600 s
    # SIGINT: KeyboardInterrupt raised from launch; SIGTERM: the default action.
    assert proc.returncode == status, (proc.returncode, err)
    assert printed in out
    assert "Traceback" not in err, err
    assert_gone_within(ranks, 3.0)


# What ranks cannot import is refused before any starts ------------------------------------


def module_level(ctx):
    return ctx.rank


def test_a_lambda_is_refused() -> None:
    with pytest.raises(TypeError, match="got a lambda"):
        launch(lambda: 1, 2)


def test_a_nested_function_is_refused() -> None:
    def nested():
        return 1

    with pytest.raises(TypeError, match=r"test_a_nested_function_is_refused.<locals>.nested, "
                                        r"defined inside another function"):
        launch(nested, 2)


def test_a_function_of_an_interactive_session_is_refused(monkeypatch) -> None:
    # What a function typed at the REPL or in a notebook looks like: its
    # module is a __main__ without a file, which no rank can import.
    namespace: dict = {"__name__": "__main__"}
    exec("def typed_in(ctx):\n    return 1\n", namespace)
    main = type(sys)("__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    with pytest.raises(TypeError, match="defined in an interactive session"):
        launch(namespace["typed_in"], 2, pass_context=True)


def test_an_unpicklable_callable_is_refused() -> None:
    class NotImportable:
        def __call__(self):
            return 1

    with pytest.raises(TypeError, match="cannot send"):
        launch(NotImportable(), 1)


@pytest.mark.parametrize("nproc", [0, -1, 1.5, True])
def test_nproc_must_be_a_positive_integer(nproc) -> None:
    with pytest.raises(ValueError, match="nproc must be an integer >= 1"):
        launch(module_level, nproc, pass_context=True)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"timeout": 0}, ValueError),
        ({"timeout": "60"}, TypeError),
        ({"collective_timeout": timedelta(seconds=-1)}, ValueError),
        ({"collective_timeout": float("inf")}, ValueError),
    ],
)
def test_bad_durations_are_refused_before_any_rank_starts(kwargs, error) -> None:
    with pytest.raises(error, match="timeout"):
        launch(module_level, 2, pass_context=True, **kwargs)


def test_the_docstring_documents_the_spawn_guard_and_each_time_parameter() -> None:
    doc = distir.launch.__doc__
    assert 'if __name__ == "__main__":' in doc
    assert "runs once in every rank" in doc
    assert "timeout: seconds (or a timedelta) the whole launch may take" in doc
    assert "collective_timeout: seconds (or a timedelta)" in doc


# Ranks, from inside ----------------------------------------------------------------------


def describe_rank(ctx):
    with open("/proc/self/comm") as f:
        comm = f.read().strip()
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "TORCHELASTIC_RUN_ID")
    return comm, {name: os.environ.get(name) for name in names}


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_ranks_see_their_own_rendezvous_not_a_stale_one(monkeypatch) -> None:
    for name, value in {"RANK": "5", "WORLD_SIZE": "7", "MASTER_ADDR": "10.0.0.1",
                        "TORCHELASTIC_RUN_ID": "stale"}.items():
        monkeypatch.setenv(name, value)
    results = launch(describe_rank, 2, pass_context=True, timeout=timedelta(seconds=90),
                     collective_timeout=timedelta(seconds=30))
    for rank, (comm, env) in enumerate(results):
        assert comm == f"distir-rank-{rank}"
        assert env == {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "TORCHELASTIC_RUN_ID": None}


def linger(ctx):
    # The result is sent, but a non-daemon thread keeps the process alive.
    threading.Thread(target=time.sleep, args=(600,), daemon=False).start()
    return time.time()


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_lingering_ranks_are_waited_for_together_not_in_turn() -> None:
    results = launch(linger, 3, pass_context=True, timeout=100)
    # Waiting 5 s per rank in turn would take 15 s here; together, 5 s.
    assert time.time() - max(results) < 9.0


def exit_on_rank_one(ctx):
    if ctx.rank == 1:
        os._exit(3)
    time.sleep(600)


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_a_rank_that_dies_without_a_result_is_reported_and_its_peers_stopped() -> None:
    with pytest.raises(LaunchError) as info:
        launch(exit_on_rank_one, 2, pass_context=True, timeout=100, collective_timeout=1)
    failures = info.value.failures
    assert failures[1] == "exited with code 3 without a result"
    assert failures[0].startswith("did not finish in time (still running 3 s after another")


def stop_half_way_through_the_report(ctx):
    import distir.runtime.launch.reports as launching

    if ctx.rank == 1:

        def write_part_then_stop(fd: int, data: bytes) -> None:
            os.write(fd, data[: 1 << 12])  # a part the pipe holds: never blocks
            os.kill(os.getpid(), signal.SIGSTOP)

        launching._write_all = write_part_then_stop
    return b"x" * (1 << 20)  # more than a pipe holds


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_a_rank_stopped_half_way_through_its_result_cannot_hold_the_launch() -> None:
    # The launcher read a report with Connection.recv, which waits for the
    # whole message: a rank stopped in the middle of it held the launch
    # past its timeout, for ever.
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(stop_half_way_through_the_report, 2, pass_context=True, timeout=15)
    assert time.monotonic() - start < 15 + 5
    assert set(info.value.failures) == {1}
    assert info.value.failures[1].startswith("did not finish in time (killed after the 15 s")
    assert info.value.results == {0: b"x" * (1 << 20)}


@settings(deadline=None)
@given(
    value=st.binary(max_size=1 << 18) | st.integers() | st.text(),
    cuts=st.lists(st.floats(0, 1), max_size=6),
    ends_early=st.booleans(),
)
def test_a_report_is_read_as_it_arrives_and_never_waited_for(value, cuts, ends_early) -> None:
    # Property: whatever pieces a report arrives in, reading returns None
    # (without waiting) until its last byte, then the report; a rank that
    # ends before its last byte is EOFError, never a wait.
    import pickle
    from multiprocessing import Pipe

    from distir.runtime.launch.reports import _REPORT_HEADER, ReportReader

    data = pickle.dumps((True, value))
    frame = _REPORT_HEADER.pack(len(data)) + data
    points = sorted({int(c * len(frame)) for c in cuts} - {0, len(frame)})
    if ends_early and not points:
        points = [len(frame) // 2]
    reader, writer = Pipe(duplex=False)
    reports = ReportReader(reader)
    pieces = [frame[a:b] for a, b in zip([0, *points], [*points, len(frame)])]
    if ends_early:
        pieces = pieces[:-1]
    slowest = 0.0

    def read() -> object:
        nonlocal slowest
        start = time.monotonic()
        got = reports.read()
        slowest = max(slowest, time.monotonic() - start)
        return got

    try:
        for i, piece in enumerate(pieces):
            # A piece may exceed what the pipe holds: written from a thread
            # while this one reads.
            writing = threading.Thread(target=os.write, args=(writer.fileno(), piece))
            writing.start()
            seen = []
            give_up = time.monotonic() + 10
            while writing.is_alive() and time.monotonic() < give_up:
                seen.append(read())
            writing.join(10)
            seen.append(read())
            found = [got for got in seen if got is not None]
            if i == len(pieces) - 1 and not ends_early:
                assert found and all(got == (True, value) for got in found)
            else:
                assert found == []
        if ends_early:
            writer.close()
            with pytest.raises(EOFError):
                reports.read()
    finally:
        writer.close()
        reader.close()
    assert slowest < 2.0


def test_the_launch_module_names_torchrun_by_its_marker() -> None:
    from distir.runtime.launch import stale_rendezvous_variables, under_torchrun

    stale = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}
    assert not under_torchrun(stale)
    assert stale_rendezvous_variables(stale) == ["RANK", "WORLD_SIZE", "MASTER_ADDR"]
    torchrun = dict(stale, TORCHELASTIC_RUN_ID="job")
    assert under_torchrun(torchrun)
    assert stale_rendezvous_variables(torchrun) == []



def register_exit_marker(ctx, directory):
    import atexit
    import pathlib

    # Interpreter finalisation would run this; a rank that reported its
    # result ends without it (gloo's C++ threads abort the process when
    # destroyed at exit after a deadline: "terminate called without an
    # active exception").
    atexit.register(lambda: (pathlib.Path(directory) / f"finalised-{ctx.rank}").touch())
    return ctx.rank


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_ranks_end_without_interpreter_finalisation_after_reporting(tmp_path) -> None:
    assert launch(register_exit_marker, 2, str(tmp_path), pass_context=True, timeout=90) == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# How ranks start: forked from a server that has torch imported, seeing the launcher as it is now


def where_am_i(ctx, directory):
    import torch  # noqa: F401  (imported by the server already when forked)

    print(f"out of rank {ctx.rank}", flush=True)
    print(f"err of rank {ctx.rank}", file=sys.stderr, flush=True)
    return {
        "parent": os.getppid(),
        "variable": os.environ.get("DISTIR_TEST_VARIABLE"),
        "cwd": os.getcwd(),
        "torch_preloaded_before_fn": "torch" in sys.modules,
        "written": Path(directory, "seen").read_text(),
    }


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_a_second_launch_forks_ranks_that_see_the_launcher_as_it_is_now(
    tmp_path, monkeypatch, capfd
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for d in (first, second):
        d.mkdir()
        (d / "seen").write_text(d.name)
    monkeypatch.chdir(first)
    monkeypatch.setenv("DISTIR_TEST_VARIABLE", "before")
    launch(where_am_i, 2, str(first), pass_context=True, timeout=90)
    capfd.readouterr()
    # Everything a rank could inherit changes after the server has started.
    monkeypatch.chdir(second)
    monkeypatch.setenv("DISTIR_TEST_VARIABLE", "after")
    results = launch(where_am_i, 2, ".", pass_context=True, timeout=90)  # relative to cwd
    out, err = capfd.readouterr()
    for rank, seen in enumerate(results):
        # forked: the parent is the fork server, not this process
        assert seen["parent"] != os.getpid()
        assert seen["variable"] == "after"
        assert seen["cwd"] == str(second)
        assert seen["written"] == "second"
        assert f"out of rank {rank}" in out and f"err of rank {rank}" in err


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_a_variable_read_at_interpreter_start_makes_ranks_fresh_interpreters(
    tmp_path, monkeypatch
) -> None:
    (tmp_path / "seen").write_text("x")
    launch(where_am_i, 1, str(tmp_path), pass_context=True, timeout=90)  # the server runs
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # libgomp reads it when torch loads
    (spawned,) = launch(where_am_i, 1, str(tmp_path), pass_context=True, timeout=90)
    assert spawned["parent"] == os.getpid()
    monkeypatch.delenv("OMP_NUM_THREADS")
    (forked,) = launch(where_am_i, 1, str(tmp_path), pass_context=True, timeout=90)
    assert forked["parent"] != os.getpid()


def _quit_at_once(ctx, quitter: int, mode: str) -> dict:
    """Every rank first records which ranks' process groups were up when it
    reached `fn` (the launcher's store, where ranks say so); the quitter
    then ends at once."""
    from distir.runtime import membership
    from distir.runtime.launch.rendezvous import _READY_KEY

    store = membership._job_store
    up = [r for r in range(ctx.world_size) if store.check([_READY_KEY.format(r)])]
    if ctx.rank == quitter:
        if mode == "exit":
            os._exit(3)
        raise RuntimeError("quits at once")
    return {"up": up}


@pytest.mark.multirank
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("nproc", "quitter", "mode"), [(2, 0, "exit"), (3, 2, "exit"), (3, 1, "raise"), (4, 0, "raise")]
)
def test_every_rank_reaches_fn_only_once_every_process_group_is_up(nproc, quitter, mode):
    # A rank that ends at once in fn must not fail a slower peer's start-up:
    # every survivor reaches fn, sees every rank up, and reports.
    with pytest.raises(LaunchError) as caught:
        launch(_quit_at_once, nproc, quitter, mode, pass_context=True, timeout=60)
    survivors = caught.value.results
    assert sorted(survivors) == [r for r in range(nproc) if r != quitter], caught.value.failures
    assert all(report["up"] == list(range(nproc)) for report in survivors.values()), survivors
    assert list(caught.value.failures) == [quitter], caught.value.failures
