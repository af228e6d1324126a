"""Threshold secure aggregation: a collective CKKS key that no rank holds.

Four local ranks each hold a private model update of 4096 floats. They
generate a collective public key (every rank draws a secret share s_i; the
key is the sum of their public shares, one dist program), encrypt their
updates under it, sum the ciphertexts (the ciphertext all-reduce), and
decrypt the aggregate together: every rank publishes a decryption share
c1*s_i + e'_i with a wide smudging noise e'_i, and only the sum of all shares
decrypts (another dist program). No process ever holds the collective
secret key; the launcher only sees public values (the key, the aggregate
ciphertext, the published decryption shares) and shows that one share, or
all shares but one, decrypt to noise.

    pip install -e ".[he]"
    python examples/threshold_aggregation.py [--nproc 4] [--size 4096]
"""

from __future__ import annotations

import argparse
import math
import secrets

import numpy as np
import torch

from distir.runtime.launch import launch

DEADLINE_S = 60.0


def private_update(rank: int, size: int) -> torch.Tensor:
    """The rank's private data: a deterministic stand-in for a model update."""
    g = torch.Generator().manual_seed(1234 + rank)
    return torch.randn(size, generator=g, dtype=torch.float64) * 0.01


def rank_main(ctx, crp_seed: bytes, size: int) -> dict:
    import tenseal as ts

    from distir.he import threshold as th

    params = th.ThresholdParameters(parties=ctx.world_size)
    # 1. Collective key generation: s_i stays here, h_i = e_i - a*s_i is public.
    crp = th.common_random_polynomial(params, crp_seed)
    secret = th.generate_secret_share(params)
    key = th.collective_public_key(th.public_key_share(secret, crp), crp, params,
                                   deadline=DEADLINE_S)
    context = th.encryption_context(key)
    # 2. Encrypt the private update under the collective key; sum across ranks.
    encrypted = ts.ckks_vector(context, private_update(ctx.rank, size).tolist())
    total = th.aggregate(encrypted, deadline=DEADLINE_S)
    # 3. Collective decryption: publish d_i, sum all of them.
    share = th.decryption_share(secret, total)
    plaintext = th.combine_decryption_shares(share, total, deadline=DEADLINE_S)
    # What this rank's own secret share alone makes of its own ciphertext.
    own_key = th.own_key_context(secret)
    own_view = ts.ckks_vector_from(own_key, encrypted.serialize()).decrypt()
    return {
        "context_is_private": context.is_private(),
        "public_context": context.serialize() if ctx.rank == 0 else None,
        "aggregate": total.serialize(),
        "decryption_share": share,
        "decrypted": torch.tensor(th.decode(plaintext, total)[:size], dtype=torch.float64),
        "own_key_view": torch.tensor(own_view[:size], dtype=torch.float64),
    }


def _describe(label: str, values: torch.Tensor, plain: torch.Tensor, what: str) -> str:
    corr = float(np.corrcoef(values.numpy(), plain.numpy())[0, 1])
    verdict = "decrypts" if corr > 0.99 else "noise"
    return (f"{label:<41} max |value| {values.abs().max().item():.1e}, "
            f"correlation with {what} {corr:+.3f} ({verdict})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--size", type=int, default=4096, help="floats per update (<= 4096)")
    args = parser.parse_args()

    import tenseal as ts

    from distir.he import threshold as th

    params = th.ThresholdParameters(parties=args.nproc)
    crp_seed = secrets.token_bytes(32)  # public: every rank derives the same a from it
    reports = launch(rank_main, args.nproc, crp_seed, args.size, pass_context=True, timeout=300)

    # The launcher holds only public values: the collective public context,
    # the aggregate ciphertext and the published decryption shares.
    public = ts.context_from(reports[0]["public_context"])
    total = ts.ckks_vector_from(public, reports[0]["aggregate"])
    shares = [r["decryption_share"] for r in reports]
    plain = sum(private_update(r, args.size) for r in range(args.nproc))
    decrypted = reports[0]["decrypted"]
    err = (decrypted - plain).abs().max().item()
    rel = err / plain.abs().max().item()
    same = all(torch.equal(r["decrypted"], decrypted) for r in reports)
    nobody_private = not public.is_private() and not any(r["context_is_private"] for r in reports)

    def partial(indices: list[int]) -> torch.Tensor:
        m = th.add_decryption_shares(total, [shares[i] for i in indices])
        return torch.tensor(th.decode(m, total)[: args.size], dtype=torch.float64)

    moduli = params.key_moduli
    last = args.nproc - 1
    print(f"threshold aggregation: {args.nproc} ranks x {args.size} floats, CKKS "
          f"N={params.poly_modulus_degree}, scale 2^{math.log2(params.scale):.0f}, "
          f"{len(moduli) - 1} RNS limbs + special prime, moduli {list(moduli)}")
    print(f"collective key: {args.nproc} shares h_i = e_i - a*s_i summed by one dist program, "
          f"loaded as a SEAL public key; every encryption context is public (no secret key): "
          f"{'yes' if nobody_private else 'NO'}")
    print(f"smudging: each decryption share adds noise uniform in [-2^{params.smudging_bits}, "
          f"2^{params.smudging_bits}): statistical distance <= "
          f"2^{math.log2(params.statistical_distance):.1f}, precision cost "
          f"{params.smudging_error_std:.1e} per slot (std)")
    print(f"decrypted aggregate[:4] = {[round(v, 6) for v in decrypted[:4].tolist()]}")
    print(f"plaintext sum[:4]       = {[round(v, 6) for v in plain[:4].tolist()]}")
    print(f"max abs error {err:.3e} (relative {rel:.3e})")
    print(f"every rank decrypted the same values: {'yes' if same else 'NO'}")
    print(_describe("rank 0's decryption share alone:", partial([0]), plain, "the sum"))
    print(_describe(f"all shares but rank {last}'s:", partial(list(range(last))), plain,
                    "the sum"))
    print(_describe("rank 0's secret share on its own update:", reports[0]["own_key_view"],
                    private_update(0, args.size), "the update"))
    print(_describe(f"all {args.nproc} shares:", partial(list(range(args.nproc))), plain,
                    "the sum"))
    return 0 if same and nobody_private and rel < 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
