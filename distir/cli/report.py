"""What `distir-run` prints: a per-rank summary of every result and the
time a run took, and one line per distinct reason when ranks fail.

Only the standard library is imported at module level (see `distir.cli.run`).
"""

from __future__ import annotations

import statistics
import zlib
from collections.abc import Sequence
from typing import Any


def checksum(t: Any) -> str:
    """CRC32 of a tensor's bytes (any dtype, bfloat16 and bool included)."""
    import torch

    data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return f"{zlib.crc32(data.numpy().tobytes()):08x}"


def summarize(t: Any, limit: int = 6) -> str:
    flat = t.detach().cpu().reshape(-1)
    values = [round(v, 6) if isinstance(v, float) else v for v in flat[:limit].tolist()]
    more = ", ..." if flat.numel() > limit else ""
    shown = ", ".join(str(v) for v in values)
    return (
        f"{str(t.dtype).replace('torch.', '')}{list(t.shape)} crc32 {checksum(t)} [{shown}{more}]"
    )


# Reporting -----------------------------------------------------------------------------


def print_report(request: Any, reports: Sequence[dict], where: str) -> None:
    print(f"distir-run: {request.filename} on {where} (pipeline: {request.pipeline or 'none'})")
    for report in reports:
        times = report["times_ms"]
        timing = (
            f"{times[0]:.3f} ms"
            if len(times) == 1
            else f"median {statistics.median(times):.3f} ms over {len(times)} runs "
            f"(first {times[0]:.3f} ms)"
        )
        print(f"rank {report['rank']}: run {timing}")
        for line in report.get("recovered", ()):
            print(f"  {line}")
        for i, line in enumerate(report["results"]):
            print(f"  result #{i}: {line}")


def rank_list(ranks: Sequence[int]) -> str:
    """`rank 2`, `ranks 0-3`, `ranks 0, 2, 3`."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


def format_failures(failures: dict[int, str], nproc: int) -> str:
    """`N of P ranks failed:` and one line per distinct reason, naming the
    ranks that gave it (a reason every rank gave is printed once)."""
    by_reason: dict[str, list[int]] = {}
    for rank, why in sorted(failures.items()):
        # The base class adds nothing to the message; specific ones do.
        why = why.removeprefix("DistirError: ")
        by_reason.setdefault(why, []).append(rank)
    lines = [f"{len(failures)} of {nproc} {'rank' if nproc == 1 else 'ranks'} failed:"]
    for why, ranks in by_reason.items():
        lines.append(f"  {rank_list(ranks)}: {why}")
    return "\n".join(lines)
