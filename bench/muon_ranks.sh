#!/usr/bin/env bash
# Distributed Muon at 1..MAX_N ranks, fp32 and bf16 storage/reduction, in one run:
# bench_muon's all_to_all bytes and Newton-Schulz CPU time per rank against one rank's (T1,
# timed inside each run), after the machine line. A driver that prints figures, not a test.
#   bench/muon_ranks.sh [BUILD_DIR=build]        knobs: MAX_N (4), STAGE (1), STEPS (4)
set -euo pipefail
BUILD=${1:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
"$(dirname "$0")"/machine.sh
for n in $(seq 1 "${MAX_N:-4}"); do
  for bf16 in 0 1; do
    echo "== N=$n bf16=$bf16: mpirun -np $n --oversubscribe $BUILD/bench/bench_muon --zero-stage ${STAGE:-1} --steps ${STEPS:-4} --bf16 $bf16"
    mpirun -np "$n" --oversubscribe "$BUILD/bench/bench_muon" --zero-stage "${STAGE:-1}" --steps "${STEPS:-4}" --bf16 "$bf16"
  done
done
