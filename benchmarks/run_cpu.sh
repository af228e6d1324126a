#!/usr/bin/env bash
# The CPU (gloo) runs reported in benchmarks/README.md:
#   bash benchmarks/run_cpu.sh [output-directory]
# 1. distir-bench --quick (P=2 and 4, 4K/1M/16M, under 2 minutes)
# 2. the fuller run at 16 and 64 MiB for P=2 and 4 (about 5 minutes)
set -euo pipefail
out=${1:-bench-results}
mkdir -p "$out"
uptime
distir-bench --quick --json "$out/quick.json" --plot "$out/quick-busbw.png" | tee "$out/quick.txt"
distir-bench --nproc 2 4 --sizes 16M 64M --json "$out/full-16M-64M.json" \
  --plot "$out/full-16M-64M-busbw.png" | tee "$out/full-16M-64M.txt"
uptime
