#!/usr/bin/env bash
# Benchmarks (figures, not tests): kernels, end-to-end tokens/s per config on 1 rank x 2
# threads, then 1 and 2 ranks x 1 thread for every ZeRO stage, then checkpoint save speed, then
# distributed Muon at 1-4 ranks.
# Usage: scripts/bench.sh [build-dir]. Quote medians; the machine is shared and noisy.
set -euo pipefail
BUILD=${1:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Every figure below belongs to this hardware: print it first.
BENCH="$(dirname "$0")"/../bench
"$BENCH"/machine.sh
echo "== kernels (2 threads)"
"$BUILD"/bench/bench_kernels --benchmark_min_time=0.2 2>/dev/null | grep -E "^BM_" || true
echo "== end to end, 1 rank x 2 threads"
for c in tiny small gpt2; do "$BUILD"/bench/bench_train --config $c --steps 12 --threads 2; done
echo "== end to end, 1 and 2 ranks x 1 thread, every stage"
"$BENCH"/zero_stages.sh "$BUILD" | grep -v '^machine:'
echo "== checkpoint save vs plain sequential write (d6, 1 and 2 ranks)"
"$BENCH"/ckpt.sh "$BUILD" | grep -v '^machine:'
echo "== Muon: all_to_all bytes and Newton-Schulz CPU time per rank, 1-4 ranks (fp32 and bf16 on the wire)"
"$BENCH"/muon_ranks.sh "$BUILD" | grep -v '^machine:\|^  rank'
