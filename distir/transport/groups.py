"""Process groups: what an implementation needs to talk to a group.

A `ProcessGroupResource` wraps one initialised torch.distributed group: the
rank's position in it, completion of async work under the run's deadline,
and the agreement exchange that runs before a payload (a fixed-size row per
rank: "accepted" and a digest of what must be equal, see
`core.checks`). Ranks in IR are ranks of the op's group;
`global_rank` converts one for the few PyTorch calls that still want one.

The groups a module declares are validated (ranks beyond the base group are
a named error on every rank, before any rank calls `new_group`), created
under the program's deadline, and cached: programs with the same
declaration on the same base group share the same process groups, so a
process that compiles a thousand programs creates them once.
"""

from __future__ import annotations

import functools
import pickle
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from distir.core.checks import (
    Precondition,
    evaluate,
    mismatch,
)
from distir.core.invocation import Invocation
from distir.errors import (
    CollectiveFailed,
    DeadlineExceeded,
    DistirError,
)
from distir.ir.dialect import GroupDeclaration
from distir.transport.domain import (
    ExecutionDomain,
    StoreUnavailable,
    call_bounded,
    domain_for,
    group_alive,
)
from distir.transport.protocol import Abort, Capabilities, Occasion, Work

DEFAULT_DEADLINE_S = 60.0

#: the precondition of an op that needs no agreement
NOTHING_TO_CHECK = Precondition()

#: Element types gloo's collectives take (measured on torch 2.13: any other,
#: int16, uint16, uint32 or uint64, raises "Invalid scalar type" inside the
#: collective). Reductions are limited to these (native all-reduces of other
#: types are refused at compile time); data moves send other types as bytes.
COLLECTIVE_DTYPES = frozenset(
    {
        torch.bool, torch.int8, torch.uint8, torch.int32, torch.int64,
        torch.float16, torch.bfloat16, torch.float32, torch.float64,
    }
)  # fmt: skip

#: a c10d options object (the options classes share no base class)
Options = (
    dist.AllreduceOptions | dist.BroadcastOptions | c10d.AllgatherOptions
    | dist.ReduceScatterOptions | dist.GatherOptions | dist.ScatterOptions
    | dist.ReduceOptions | c10d.AllToAllOptions
)  # fmt: skip

#: what each c10d backend declares (`ProcessGroupResource.capabilities`):
#: gloo takes CPU tensors, NCCL CUDA tensors; both are sent the types above
#: as they are and the others as bytes (measured on gloo; NCCL's are taken
#: to be gloo's until measured on a GPU); every c10d group has the
#: rendezvous store its ranks met in. A backend not listed is taken as gloo.
BACKEND_CAPABILITIES = {
    "gloo": Capabilities(
        devices=frozenset({"cpu"}), moves=COLLECTIVE_DTYPES, reduces=COLLECTIVE_DTYPES,
        store=True, abort=Abort.DEADLINE,
    ),
    "nccl": Capabilities(
        devices=frozenset({"cuda"}), moves=COLLECTIVE_DTYPES, reduces=COLLECTIVE_DTYPES,
        store=True, abort=Abort.COMMUNICATOR,
    ),
}  # fmt: skip


def as_bytes(t: torch.Tensor, *, written: bool = False) -> torch.Tensor:
    """A tensor of a type gloo cannot move, as the uint8 view of its rows
    (dim 0 keeps its length, so row splits stay valid); others unchanged.
    Broadcast, gather and all-to-all only move bytes. A tensor the
    collective only reads may be strided (it is copied); one it writes must
    be contiguous, since a copy would silently drop what it receives."""
    if t.dtype in COLLECTIVE_DTYPES:
        return t
    if not t.is_contiguous():
        if written:
            raise DistirError(
                f"internal: a collective would write a strided {t.dtype} buffer through a copy"
            )
        t = t.contiguous()
    # A contiguous tensor may still carry any stride on a size-1 dim, which
    # view() refuses; the canonical strides address the same elements.
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.append(step)
        step *= max(size, 1)
    t = t.as_strided(t.shape, tuple(reversed(strides)), t.storage_offset())
    rows = t.shape[0] if t.dim() else 1
    return t.reshape(rows, t.numel() // rows if rows else 0).view(torch.uint8)



class Step:
    """Names an exchange that is not an op's (program agreement, group
    creation) in errors, as an Invocation does."""

    def __init__(self, description: str):
        self.description = description
        self.options: dict[str, object] = {}


@functools.lru_cache(maxsize=64)
def _timeout(deadline_s: float) -> timedelta:
    """A deadline as the backend's timeout, built once per value (it is
    passed on every collective of every run)."""
    return timedelta(seconds=deadline_s)


class ProcessGroupResource:
    """One initialised process group (`None` means the default group): the
    c10d `Transport` (`transport.protocol`)."""

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        name: str | None = None,
        domain: ExecutionDomain | None = None,
    ):
        if not dist.is_initialized():
            raise DistirError(
                "torch.distributed is not initialised: call distir.launch, run under "
                "distir-run or torchrun, or init_process_group first"
            )
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self._global = [
            dist.get_global_rank(group, r) if group is not None else r
            for r in range(self.size)
        ]
        # Named as it is: a group `recover()` formed is not the world, and
        # an error on it names its (original) ranks.
        self.name = name or ("world" if group is None else f"of ranks {self._global}")
        self.backend = str(dist.get_backend(group))
        self.capabilities = BACKEND_CAPABILITIES.get(self.backend, BACKEND_CAPABILITIES["gloo"])
        #: the process group object the collectives are submitted to
        self.pg = group if group is not None else c10d._get_default_group()
        #: whether collectives that are waited for at once run inline (gloo)
        self.inline = self.backend == "gloo"
        self._cached_options: dict[tuple, tuple[Options, timedelta]] = {}
        #: row length -> the arrays and tensors of `exchange_rows`
        self._row_buffers: dict[int, tuple] = {}
        self.domain = domain if domain is not None else domain_for(group)
        #: where exchange rows live: NCCL only moves CUDA tensors
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if "cpu" not in self.capabilities.devices
            else torch.device("cpu")
        )
        #: seconds a collective may take; set by the program for each run
        self.deadline_s = DEFAULT_DEADLINE_S
        #: whether ops exchange preconditions before their payload; set per run
        self.agreement = True
        #: preconditions checked and agreed at the start of this run, by
        #: `Invocation.options["hoisted"]` index
        self.hoisted: Sequence[Precondition] = ()
        #: the receive counts of the variable all-to-all whose send counts
        #: rode in this run's agreement (valid while `hoisted` is set)
        self.agreed_counts: list[int] = []

    # -- completion under a deadline --------------------------------------------

    def deadline_for(self, invocation: Occasion) -> float:
        return invocation.options.get("deadline_s") or self.deadline_s

    def complete(self, work: Work, invocation: Occasion) -> None:
        """Waits for an async collective, at most until its deadline."""
        deadline = self.deadline_for(invocation)
        start = time.monotonic()
        try:
            work.wait(timeout=_timeout(deadline))
        except RuntimeError as e:
            raise self.failure(e, invocation, time.monotonic() - start) from None

    def failure(self, error: RuntimeError, invocation: Occasion, waited: float = 0.0) -> DistirError:
        """A backend error as a named distir error (and the cause a peer
        published, if any)."""
        text = _backend_message(error)
        # The failure path may read the store: did a peer fail and say why,
        # and did the survivors move on without this rank?
        published, excluded = self.domain.failure_evidence()
        if excluded is not None:
            return excluded
        cause = ""
        if published:
            who, _, why = published.partition(": ")
            cause = f"; {who} failed first: {why}"
        deadline = self.deadline_for(invocation)
        if "pair closure" in text.lower():
            # gloo closed every pair of this group when an earlier op timed out.
            return CollectiveFailed(
                invocation.description,
                f"group {self.name} cannot run collectives any more: its connections were "
                "closed when an earlier collective timed out (call distir.recover() on the "
                f"survivors to form a new group){cause}",
            )
        # A peer that gave up at its own deadline closes the connection just
        # before ours expires: the op did not complete within its deadline.
        if "timed out" in text.lower() or "timeout" in text.lower() or waited >= 0.95 * deadline:
            return DeadlineExceeded(
                invocation.description,
                f"did not complete within its {deadline:g} s deadline on group "
                f"{self.name} (rank {self.rank} of {self.size} waited {waited:.2f} s; "
                f"a peer is late, hung or running something else{cause})",
            )
        lost_peer = any(word in text.lower() for word in ("connection", "closed", "reset", "peer"))
        return CollectiveFailed(
            invocation.description,
            f"the {self.backend} backend failed on group {self.name} after "
            f"{waited:.2f} s{' (a peer may have exited)' if lost_peer else ''}{cause}: {text}",
        )

    # -- collectives, submitted under the deadline -------------------------------
    #
    # Straight to the process group (not through torch.distributed's Python
    # wrappers, 3-5 us per call) with the op's deadline as the backend's own
    # timeout. With `wait`, the call returns once the collective is done (a
    # backend error raises as a named distir error; a gloo timeout closes the
    # group's pairs, which the poisoned domain never uses again). This is the
    # c10d sequence of `dist.all_reduce(t)` exactly: one submit and one
    # `wait`, with options built once. `asyncOp` changes nothing on gloo
    # (torch 2.13, measured: the work runs on gloo's worker thread either way,
    # submit 17-21 us and wait 146-159 us at 4 KiB, P=2). Without `wait`, the
    # call returns the work for `complete` (waves submit before they wait).

    def _options(
        self, kind: type[Options], invocation: Occasion, wait: bool, *fields: tuple[str, object]
    ) -> tuple[Options, timedelta]:
        """The backend's options for one call and their timeout, reused
        across calls (options hold no tensors): `kind` (an options class),
        the deadline as its timeout, `asyncOp` off when the call runs
        inline, and `fields` (name, value) pairs. The lookup is one dict
        probe on a flat key: it runs on every collective of every run (and
        the timeout is kept beside the options: reading `opts.timeout`
        converts it anew)."""
        deadline = self.deadline_for(invocation)
        key = (kind, deadline, wait, *fields)
        cached = self._cached_options.get(key)
        if cached is None:
            opts = kind()
            opts.timeout = timeout = _timeout(deadline)
            opts.asyncOp = not (wait and self.inline)
            for name, value in fields:
                setattr(opts, name, value)
            cached = self._cached_options[key] = (opts, timeout)
        return cached

    def _run(
        self, submit: Callable[..., dist.Work], args: tuple, options: tuple[Options, timedelta],
        invocation: Occasion, wait: bool,
    ) -> Work:
        """`submit(*args, opts)` (a process group's method), then (with
        `wait`) its completion; a backend error on the way raises as a named
        distir error."""
        opts, timeout = options
        start = time.monotonic()
        try:
            work = submit(*args, opts)
            if not wait:
                return work
            work.wait(timeout=timeout)
        except RuntimeError as e:
            raise self.failure(e, invocation, time.monotonic() - start) from None
        return None

    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp, invocation: Occasion, wait: bool = False) -> Work:
        opts = self._options(dist.AllreduceOptions, invocation, wait, ("reduceOp", op))
        return self._run(self.pg.allreduce, ([tensor],), opts, invocation, wait)

    def broadcast(
        self, tensor: torch.Tensor, root: int, invocation: Occasion, wait: bool = False
    ) -> Work:
        """`root` is a rank of this group."""
        opts = self._options(dist.BroadcastOptions, invocation, wait, ("rootRank", root),
                             ("rootTensor", 0))  # fmt: skip
        if tensor.dtype not in self.capabilities.moves:
            tensor = as_bytes(tensor, written=True)
        return self._run(self.pg.broadcast, ([tensor],), opts, invocation, wait)

    def all_gather(
        self, out: torch.Tensor, tensor: torch.Tensor, invocation: Occasion, wait: bool = False
    ) -> Work:
        opts = self._options(c10d.AllgatherOptions, invocation, wait)
        out, tensor = as_bytes(out, written=True), as_bytes(tensor)
        return self._run(self.pg.all_gather_single, (out, tensor), opts, invocation, wait)

    def reduce_scatter(
        self, out: torch.Tensor, tensor: torch.Tensor, op: dist.ReduceOp, invocation: Occasion,
        wait: bool = False,
    ) -> Work:
        """`out` = this rank's part (rows `rank·n/P` on) of the reduction of
        every rank's contiguous `tensor`: the backend's own reduce-scatter."""
        opts = self._options(dist.ReduceScatterOptions, invocation, wait, ("reduceOp", op))
        return self._run(self.pg._reduce_scatter_base, (out, tensor), opts, invocation, wait)

    def gather(
        self, parts: Sequence[torch.Tensor], tensor: torch.Tensor, root: int, invocation: Occasion,
        wait: bool = False,
    ) -> Work:
        """Every rank's contiguous `tensor` (one shape everywhere) into the
        root's `parts` (P buffers; empty on the other ranks)."""
        opts = self._options(dist.GatherOptions, invocation, wait, ("rootRank", root))
        outs = [as_bytes(p, written=True) for p in parts]
        return self._run(self.pg.gather, ([outs] if outs else [], [as_bytes(tensor)]), opts,
                         invocation, wait)  # fmt: skip

    def scatter(
        self, out: torch.Tensor, parts: Sequence[torch.Tensor], root: int, invocation: Occasion,
        wait: bool = False,
    ) -> Work:
        """The root's `parts[rank]` (P contiguous buffers of `out`'s shape;
        none on the other ranks) into every rank's `out`."""
        opts = self._options(dist.ScatterOptions, invocation, wait, ("rootRank", root))
        ins = [as_bytes(p) for p in parts]
        return self._run(self.pg.scatter, ([as_bytes(out, written=True)], [ins] if ins else []),
                         opts, invocation, wait)  # fmt: skip

    def reduce(
        self, tensor: torch.Tensor, op: dist.ReduceOp, root: int, invocation: Occasion, wait: bool = False
    ) -> Work:
        """The reduction of every rank's contiguous `tensor` into the root's
        (the other ranks' `tensor` may be overwritten)."""
        opts = self._options(dist.ReduceOptions, invocation, wait, ("reduceOp", op),
                             ("rootRank", root), ("rootTensor", 0))  # fmt: skip
        return self._run(self.pg.reduce, ([tensor],), opts, invocation, wait)

    def all_to_all(
        self, out: torch.Tensor, tensor: torch.Tensor, out_splits: Sequence[int],
        in_splits: Sequence[int], invocation: Occasion, wait: bool = False,
    ) -> Work:
        opts = self._options(c10d.AllToAllOptions, invocation, wait)
        outs, ins = list(out_splits), list(in_splits)
        out, tensor = as_bytes(out, written=True), as_bytes(tensor)
        return self._run(self.pg.all_to_all_single, (out, tensor, outs, ins), opts, invocation,
                         wait)  # fmt: skip

    # -- exchanges of small rows ---------------------------------------------------

    def exchange_rows(self, row: Sequence[int], invocation: Occasion) -> list[list[int]]:
        """Every rank's `row` of int64 (all ranks pass rows of one length).

        An all-to-all of the row repeated P times: the same data as an
        all-gather, in one exchange step where gloo's all-gather takes P - 1
        (at P=4 on two cores: 1.0 ms against 3.7 ms). On CPU the row goes
        through two int64 arrays kept per row length and shared with their
        tensors, so an exchange allocates nothing and converts no list to a
        tensor (it runs on every verified run: 4 us of the 5 it cost went
        into `torch.tensor` and `tolist`). The buffers are safe to reuse: the
        exchange completes before this returns, and the runs of a group, the
        only users of its resources, execute one at a time."""
        k, size = len(row), self.size
        if self.device.type != "cpu":
            mine = torch.tensor(list(row) * size, dtype=torch.int64, device=self.device)
            rows = torch.empty(size * k, dtype=torch.int64, device=self.device)
            self.all_to_all(rows, mine, [k] * size, [k] * size, invocation, wait=True)
            return rows.view(size, -1).tolist()
        buffers = self._row_buffers.get(k)
        if buffers is None:
            send, received = array("q", bytes(8 * k * size)), array("q", bytes(8 * k * size))
            buffers = self._row_buffers[k] = (
                send, torch.frombuffer(send, dtype=torch.int64),
                received, torch.frombuffer(received, dtype=torch.int64),
            )  # fmt: skip
        send, send_t, received, received_t = buffers
        send[:] = array("q", row) * size
        opts = self._options(c10d.AllToAllOptions, invocation, True)
        # even splits: the backend cuts k words per peer
        self._run(self.pg.alltoall_base, (received_t, send_t, [], []), opts, invocation, True)
        flat = received.tolist()
        return [flat[r * k : (r + 1) * k] for r in range(size)]

    def gather_objects(self, obj: object, invocation: Occasion) -> list[object]:
        """Every rank's picklable `obj`, under the deadline (failure paths)."""
        payload = pickle.dumps(obj)
        sizes = self.exchange_rows([len(payload)], invocation)
        widest = max(size for (size,) in sizes)
        padded = torch.zeros(widest, dtype=torch.uint8)
        padded[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        out = torch.empty(self.size * widest, dtype=torch.uint8, device=self.device)
        self.all_gather(out, padded.to(self.device), invocation, wait=True)
        rows = out.view(self.size, widest).cpu()
        return [pickle.loads(bytes(rows[r, :n].tolist())) for r, (n,) in enumerate(sizes)]

    # -- preconditions ---------------------------------------------------------------

    def local_precondition(
        self, invocation: Invocation, inputs: Sequence[torch.Tensor]
    ) -> Precondition:
        """The op's precondition on this rank, not yet agreed: the one
        checked at the start of the run when the op's was hoisted there,
        else its rule (`options["rule"]`, found at compile time) evaluated
        on `inputs`."""
        options = invocation.options
        hoisted = options.get("hoisted")
        if hoisted is not None and self.hoisted:
            return self.hoisted[hoisted]
        rule = options.get("rule")  # found at compile time for every op that agrees
        if rule is None:
            return NOTHING_TO_CHECK
        return evaluate(rule, invocation, inputs, self.size, self.rank)

    def precondition(
        self, invocation: Invocation, inputs: Sequence[torch.Tensor]
    ) -> Precondition:
        """The op's precondition on this rank, agreed with the group.

        Ops that need no agreement (decided at compile time from the IR, the
        same on every rank: `options["agree"]`) have nothing to check here.
        Hoisted preconditions were checked and agreed at the start of the
        run. Otherwise, when the run has agreement on, ranks exchange an
        "accepted" flag and a digest before any payload; a disagreement
        raises on every rank, the rank that rejected its inputs raising its
        own error. Without agreement a local error is raised here, on this
        rank only.
        """
        options = invocation.options
        if not options.get("agree"):
            return NOTHING_TO_CHECK
        pre = self.local_precondition(invocation, inputs)
        if options.get("hoisted") is not None and self.hoisted:
            return pre
        if self.agreement:
            rows = self.exchange_rows([int(pre.ok), pre.digest()], invocation)
            if any(ok != 1 or digest != rows[0][1] for ok, digest in rows):
                self.explain(invocation, pre, rows)
        if pre.error is not None:
            raise pre.error
        return pre

    def explain(self, invocation: Occasion, pre: Precondition, rows: list[list[int]]) -> None:
        """Every rank saw the disagreement: gather the reports and raise."""
        try:
            reports = self.gather_objects(pre.report(), invocation)
        except DistirError:
            reports = [None] * self.size
        if pre.error is not None:
            raise pre.error
        raise mismatch(invocation.description, self.name, reports)

    def global_rank(self, group_rank: int) -> int:
        return self._global[group_rank]

    def __repr__(self) -> str:
        return f"<group {self.name}: rank {self.rank} of {self.size}>"


def _backend_message(error: BaseException) -> str:
    """The first line of a backend error, without gloo's source path prefix
    (`[/.../pair.cc:553] `) and the advice it appends."""
    text = str(error).strip()
    if not text:
        return type(error).__name__
    line = text.splitlines()[0]
    if line.startswith("[") and "] " in line:
        line = line.split("] ", 1)[1]
    return line.split(". This is typically")[0].strip()


class NonMemberResource:
    """A declared group this rank belongs to no subgroup of."""

    def __init__(self, name: str, rank: int):
        self.name = name
        self.base_rank = rank

    def __getattr__(self, item: str):
        raise DistirError(
            f"rank {self.base_rank} is in no subgroup of group @{self.name}, so it "
            "cannot run collectives on it"
        )


#: base process group -> {global rank lists -> this rank's process group, or
#: None on a rank in no subgroup}; the subgroups live as long as their base
_GROUP_CACHE: dict[dist.ProcessGroup, dict[tuple, dist.ProcessGroup | None]] = {}
_GROUP_CACHE_LOCK = threading.Lock()


def release_dead_groups() -> None:
    """Destroys the declared subgroups of base groups that were destroyed,
    and forgets them (their threads and sockets go with them)."""
    with _GROUP_CACHE_LOCK:
        dead = [base for base in _GROUP_CACHE if not group_alive(base)]
        released = [_GROUP_CACHE.pop(base) for base in dead]
    for groups in released:
        for pg in groups.values():
            if pg is not None and group_alive(pg):
                try:
                    dist.destroy_process_group(pg)
                except Exception:  # already broken: it is released anyway
                    pass


def create_declared_groups(
    declarations: Sequence[GroupDeclaration],
    base: ProcessGroupResource,
    deadline_s: float,
) -> dict[str | None, ProcessGroupResource | NonMemberResource]:
    """Every declared (sub)group, on every rank, in manifest order.

    Declared ranks are ranks of the base group (the world unless the program
    runs on a subgroup). On the world, every rank creates every subgroup, as
    torch.distributed requires; on a smaller base group, members create
    their own subgroup with local synchronisation. Creation runs under the
    deadline; groups already created for the same declaration are reused.
    """
    resources: dict[str | None, ProcessGroupResource | NonMemberResource] = {None: base}
    if declarations:
        release_dead_groups()
    on_world = base.group is None
    timeout = timedelta(seconds=deadline_s)
    for decl in declarations:
        name = decl.name
        parts = tuple(tuple(base.global_rank(r) for r in part) for part in decl.subgroups)
        with _GROUP_CACHE_LOCK:
            cached = _GROUP_CACHE.get(base.pg, {}).get(parts, ...)
            if cached is not ... and cached is not None and not group_alive(cached):
                cached = ...
        if cached is ...:
            cached = _new_groups(parts, base, on_world, timeout, name)
            with _GROUP_CACHE_LOCK:
                _GROUP_CACHE.setdefault(base.pg, {})[parts] = cached
        resources[name] = (
            NonMemberResource(name, base.rank)
            if cached is None
            else ProcessGroupResource(cached, name, domain=base.domain)
        )
    return resources


def create_group(
    global_ranks: Sequence[int], name: str, timeout: timedelta
) -> dist.ProcessGroup | None:
    """A process group over `global_ranks`, created by its members only.

    `name` is the group's name and the prefix of its rendezvous keys in the
    store, so it must be new in the store: torch's own name for a group
    made by its members only (`use_local_synchronization`) repeats once an
    earlier group of the same ranks was destroyed, and the new group then
    reads the old group's addresses."""
    ranks = list(global_ranks)
    default = c10d._get_default_group()
    backend, store = c10d._world.pg_map[default]
    pg, _ = c10d._new_process_group_helper(
        len(ranks),
        ranks.index(default.rank()),
        ranks,
        backend,
        store,
        c10d.GroupName(name),
        timeout=timeout,
    )
    c10d._world.pg_group_ranks[pg] = {g: r for r, g in enumerate(ranks)}
    return pg


#: the next group generation this process may use (see `_agreed_generation`)
_next_generation = 0


def _agreed_generation(base: ProcessGroupResource, step: Step) -> int:
    """A number no earlier group created by distir on any of these ranks
    used: the largest next generation of the base group's ranks (a group's
    members all took part in creating any earlier group of the same ranks,
    so their counters moved past its number)."""
    global _next_generation
    generation = max(row[0] for row in base.exchange_rows([_next_generation], step))
    _next_generation = generation + 1
    return generation


def _new_groups(
    parts: tuple[tuple[int, ...], ...],
    base: ProcessGroupResource,
    on_world: bool,
    timeout: timedelta,
    name: str,
) -> dist.ProcessGroup | None:
    me = base.global_rank(base.rank)
    step = Step(f"creating group @{name}")
    start = time.monotonic()
    generation = None if on_world else _agreed_generation(base, step)

    def create() -> dist.ProcessGroup | None:
        mine = None
        for global_ranks in parts:
            member = me in global_ranks
            if on_world:
                pg = dist.new_group(list(global_ranks), timeout=timeout)
            elif member:
                pg = create_group(
                    global_ranks,
                    f"distir-{generation}-{'_'.join(map(str, global_ranks))}",
                    timeout,
                )
            else:
                continue
            if member:
                mine = pg
        return mine

    # new_group reads the store, which may live in a frozen rank: bounded
    # beyond the backend's own timeout.
    try:
        return call_bounded(create, timeout.total_seconds() + 1.0, f"creating group @{name}")
    except StoreUnavailable:
        raise DeadlineExceeded(
            step.description,
            f"did not complete within its {timeout.total_seconds():g} s deadline on group "
            f"{base.name} (rank {base.rank} waited {time.monotonic() - start:.2f} s; the "
            "rendezvous store does not answer: the rank hosting it may be frozen)",
        ) from None
    except (RuntimeError, dist.DistStoreError) as e:
        raise base.failure(RuntimeError(str(e)), step, time.monotonic() - start) from None
