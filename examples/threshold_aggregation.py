"""Threshold secure aggregation: any 3 of 5 ranks decrypt, an outside
receiver can get the sum instead, and no process ever holds the key.

Five local ranks each hold a private model update of 4096 floats. They
generate a collective CKKS key (every rank's secret share stays with it; the
Shamir shares that make any 3 of 5 enough travel sealed with X25519 and
ChaCha20-Poly1305), encrypt their updates under it and sum the ciphertexts
(every rank commits to its ciphertext, then every rank checks each
ciphertext against its commitment and sums them).
Then:

- the ranks switch the aggregate to the public key of an outside receiver
  (this launching process): only it decrypts;
- ranks 0 and 4 die (rank 0 too: the launcher hosts the rendezvous store);
  the others agree on who is left with `distir.recover()` and decrypt the
  aggregate on the group it returns, each with its own share's party index;
- rank 3 leaves as well; ranks 1 and 2, recovered again, cannot decrypt
  alone (a named error on both).

    pip install -e ".[he]"
    python examples/threshold_aggregation.py [--nproc 5] [--threshold 3] [--size 4096]
"""

from __future__ import annotations

import argparse
import math
import os

import numpy as np
import torch

from distir.runtime.launch import launch

DEADLINE_S = 60.0


def private_update(rank: int, size: int) -> torch.Tensor:
    """The rank's private data: a deterministic stand-in for a model update."""
    g = torch.Generator().manual_seed(1234 + rank)
    return torch.randn(size, generator=g, dtype=torch.float64) * 0.01


def lost_ranks(nproc: int, threshold: int) -> tuple[int, ...]:
    """The ranks that die after aggregation: rank 0 and the highest ones,
    leaving exactly `threshold` ranks."""
    return (0, *range(threshold + 1, nproc))


def rank_main(ctx, threshold: int, size: int, receiver_key: torch.Tensor) -> dict:
    from datetime import timedelta

    import tenseal as ts
    import torch.distributed as dist

    import distir
    from distir.aggregation import threshold as ta

    # decrypt_to_ranks: the survivors decrypt below, which trusts every
    # rank's input (a crafted one would reveal the key to them); without it
    # only switch_key, to the outside receiver, lets the aggregate out.
    params = ta.ThresholdParameters(
        parties=ctx.world_size, threshold=threshold, decrypt_to_ranks=True
    )
    # 1. Collective key generation and thresholdization (3 rounds).
    share = ta.generate_keys(params, deadline=DEADLINE_S)
    context = share.public_key.context()  # public: encrypts, cannot decrypt
    # 2. Encrypt the private update; commit to it; sum across ranks.
    encrypted = ts.ckks_vector(context, private_update(ctx.rank, size).tolist())
    total = ta.aggregate([encrypted], share, deadline=DEADLINE_S)
    # 3. For the outside receiver: one sum of smudged key-switch shares.
    switched = ta.switch_key(total, share, receiver_key, deadline=DEADLINE_S)
    if ctx.rank in lost_ranks(ctx.world_size, threshold):
        os._exit(3)  # these ranks die between aggregation and decryption
    # 4. The survivors agree on who is left and decrypt on the group that
    # gives them; each share keeps its party index (its original rank).
    m = distir.recover(deadline=DEADLINE_S)
    values = ta.decrypt(total, share, group=m.group, deadline=DEADLINE_S)[0]
    report = {
        "membership": (m.epoch, m.ranks),
        "context_is_private": context.is_private(),
        "decrypted": torch.tensor(values[:size], dtype=torch.float64),
        "switched": switched[0] if m.rank == 0 else None,
        "fewer": None,
    }
    # 5. The last survivor leaves once the others decrypted; they recover
    # again, one rank short of the threshold, and try.
    store = dist.distributed_c10d._get_default_store()
    last = m.ranks[-1]
    if ctx.rank == last:
        keys = [f"example/decrypted/{r}" for r in m.ranks[:-1]]
        store.wait(keys, timedelta(seconds=DEADLINE_S))
        return report
    store.set(f"example/decrypted/{ctx.rank}", "1")
    fewer = distir.recover(deadline=DEADLINE_S)
    report["fewer membership"] = (fewer.epoch, fewer.ranks)
    try:
        ta.decrypt(total, share, group=fewer.group, deadline=DEADLINE_S)
    except ta.ThresholdMismatch as e:
        report["fewer"] = f"{type(e).__name__}: {e}"
    return report


def _correlation(values: torch.Tensor, plain: torch.Tensor) -> float:
    return float(np.corrcoef(values.numpy(), plain.numpy())[0, 1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=5)
    parser.add_argument("--threshold", type=int, default=3)
    parser.add_argument("--size", type=int, default=4096, help="floats per update (<= 4096)")
    args = parser.parse_args()
    if not 2 <= args.threshold < args.nproc:
        parser.error("this example needs 2 <= --threshold < --nproc")

    import tenseal as ts

    from distir.he import threshold as th
    from distir.he.seal import ckks_to_limbs, public_key_limbs

    params = th.ThresholdParameters(parties=args.nproc, threshold=args.threshold)
    receiver = th.receiver_context(params)  # the outside receiver's own key pair
    dead = lost_ranks(args.nproc, args.threshold)
    outcome = launch(
        rank_main,
        args.nproc,
        args.threshold,
        args.size,
        public_key_limbs(receiver),
        pass_context=True,
        tolerate=len(dead),  # the launcher reports them gone, for recover()
        timeout=300,
    )
    reports, failures = outcome.results, outcome.lost
    if sorted(failures) != list(dead):
        raise SystemExit(f"ranks {sorted(failures)} were lost, not {list(dead)}")
    survivors = sorted(reports)
    first, last = survivors[0], survivors[-1]
    plain = sum(private_update(r, args.size) for r in range(args.nproc))
    decrypted = reports[first]["decrypted"]
    err = (decrypted - plain).abs().max().item()
    same = all(torch.equal(reports[r]["decrypted"], decrypted) for r in survivors)
    nobody_private = not any(r["context_is_private"] for r in reports.values())
    received = torch.tensor(
        ts.ckks_vector_from(receiver, reports[first]["switched"]).decrypt()[: args.size],
        dtype=torch.float64,
    )
    receiver_err = (received - plain).abs().max().item()
    # What the ranks hold of it: c0 + the summed key-switch shares, decoded
    # as a plaintext (without the receiver's secret, u*p0 is uniform noise).
    switched = ts.ckks_vector_from(receiver, reports[first]["switched"])
    c0 = ckks_to_limbs(switched)[0][0]
    rank_view = torch.tensor(th.decode(c0, switched)[: args.size], dtype=torch.float64)

    moduli = params.key_moduli
    agreed = {reports[r]["membership"] for r in survivors}
    print(
        f"threshold aggregation: {args.nproc} ranks x {args.size} floats, any "
        f"{args.threshold} decrypt; CKKS N={params.poly_modulus_degree}, scale "
        f"2^{math.log2(params.scale):.0f}, {len(moduli) - 1} RNS limbs + special prime"
    )
    print(
        f"every rank's encryption context is public (no secret key): "
        f"{'yes' if nobody_private else 'NO'}"
    )
    print(
        f"smudging: decryption shares add noise uniform in [-2^{params.smudging_bits}, "
        f"2^{params.smudging_bits}), key-switch shares in [-2^{params.key_switch_bits}, "
        f"2^{params.key_switch_bits}): within 2^-{params.statistical_security} over a budget "
        f"of {params.max_decryptions} decryptions per share; precision cost "
        f"{params.smudging_error_std:.1e} / {params.key_switch_error_std:.1e} per slot (std)"
    )
    print(f"outside receiver: decrypts the switched aggregate, max abs error {receiver_err:.1e}")
    print(
        f"the ranks' view of the switched aggregate: correlation with the sum "
        f"{_correlation(rank_view, plain):+.3f} (noise), max |value| "
        f"{rank_view.abs().max().item():.1e}"
    )
    print(f"ranks {', '.join(map(str, dead))} died after aggregation ({failures[dead[0]]})")
    print(
        f"ranks {', '.join(map(str, survivors))}: distir.recover() agreed on "
        f"{' / '.join(f'epoch {e}, ranks {list(r)}' for e, r in sorted(agreed))}; decrypted "
        f"on its group: max abs error {err:.1e}, the same on every survivor: "
        f"{'yes' if same else 'NO'}"
    )
    print(f"decrypted aggregate[:4] = {[round(v, 6) for v in decrypted[:4].tolist()]}")
    print(f"plaintext sum[:4]       = {[round(v, 6) for v in plain[:4].tolist()]}")
    fewer = {r: reports[r]["fewer"] for r in survivors[:-1]}
    regrouped = {reports[r]["fewer membership"] for r in fewer}
    print(
        f"rank {last} left; ranks {', '.join(map(str, fewer))} recovered again ("
        f"{' / '.join(f'epoch {e}, ranks {list(r)}' for e, r in sorted(regrouped))}) and "
        f"alone: {fewer[first]}"
    )
    ok = (
        same
        and nobody_private
        and err < 1e-6
        and receiver_err < 1e-6
        and abs(_correlation(rank_view, plain)) < 0.1
        and len(agreed) == 1
        and len(regrouped) == 1
        and all(v == fewer[first] and v for v in fewer.values())
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
