"""Secure aggregation of encrypted model updates with distir.

Four local ranks each encrypt a private vector (a model update of 4096
floats) under one shared CKKS public key (TenSEAL / Microsoft SEAL). One dist
program sums the ciphertexts across ranks, exactly, limb by limb; only rank 0
holds the secret key and decrypts the aggregate. The program runs twice, once
per lowering of `dist.all_reduce_add_ciphertext`:

- generic:  `lower-ciphertext-add` -> a generic all-reduce whose combine region
            adds and conditionally subtracts the modulus;
- deferred: `defer-modular-reduction` -> a native int64 sum and one remainder
            (exact here: 4 ranks x 60-bit moduli fit in int64).

Both must give, bit for bit, the limbs of SEAL's own ciphertext addition.

    pip install -e ".[he]"
    python examples/secure_aggregation.py [--nproc 4] [--size 4096]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import distir
from distir.runtime.launch import launch

PROGRAM = Path(__file__).with_name("secure_aggregation.mlir")
LOWERINGS = {
    "generic": "lower-ciphertext-add",
    "deferred": "defer-modular-reduction{max-group-size=8}",
}
POLY_DEGREE = 8192
COEFF_BITS = [60, 40, 40, 60]
SCALE = 2.0**40


def make_keys() -> tuple[bytes, bytes]:
    """(public context, secret context) for one CKKS key shared by the group."""
    import tenseal as ts

    ctx = ts.context(ts.SCHEME_TYPE.CKKS, POLY_DEGREE, coeff_mod_bit_sizes=COEFF_BITS)
    ctx.global_scale = SCALE
    return ctx.serialize(save_secret_key=False), ctx.serialize(save_secret_key=True)


def private_update(rank: int, size: int) -> torch.Tensor:
    """The rank's private data: a deterministic stand-in for a model update."""
    g = torch.Generator().manual_seed(1234 + rank)
    return torch.randn(size, generator=g, dtype=torch.float64) * 0.01


def rank_main(ctx, public_key: bytes, secret_key: bytes, size: int) -> dict:
    import tenseal as ts

    from distir.he.seal import ckks_to_limbs, limbs_to_ckks

    # Only rank 0 holds the secret key; the others can encrypt but not decrypt.
    context = ts.context_from(secret_key if ctx.rank == 0 else public_key)
    encrypted = ts.ckks_vector(context, private_update(ctx.rank, size).tolist())
    limbs, moduli = ckks_to_limbs(encrypted)
    out: dict = {"ciphertext": encrypted.serialize(), "limbs": {}}
    for name, pipeline in LOWERINGS.items():
        program = distir.compile(PROGRAM, pipeline)
        total = program.run(limbs, moduli)
        out["limbs"][name] = total
        if ctx.rank == 0:
            out.setdefault("decrypted", {})[name] = torch.tensor(
                limbs_to_ckks(total, encrypted).decrypt(), dtype=torch.float64
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--size", type=int, default=4096, help="floats per update (<= 4096)")
    args = parser.parse_args()

    import tenseal as ts

    from distir.he.seal import ckks_to_limbs

    public_key, secret_key = make_keys()
    reports = launch(rank_main, args.nproc, public_key, secret_key, args.size,
                     pass_context=True, timeout=300)

    # SEAL's own homomorphic addition of the same ciphertexts, as the reference.
    verifier = ts.context_from(secret_key)
    ciphertexts = [ts.ckks_vector_from(verifier, r["ciphertext"]) for r in reports]
    seal_sum = ciphertexts[0]
    for c in ciphertexts[1:]:
        seal_sum = seal_sum + c
    seal_limbs, moduli = ckks_to_limbs(seal_sum)

    plain = sum(private_update(r, args.size) for r in range(args.nproc))
    print(f"secure aggregation: {args.nproc} ranks x {args.size} floats, CKKS N={POLY_DEGREE}, "
          f"{moduli.numel()} RNS limbs, moduli {moduli.tolist()}")
    all_ok = True
    for name, pipeline in LOWERINGS.items():
        decrypted = reports[0]["decrypted"][name][: args.size]
        err = (decrypted - plain).abs().max().item()
        rel = err / plain.abs().max().item()
        exact = all(torch.equal(r["limbs"][name], seal_limbs) for r in reports)
        agree = all(torch.equal(r["limbs"][name], reports[0]["limbs"][name]) for r in reports)
        all_ok &= exact and agree and rel < 1e-5
        print(f"[{name:8}] pipeline: {pipeline}")
        print(f"           rank 0 decrypted aggregate[:4] = {[round(v, 6) for v in decrypted[:4].tolist()]}")
        print(f"           plaintext sum[:4]              = {[round(v, 6) for v in plain[:4].tolist()]}")
        print(f"           max abs error {err:.3e} (relative {rel:.3e})")
        print(f"           every rank holds the same limbs: {'yes' if agree else 'NO'}")
        print(f"           bit-exact with SEAL: {'yes' if exact else 'NO'}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
