#!/usr/bin/env bash
# CUDA variants of the benchmarks, in one go, within about 5 minutes on one GPU.
# UNTESTED: written without access to a GPU; see benchmarks/README.md.
#
#   bash benchmarks/gpu.sh [output-directory]
#
# 1. distir-bench over NCCL at world size 1 (NCCL cannot put two ranks on one
#    GPU) and, with more GPUs, at every world size up to their number: the
#    dispatch and copy overheads of Program.run against raw NCCL calls, every
#    result checked (-c); results.json, table.txt and busbw-<family>.png go
#    into $out/nccl/.
# 2. The ciphertext modular-add combine on CUDA tensors against the device's
#    copy bandwidth (benchmarks/gpu_modular_add.py).
set -euo pipefail
out=${1:-bench-results/gpu-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)

gpus=$(python -c "import torch; print(torch.cuda.device_count())")
if [ "$gpus" -lt 1 ]; then
  echo "gpu.sh: no CUDA device visible" >&2
  exit 1
fi
nprocs="1"
for p in 2 4 8; do
  if [ "$gpus" -ge "$p" ]; then nprocs="$nprocs $p"; fi
done

echo "== distir-bench, NCCL, world sizes: $nprocs"
status=0  # a wrong result (-c) or a failure is reported at the end, after the other step ran
timeout 200 distir-bench --backend nccl --nproc $nprocs \
  --sizes 4K 1M 16M 64M 256M -n 10 -w 2 -c \
  --families all_reduce broadcast all_gather all_to_all combine ciphertext wave \
  --dispatch-chain 1000 --dispatch-repeats 10 \
  --out "$out/nccl" --timeout 190 || status=$?

echo "== modular-add combine on CUDA against copy bandwidth"
timeout 90 python "$here/gpu_modular_add.py" --sizes-mib 16 64 256 1024 --iters 20 \
  --json "$out/gpu-modular-add.json" || status=$?

echo "results in $out/ (exit status $status)"
exit "$status"
