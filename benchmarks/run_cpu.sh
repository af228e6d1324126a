#!/usr/bin/env bash
# The CPU (gloo) runs reported in benchmarks/README.md:
#   bash benchmarks/run_cpu.sh [output-directory]     (default bench-results/cpu-<timestamp>)
# 1. distir-bench --quick -c (P=2 and 4, 4K/1M/16M)
# 2. the fuller run at 16 and 64 MiB for P=2 and 4
# (benchmarks/README.md reports one `distir-bench --nproc 2 4 -c` run over
# every size, 504 s on the 2-core CI machine)
# Each writes results.json, table.txt and busbw-<family>.png into its own
# folder; a wrong result (-c) stops the script with a non-zero status.
set -euo pipefail
out=${1:-bench-results/cpu-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
uptime
distir-bench --quick -c --out "$out/quick"
distir-bench --nproc 2 4 -b 16M -e 64M -f 4 -c --out "$out/full-16M-64M"
uptime
