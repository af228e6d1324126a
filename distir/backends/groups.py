"""Process-group resources: what an implementation needs to talk to a group.

Ranks in IR are ranks of the op's group; `global_rank` converts one to a
global rank for the few PyTorch calls that still want one. The groups a
module declares are created here, on every rank, in manifest order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from distir.errors import (
    CollectiveFailed,
    CollectiveMismatchError,
    DeadlineExceeded,
    DistirError,
)
from distir.ir.dialect import GroupOp

DEFAULT_DEADLINE_S = 60.0

#: dtype codes exchanged in descriptors
DTYPE_CODES = {
    dtype: code
    for code, dtype in enumerate(
        [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
         torch.float16, torch.bfloat16, torch.float32, torch.float64]
    )
}
DESCRIBED_DIMS = 8


def tensor_descriptor(x: torch.Tensor, skip_axis: int | None = None) -> list[int]:
    """[dtype code, rank, 8 dims] with the gathered axis (if any) masked."""
    dims = [(-1 if d == skip_axis else s) for d, s in enumerate(x.shape)]
    head, tail = dims[:DESCRIBED_DIMS], dims[DESCRIBED_DIMS:]
    if tail:
        head[-1] = hash(tuple(head[-1:] + tail)) & ((1 << 62) - 1)
    return [DTYPE_CODES.get(x.dtype, 99), x.dim(), *head, *[0] * (DESCRIBED_DIMS - len(head))]


def ciphertext_descriptor(ct: torch.Tensor, moduli: torch.Tensor) -> list[int]:
    """[digest of the moduli, *tensor_descriptor(ct)]: ranks must agree on both."""
    digest = hash(tuple(moduli.tolist())) & ((1 << 62) - 1)
    return [digest, *tensor_descriptor(ct)]


def explain_layouts(what: str) -> Callable[[list[list[int]]], str]:
    """How `agree` words a disagreement between tensor descriptors."""

    def explain(rows: list[list[int]]) -> str:
        shown = "; ".join(f"rank {r}: {describe_descriptor(row)}" for r, row in enumerate(rows))
        return f"ranks pass different {what} ({shown})"

    return explain


def explain_ciphertexts(rows: list[list[int]]) -> str:
    """How `agree` words a disagreement between ciphertext descriptors."""
    if len({row[0] for row in rows}) > 1:
        by_moduli: dict[int, list[int]] = {}
        for r, row in enumerate(rows):
            by_moduli.setdefault(row[0], []).append(r)
        return "ranks use different moduli (ranks " + " vs ".join(
            str(ranks) for ranks in by_moduli.values()
        ) + ")"
    return explain_layouts("ciphertext layouts")([row[1:] for row in rows])


def describe_descriptor(row: Sequence[int]) -> str:
    names = {code: str(dtype).replace("torch.", "") for dtype, code in DTYPE_CODES.items()}
    dtype, rank, dims = row[0], row[1], row[2 : 2 + min(row[1], DESCRIBED_DIMS)]
    shown = ["*" if d == -1 else str(d) for d in dims]
    return f"{names.get(dtype, '?')}[{', '.join(shown)}]" if rank else f"{names.get(dtype, '?')} scalar"


class ProcessGroupResource:
    """One initialised process group (`None` means the default group)."""

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        name: str = "world",
        domain: Any = None,
    ):
        if not dist.is_initialized():
            raise DistirError(
                "torch.distributed is not initialised: call distir.launch, run under "
                "distir-run or torchrun, or init_process_group first"
            )
        self.group = group
        self.name = name
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group))
        self._global = [
            dist.get_global_rank(group, r) if group is not None else r
            for r in range(self.size)
        ]
        if domain is None:
            from distir.backends.domain import domain_for

            domain = domain_for(group)
        self.domain = domain
        #: seconds a collective may take; set by the program for each run
        self.deadline_s = DEFAULT_DEADLINE_S
        #: whether ops exchange descriptors before their payload; set per run
        self.agreement = True

    # -- completion under a deadline --------------------------------------------

    def complete(self, work: Any, invocation: Any) -> None:
        """Waits for an async collective, at most until its deadline."""
        deadline = invocation.options.get("deadline_s") or self.deadline_s
        start = time.monotonic()
        try:
            work.wait(timeout=timedelta(seconds=deadline))
        except RuntimeError as e:
            waited = time.monotonic() - start
            text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if "timed out" in text.lower() or "timeout" in text.lower():
                raise DeadlineExceeded(
                    invocation.description,
                    f"did not complete within its {deadline:g} s deadline on group "
                    f"{self.name} (rank {self.rank} of {self.size} waited {waited:.2f} s; "
                    "a peer is late, hung or running something else)",
                ) from None
            lost_peer = any(
                word in text.lower() for word in ("connection", "closed", "reset", "peer")
            )
            raise CollectiveFailed(
                invocation.description,
                f"the {self.backend} backend failed on group {self.name} after "
                f"{waited:.2f} s{' (a peer may have exited)' if lost_peer else ''}: {text}",
            ) from None

    def agree(
        self,
        invocation: Any,
        descriptor: Sequence[int] | Callable[[], Sequence[int]],
        local_error: BaseException | None,
        device: torch.device,
        explain: Callable[[list[list[int]]], str],
    ) -> None:
        """Exchanges a fixed-size descriptor before the payload.

        Every rank learns whether every other rank accepted its inputs and
        whether the descriptors agree, so all ranks raise together instead
        of some entering the payload collective and hanging. `descriptor`
        may be a function, called only when the exchange happens.
        """
        if not (self.agreement and invocation.options.get("agree", False)):
            if local_error is not None:
                raise local_error
            return
        if callable(descriptor):
            descriptor = descriptor()
        row = torch.tensor(
            [0 if local_error is not None else 1, *descriptor], dtype=torch.int64, device=device
        )
        gathered = torch.empty(self.size * row.numel(), dtype=torch.int64, device=device)
        self.complete(_all_gather_single(gathered, row, group=self.group, async_op=True),
                      invocation)
        rows = gathered.view(self.size, -1).tolist()
        if local_error is not None:
            raise local_error
        rejected = [r for r, row_ in enumerate(rows) if row_[0] == 0]
        if rejected:
            raise CollectiveMismatchError(
                invocation.description,
                f"rank(s) {rejected} of group {self.name} rejected their inputs for this "
                "collective (their own error says why), so no rank sends its payload",
            )
        if any(r[1:] != rows[0][1:] for r in rows):
            raise CollectiveMismatchError(
                invocation.description, explain([r[1:] for r in rows])
            )

    def global_rank(self, group_rank: int) -> int:
        return self._global[group_rank]

    @property
    def global_ranks(self) -> tuple[int, ...]:
        return tuple(self._global)

    def __repr__(self) -> str:
        return f"<group {self.name}: rank {self.rank} of {self.size}>"


# torch 2.13 renamed all_gather_into_tensor (and deprecated the old name).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


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


def create_declared_groups(
    declarations: Sequence[GroupOp],
    base: ProcessGroupResource,
    timeout: timedelta | None = None,
) -> dict[str | None, ProcessGroupResource | NonMemberResource]:
    """Create every declared (sub)group, on every rank, in manifest order.

    Declared ranks are ranks of the base group (the world unless the program
    runs on a subgroup). On the world, every rank creates every subgroup, as
    torch.distributed requires; on a smaller base group, members create
    their own subgroup with local synchronisation.
    """
    resources: dict[str | None, ProcessGroupResource | NonMemberResource] = {None: base}
    on_world = base.group is None
    for decl in declarations:
        name = decl.sym_name.data
        mine: ProcessGroupResource | NonMemberResource = NonMemberResource(name, base.rank)
        for part in decl.rank_lists:
            if max(part) >= base.size:
                raise DistirError(
                    f"group @{name} names rank {max(part)} but the program runs on "
                    f"{base.size} ranks"
                )
            global_ranks = [base.global_rank(r) for r in part]
            member = base.rank in part
            if on_world:
                pg = dist.new_group(global_ranks, timeout=timeout)
            elif member:
                pg = dist.new_group(
                    global_ranks, timeout=timeout, use_local_synchronization=True
                )
            else:
                continue
            if member:
                mine = ProcessGroupResource(pg, name, domain=base.domain)
        resources[name] = mine
    return resources
