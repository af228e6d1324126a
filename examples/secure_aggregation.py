"""Secure aggregation of encrypted model updates with distir.

The launching process is the data owner: it creates the CKKS context
(TenSEAL / Microsoft SEAL) and keeps the secret key. Four local ranks get
only the public context; each produces its private vector (a model update
of 4096 floats) and encrypts it under the public key. One dist program sums
the ciphertexts across ranks, exactly, limb by limb; the ranks return only
the aggregate's limbs and the owner decrypts them. No rank can decrypt: the
ciphertexts a rank receives during the reduction (every one of them in
gather-fold, its neighbours' chunks in the ring) are safe because the key
holder takes no part in it. The program runs twice, once per lowering of
`dist.all_reduce_add_ciphertext`:

- generic:  `lower-ciphertext-add` -> a generic all-reduce whose combine region
            adds and conditionally subtracts the modulus;
- deferred: `defer-modular-reduction` -> a native int64 sum and one remainder
            (exact here: 4 ranks x 60-bit moduli fit in int64).

Both must give, bit for bit, the limbs of SEAL's own ciphertext addition;
the ranks check that among themselves (they may see one another's
ciphertexts; the owner must not).

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
# Every rank's ciphertext, for the ranks' own check against SEAL's addition.
GATHER = """
func.func @main(%ct: tensor<2x3x8192xi64>) -> tensor<?x3x8192xi64> {
  %all = dist.all_gather %ct axis 0 : tensor<2x3x8192xi64> -> tensor<?x3x8192xi64>
  func.return %all : tensor<?x3x8192xi64>
}
"""


def make_owner_context():
    """The data owner's CKKS context: it holds the secret key and never leaves
    the launching process."""
    import tenseal as ts

    ctx = ts.context(ts.SCHEME_TYPE.CKKS, POLY_DEGREE, coeff_mod_bit_sizes=COEFF_BITS)
    ctx.global_scale = SCALE
    return ctx


def public_context(owner) -> bytes:
    """What the ranks receive: the parameters and the public key (no secret
    key, no relinearization or Galois keys: a sum needs neither)."""
    return owner.serialize(save_public_key=True, save_secret_key=False,
                           save_galois_keys=False, save_relin_keys=False)


def private_update(rank: int, size: int) -> torch.Tensor:
    """The rank's private data: a deterministic stand-in for a model update."""
    g = torch.Generator().manual_seed(1234 + rank)
    return torch.randn(size, generator=g, dtype=torch.float64) * 0.01


def rank_main(ctx, public: bytes, size: int) -> dict:
    import tenseal as ts

    from distir.he.seal import ckks_to_limbs, limbs_to_ckks

    context = ts.context_from(public)  # encrypts; cannot decrypt
    encrypted = ts.ckks_vector(context, private_update(ctx.rank, size).tolist())
    limbs, moduli = ckks_to_limbs(encrypted)

    # SEAL's own homomorphic addition of every rank's ciphertext, as the reference.
    gathered = distir.compile(GATHER).run(limbs).view(ctx.world_size, *limbs.shape)
    seal_sum = limbs_to_ckks(gathered[0], encrypted)
    for other in gathered[1:]:
        seal_sum = seal_sum + limbs_to_ckks(other, encrypted)
    seal_limbs, _ = ckks_to_limbs(seal_sum)

    out: dict = {"holds_secret_key": context.has_secret_key() or context.is_private(),
                 "limbs": {}, "bit_exact": {}}
    for name, pipeline in LOWERINGS.items():
        total = distir.compile(PROGRAM, pipeline).run(limbs, moduli)
        out["limbs"][name] = total
        out["bit_exact"][name] = torch.equal(total, seal_limbs)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--size", type=int, default=4096, help="floats per update (<= 4096)")
    args = parser.parse_args()

    import tenseal as ts

    from distir.he.seal import ckks_moduli, limbs_to_ckks

    owner = make_owner_context()
    reports = launch(rank_main, args.nproc, public_context(owner), args.size,
                     pass_context=True, timeout=300)

    # The owner decrypts the aggregate limbs into a ciphertext of its own context.
    template = ts.ckks_vector(owner, [0.0] * args.size)
    moduli = ckks_moduli(owner)
    # Only a demo can print this: the stand-in updates are deterministic.
    plain = sum(private_update(r, args.size) for r in range(args.nproc))
    secret_on_ranks = any(r["holds_secret_key"] for r in reports)
    print(f"secure aggregation: {args.nproc} ranks x {args.size} floats, CKKS N={POLY_DEGREE}, "
          f"{moduli.numel()} RNS limbs, moduli {moduli.tolist()}")
    print(f"data owner (the launcher) keeps the secret key; ranks get the public context: "
          f"secret key on any rank: {'YES' if secret_on_ranks else 'no'}")
    all_ok = not secret_on_ranks
    for name, pipeline in LOWERINGS.items():
        total = reports[0]["limbs"][name]
        decrypted = torch.tensor(limbs_to_ckks(total, template).decrypt(), dtype=torch.float64)
        err = (decrypted - plain).abs().max().item()
        rel = err / plain.abs().max().item()
        exact = all(r["bit_exact"][name] for r in reports)
        agree = all(torch.equal(r["limbs"][name], total) for r in reports)
        all_ok &= exact and agree and rel < 1e-5
        print(f"[{name:8}] pipeline: {pipeline}")
        print(f"           owner decrypted aggregate[:4] = {[round(v, 6) for v in decrypted[:4].tolist()]}")
        print(f"           plaintext sum[:4]             = {[round(v, 6) for v in plain[:4].tolist()]}")
        print(f"           max abs error {err:.3e} (relative {rel:.3e})")
        print(f"           every rank holds the same limbs: {'yes' if agree else 'NO'}")
        print(f"           bit-exact with SEAL: {'yes' if exact else 'NO'}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
