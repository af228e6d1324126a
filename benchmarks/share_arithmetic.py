"""Threshold share arithmetic per ciphertext, against SEAL and raw torch.distributed.

Two paired comparisons, each row timed in the same loop as its baselines
(every iteration runs every row, starting one row further down each time;
the table gives medians over iterations, per ciphertext):

* local (one process): a party's decryption share and key-switch share of
  C ciphertexts (N = 8192, 3 data limbs, P = 3, t = 2) computed batched
  over [C, L, N] (``distir.he.threshold.decryption_shares``, what the
  protocol runs) and one ciphertext at a time as before the batching (the
  per-ciphertext NTT of Python-integer noise, kept below as
  ``unbatched_*``), against SEAL's own decryption (TenSEAL's
  ``CKKSVector.decrypt`` with the same parameters, decoding included);
  the issue's target: a decryption share <= 2x SEAL's decrypt;
* collective (P gloo ranks on this machine): ``distir.aggregation.aggregate``
  of C ciphertexts per rank against one raw ``dist.all_reduce`` of the same
  int64 limbs (``[C, 2, 3, 8192]``); the target: <= 2x.  A third row
  times TenSEAL's serialization of the same inputs, which ``aggregate``
  must do to reach their limbs: the floor of any aggregate of CKKSVectors.

    python benchmarks/share_arithmetic.py [--ciphertexts 32] [--iterations 7] [--nproc 2]

Prints Markdown tables; the load average is printed with them (a loaded
machine slows every row, not their ratios alone).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from distir.runtime.launch import launch

SLOTS = 4096


def unbatched_decryption_shares(share, limbs, moduli, active):
    """The share arithmetic before the batching: one ciphertext, one limb at
    a time, the noise as Python integers (``to_ntt`` of ``_uniform_signed``)."""
    from distir.he import threshold as th
    from distir.he.ntt import mul_mod, to_ntt
    from distir.he.rns import TorchRNSBackend

    weight = th._active_weight(share, active, moduli)
    q = th._moduli_tensor(moduli)
    out = []
    for c in limbs:
        seed, _tag = share._noise_seed("decrypt", th._context_bytes(c, active))
        bits, n = share.parameters.smudging_bits, share.parameters.poly_modulus_degree
        noise = th._uniform_signed("smudging", seed, bits, n)
        out.append(
            TorchRNSBackend().add_mod(mul_mod(c[1], weight, moduli), to_ntt(noise, moduli), q)
        )
    return torch.stack(out)


def unbatched_key_switch_shares(share, limbs, moduli, active, receiver_key):
    """The key-switch share arithmetic before the batching (as above)."""
    import hashlib

    from distir.he import threshold as th
    from distir.he.ntt import mul_mod, to_ntt
    from distir.he.rns import TorchRNSBackend

    receiver = receiver_key[:, : len(moduli)].contiguous()
    extra = hashlib.sha256(receiver_key.contiguous().numpy().tobytes()).digest()
    weight = th._active_weight(share, active, moduli)
    p, n = share.parameters, share.parameters.poly_modulus_degree
    backend, q = TorchRNSBackend(), th._moduli_tensor(moduli)
    out = []
    for c in limbs:
        seed, _tag = share._noise_seed("switch", th._context_bytes(c, active, extra))
        u = to_ntt(th._ternary("switch-u", seed, n), moduli)
        e0 = to_ntt(th._uniform_signed("switch-e0", seed, p.key_switch_bits, n), moduli)
        e1 = to_ntt(th._centered_binomial("switch-e1", seed, n), moduli)
        h0 = mul_mod(c[1], weight, moduli)
        backend.add_mod_(h0, mul_mod(u, receiver[0], moduli), q)
        backend.add_mod_(h0, e0, q)
        h1 = backend.add_mod(mul_mod(u, receiver[1], moduli), e1, q)
        out.append(torch.stack([h0, h1]))
    return torch.stack(out)


def paired(rows: dict[str, Callable[[], object]], iterations: int) -> dict[str, list[float]]:
    """Every row once per iteration, the starting row rotating; seconds."""
    names = list(rows)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(iterations):
        for k in range(len(names)):
            name = names[(i + k) % len(names)]
            start = time.perf_counter()
            rows[name]()
            times[name].append(time.perf_counter() - start)
    return times


def local(count: int, iterations: int) -> None:
    import tenseal as ts

    from distir.he import threshold as th
    from distir.he.seal import ckks_to_limbs, public_key_limbs

    params = th.ThresholdParameters(parties=3, threshold=2, decrypt_to_ranks=True)
    # SEAL's decryption at the same parameters: a private context of its own.
    private = th.receiver_context(params)
    rng = np.random.default_rng(0)
    vectors = [ts.ckks_vector(private, rng.normal(size=SLOTS).tolist()) for _ in range(count)]
    limbs = torch.stack([ckks_to_limbs(v)[0] for v in vectors])
    moduli = list(params.data_moduli)
    # A share of made-up limbs: the arithmetic's cost does not depend on them.
    g = torch.Generator().manual_seed(1)
    key_q = torch.tensor(params.key_moduli).view(-1, 1)
    uniform = lambda *s: torch.randint(0, 2**62, (*s, len(key_q), 8192), generator=g) % key_q  # noqa: E731
    share = th.ThresholdShare(
        params, 0, th.CollectivePublicKey(params, uniform(2)), uniform(), b"k" * 32
    )
    receiver = public_key_limbs(th.receiver_context(params))
    active = [0, 1]
    # The two paths agree bit for bit (checked once, untimed).
    assert torch.equal(
        th.decryption_shares(share, limbs[:2], moduli, active)[0],
        unbatched_decryption_shares(share, limbs[:2], moduli, active),
    )
    assert torch.equal(
        th.key_switch_shares(share, limbs[:2], moduli, active, receiver)[0],
        unbatched_key_switch_shares(share, limbs[:2], moduli, active, receiver),
    )
    rows = {
        "SEAL decrypt (CKKSVector.decrypt)": lambda: [v.decrypt() for v in vectors],
        "decryption share, batched": lambda: th.decryption_shares(share, limbs, moduli, active),
        "decryption share, unbatched (before)": lambda: unbatched_decryption_shares(
            share, limbs, moduli, active
        ),
        "key-switch share, batched": lambda: th.key_switch_shares(
            share, limbs, moduli, active, receiver
        ),
        "key-switch share, unbatched (before)": lambda: unbatched_key_switch_shares(
            share, limbs, moduli, active, receiver
        ),
    }
    times = paired(rows, iterations)
    seal = statistics.median(times["SEAL decrypt (CKKSVector.decrypt)"])
    print(f"Local, {count} ciphertexts (N=8192, 3 data limbs, P=3), {iterations} paired iterations")
    print()
    print("| row | ms per ciphertext (median) | p25-p75 | x SEAL decrypt |")
    print("|---|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [median] * 3
        print(
            f"| {name} | {1e3 * median / count:.3g} | {1e3 * quartiles[0] / count:.3g}-"
            f"{1e3 * quartiles[2] / count:.3g} | {median / seal:.2f} |"
        )
    print()


def rank_main(ctx, count: int, iterations: int) -> dict:
    import tenseal as ts
    import torch.distributed as dist

    from distir.aggregation import threshold as ta
    from distir.he.seal import ckks_to_limbs

    params = ta.ThresholdParameters(parties=ctx.world_size, threshold=ctx.world_size)
    share = ta.generate_keys(params, deadline=600)
    context = share.public_key.context()
    rng = np.random.default_rng(ctx.rank)
    encrypted = [ts.ckks_vector(context, rng.normal(size=SLOTS).tolist()) for _ in range(count)]
    limbs = torch.stack([ckks_to_limbs(c)[0] for c in encrypted])
    raw = limbs.clone()

    def timed(fn):
        dist.barrier()
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    rows = {
        "raw dist.all_reduce of the int64 limbs": lambda: dist.all_reduce(raw),
        "aggregate": lambda: ta.aggregate(encrypted, share, deadline=600),
        # what aggregate cannot avoid while its inputs are CKKSVectors:
        # TenSEAL's serialization (zstd-compressed) to reach the limbs
        "CKKSVector.serialize of the inputs (inside aggregate)": lambda: [
            c.serialize() for c in encrypted
        ],
    }
    names = list(rows)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(iterations + 1):
        for k in range(len(names)):
            name = names[(i + k) % len(names)]
            if name.startswith("raw"):
                raw.copy_(limbs)  # untimed reset, like the benchmark suite's in-place rows
            elapsed = timed(rows[name])
            if i:  # the first iteration warms up (compilation of the programs)
                times[name].append(elapsed)
    return times


def collective(nproc: int, count: int, iterations: int) -> None:
    reports = launch(rank_main, nproc, count, iterations, pass_context=True, timeout=3600)
    names = list(reports[0])
    # the time of an iteration is the slowest rank's
    per_iteration = {n: [max(r[n][i] for r in reports) for i in range(iterations)] for n in names}
    raw = per_iteration[names[0]]
    ratios = {
        n: statistics.median(a / b for a, b in zip(per_iteration[n], raw, strict=True))
        for n in names
    }
    print(
        f"Collective, P={nproc} gloo ranks, {count} ciphertexts per rank, {iterations} iterations"
    )
    print()
    print("| row | ms per ciphertext (median) | x raw all-reduce (median of paired ratios) |")
    print("|---|---|---|")
    for name in names:
        values = per_iteration[name]
        print(f"| {name} | {1e3 * statistics.median(values) / count:.3g} | {ratios[name]:.2f} |")
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ciphertexts", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=7)
    parser.add_argument("--nproc", type=int, nargs="*", default=[2])
    parser.add_argument("--skip-local", action="store_true")
    args = parser.parse_args()
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs")
    print()
    if not args.skip_local:
        local(args.ciphertexts, args.iterations)
    for nproc in args.nproc:
        collective(nproc, args.ciphertexts, args.iterations)
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
