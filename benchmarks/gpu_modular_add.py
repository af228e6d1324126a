"""The ciphertext modular-add combine on CUDA tensors against the device's
copy bandwidth (one GPU, no communication).

    python benchmarks/gpu_modular_add.py --json gpu-modular-add.json

For each size it times, with CUDA events (median of --iters after warm-up):
`dst.copy_(src)` (the copy bandwidth: bytes read + written), `a + b` into a
preallocated tensor, the three in-place modular-add forms distir uses —
subtract-and-mask (the region of `lower-ciphertext-add`), the signed-minimum
form of `ciphertext-auto`, `TorchRNSBackend.add_mod_` — and the lowered
region compiled by distir's region compiler (out of place, as gather-fold
runs it). Bandwidth counts 3 x N x 8 bytes for the adds (read a, b; write)
and 2 x N x 8 for the copy.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from distir.he.rns import TorchRNSBackend


def timed(fn, iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / 1e3)
    return statistics.median(samples)


def lowered_region(shape: tuple[int, int]):
    import distir
    from distir.core.block_compiler import BlockCompiler

    t = f"tensor<{shape[0]}x{shape[1]}xi64>"
    program = distir.compile(
        f"func.func @main(%ct: {t}, %q: tensor<{shape[0]}xi64>) -> {t} {{\n"
        f"  %y = dist.all_reduce_add_ciphertext %ct, %q : {t}, tensor<{shape[0]}xi64>\n"
        f"  func.return %y : {t}\n}}\n",
        "lower-ciphertext-add",
    )
    op = next(op for op in program.module.walk() if op.name == "dist.all_reduce")
    return BlockCompiler(program.module, None).compile_combine(op)


def make_kernels(a, b, out, tmp, q, moduli, rns, region) -> dict:
    """name -> (kernel, passes over N int64 elements)."""
    q_bcast = q.expand(a.shape)

    def subtract_and_mask():
        torch.add(a, b, out=out)
        out.sub_(q)
        torch.bitwise_right_shift(out, 63, out=tmp)
        tmp.bitwise_and_(q)
        out.add_(tmp)

    def signed_minimum():
        torch.add(a, b, out=out)
        torch.sub(out, q, out=tmp)
        tmp.bitwise_and_((1 << 63) - 1)
        torch.minimum(out, tmp, out=out)

    def rns_add_mod():
        out.copy_(a)
        rns.add_mod_(out, b, moduli)

    return {
        "copy_": (lambda: out.copy_(a), 2),
        "add (out=)": (lambda: torch.add(a, b, out=out), 3),
        "subtract-and-mask": (subtract_and_mask, 3),
        "signed-minimum": (signed_minimum, 3),
        "TorchRNSBackend.add_mod_": (rns_add_mod, 3),
        "lowered region (compiled)": (lambda: region(a, b, q_bcast), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json", default="gpu-modular-add.json")
    args = parser.parse_args()
    device = torch.device("cuda")
    moduli = torch.tensor([(1 << 60) - 93, (1 << 60) - 173, (1 << 59) - 55, (1 << 58) - 27],
                          device=device)  # fmt: skip
    q = moduli.view(-1, 1)
    rns = TorchRNSBackend()
    rows = []
    print(f"{torch.cuda.get_device_name()}; GB/s and time relative to copy_")
    for mib in args.sizes_mib:
        n = mib * (1 << 20) // 8 // 4
        a = torch.randint(0, 1 << 62, (4, n), device=device) % q
        b = torch.randint(0, 1 << 62, (4, n), device=device) % q
        out, tmp = torch.empty_like(a), torch.empty_like(a)
        region = lowered_region((4, n))

        kernels = make_kernels(a, b, out, tmp, q, moduli, rns, region)
        copy_time = None
        for name, (fn, passes) in kernels.items():
            seconds = timed(fn, args.iters)
            copy_time = copy_time or seconds
            gbps = passes * a.numel() * 8 / seconds / 1e9
            rows.append({"MiB": mib, "kernel": name, "ms": seconds * 1e3, "GBps": gbps,
                         "x_copy": seconds / copy_time})  # fmt: skip
            print(f"{mib:6d} MiB  {name:28s} {seconds * 1e3:9.3f} ms  {gbps:8.1f} GB/s  "
                  f"{seconds / copy_time:5.2f}x copy")  # fmt: skip
        assert torch.equal(region(a, b, q.expand(4, n))[0], torch.remainder(a + b, q))
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
