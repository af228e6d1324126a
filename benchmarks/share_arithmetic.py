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
  must do to reach their limbs: the floor of any aggregate of CKKSVectors;
* share stages (one process): the decryption share of the same C
  ciphertexts stage by stage (the seeds, the SHAKE-256 noise streams, the
  noise as residues, the batched NTT -- and one butterfly stage of it, with
  the number of elementwise torch kernels one stage runs --, the product
  with the weighted key share) against SEAL's decrypt, to say where a
  share's time goes and why it is not within 2x of SEAL's: SEAL's NTT
  is one pass of native code per stage, torch's is one pass per kernel;
* serialization floor (one process): what reading a CKKSVector's limbs
  costs per stage, paired -- TenSEAL's ``serialize`` (zstd: neither
  ``CKKSVector.serialize`` nor ``sealapi.Ciphertext.save`` takes a
  ``compr_mode``, and both write zstd), the zstd decompression, the limbs
  copied out of the payload, the range check, the SHA-256 commitment --
  against a plain copy of the same limbs (``torch.clone``: the memory floor
  of any read) and writing the limbs back into TenSEAL
  (``ckks_vector_from`` of an uncompressed serialization).

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


def share_stages(count: int, iterations: int) -> None:
    import tenseal as ts

    from distir.he import batched
    from distir.he import threshold as th
    from distir.he.seal import ckks_to_limbs

    params = th.ThresholdParameters(parties=3, threshold=2, decrypt_to_ranks=True)
    private = th.receiver_context(params)
    rng = np.random.default_rng(0)
    vectors = [ts.ckks_vector(private, rng.normal(size=SLOTS).tolist()) for _ in range(count)]
    limbs = torch.stack([ckks_to_limbs(v)[0] for v in vectors])
    moduli = list(params.data_moduli)
    g = torch.Generator().manual_seed(1)
    key_q = torch.tensor(params.key_moduli).view(-1, 1)
    secret = torch.randint(0, 2**62, (len(key_q), 8192), generator=g) % key_q
    share = th.ThresholdShare(
        params, 0, th.CollectivePublicKey(params, secret.expand(2, -1, -1)), secret, b"k" * 32
    )
    active = [0, 1]
    n, bits = params.poly_modulus_degree, params.smudging_bits
    q = batched.moduli_column(moduli)
    weight = batched.multiplier(th._active_weight(share, active, moduli), q)
    seeds, _ = th._noise_seeds(share, "decrypt", limbs, active)
    streams = [th._stream("smudging", seed, ((bits + 8) // 8) * n) for seed in seeds]
    parts = batched.slices(count, len(moduli) * n)
    residues = torch.cat([batched.signed_residues(streams[p], bits, n, moduli) for p in parts])
    stage = batched._stages(tuple(moduli), n)[6]  # a middle stage: m = 64
    one = residues[:1].clone()
    q2 = batched.moduli_column(moduli, 2)

    def butterfly():  # one stage of one ciphertext's NTT, as forward_ntt runs it
        pairs = one.view(1, len(moduli), 64, 2, n // 128)
        x, y = pairs[:, :, :, 0, :], pairs[:, :, :, 1, :]
        wy = batched.mul_mod(y, stage)
        y.copy_(batched.sub_mod(x, wy, q2))
        x += wy
        x -= q2
        x += (x >> 63) & q2

    def one_stage():
        for _ in range(count):
            butterfly()

    kernels = _count_kernels(butterfly)
    rows = {
        "SEAL decrypt (CKKSVector.decrypt)": lambda: [v.decrypt() for v in vectors],
        "whole share (decryption_shares)": lambda: th.decryption_shares(
            share, limbs, moduli, active
        ),
        "seeds (SHA-256 of the ciphertext, BLAKE2b)": lambda: th._noise_seeds(
            share, "decrypt", limbs, active
        ),
        "SHAKE-256 noise streams": lambda: [
            th._stream("smudging", seed, ((bits + 8) // 8) * n) for seed in seeds
        ],
        # slice by slice, as decryption_shares runs them (no kernel forks threads)
        "noise as residues (signed_residues)": lambda: [
            batched.signed_residues(streams[p], bits, n, moduli) for p in parts
        ],
        "batched NTT of the noise (13 stages)": lambda: batched.forward_ntt(residues, moduli),
        f"one NTT butterfly stage ({kernels} torch kernels)": one_stage,
        "product with the weighted key share": lambda: [
            batched.mul_mod(limbs[p, 1], weight) for p in parts
        ],
    }
    times = paired(rows, iterations)
    seal = statistics.median(times["SEAL decrypt (CKKSVector.decrypt)"])
    print(f"Decryption share by stage, {count} ciphertexts, {iterations} paired iterations")
    print()
    print("| stage | ms per ciphertext (median) | x SEAL decrypt |")
    print("|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {1e3 * median / count:.3g} | {median / seal:.2f} |")
    print()


def _count_kernels(fn: Callable[[], object]) -> int:
    """The torch operations (each one elementwise pass) ``fn`` calls."""
    from torch.overrides import TorchFunctionMode

    calls = []

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name not in ("view", "__getitem__", "__get__", "shape"):
                calls.append(name)
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return len(calls)


def serialization_floor(count: int, iterations: int) -> None:
    import hashlib

    import tenseal as ts

    from distir.he import threshold as th
    from distir.he.rns import TorchRNSBackend
    from distir.he.seal import (
        CiphertextHeader,
        _decode_seal_blob,
        _proto_fields,
        ckks_to_limbs,
        parse_ckks_chunks,
        vector_proto,
    )

    params = th.ThresholdParameters(parties=3, threshold=2, decrypt_to_ranks=True)
    context = th.receiver_context(params)
    rng = np.random.default_rng(0)
    vectors = [ts.ckks_vector(context, rng.normal(size=SLOTS).tolist()) for _ in range(count)]
    layouts = [parse_ckks_chunks(v) for v in vectors]
    blobs = [  # the SEAL blob inside each proto's ciphertexts field
        layout[0].proto[value:end]
        for layout in layouts
        for number, _wire, _start, value, end in _proto_fields(layout[0].proto)
        if number == 2
    ]
    limbs = torch.stack(
        [ckks_to_limbs(v, layouts=layout)[0] for v, layout in zip(vectors, layouts)]
    )
    moduli = torch.tensor(params.data_moduli, dtype=torch.int64)
    headers = [CiphertextHeader.of(layout) for layout in layouts]
    protos = [vector_proto(limbs[k : k + 1], [h]) for k, h in enumerate(headers)]

    def extract():
        for layout in layouts:
            chunk = layout[0]
            words = np.frombuffer(
                chunk.payload,
                dtype="<u8",
                count=int(np.prod(chunk.shape)),
                offset=chunk.data_offset,
            )
            torch.from_numpy(words.astype(np.int64))

    rows = {
        "torch.clone of the limbs (memory floor)": lambda: limbs.clone(),
        "CKKSVector.serialize (zstd)": lambda: [v.serialize() for v in vectors],
        "zstd decompression of the SEAL blob": lambda: [_decode_seal_blob(b) for b in blobs],
        "limbs out of the payload (int64 copy)": extract,
        "range check of the limbs": lambda: [
            TorchRNSBackend().check_reduced(c, moduli) for c in limbs
        ],
        "SHA-256 of the limbs (commitment)": lambda: hashlib.sha256(limbs.numpy()).digest(),
        "ckks_vector_from (uncompressed, written back)": lambda: [
            ts.ckks_vector_from(context, p) for p in protos
        ],
    }
    times = paired(rows, iterations)
    floor = statistics.median(times["torch.clone of the limbs (memory floor)"])
    print(f"Serialization floor per stage, {count} ciphertexts, {iterations} paired iterations")
    print()
    print("| stage | ms per ciphertext (median) | x memory copy |")
    print("|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {1e3 * median / count:.3g} | {median / floor:.1f} |")
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
        share_stages(args.ciphertexts, args.iterations)
        serialization_floor(args.ciphertexts, args.iterations)
    for nproc in args.nproc:
        collective(nproc, args.ciphertexts, args.iterations)
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
