#!/usr/bin/env bash
# Every ZeRO stage on 2 ranks against 1 rank, per config, in one run after the machine line:
# bench_train at 1 rank x 1 thread, then mpirun -np 2 at stages 0..3 (1 thread per rank,
# per-rank B8 T256; stage 0 also runs the single-rank references step by step: --scaling 1).
# Figures, not a test.   bench/zero_stages.sh [BUILD_DIR=build]   knobs: CONFIGS ("tiny small"), STEPS (12)
set -euo pipefail
BUILD=${1:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$(dirname "$0")"/machine.sh
for c in ${CONFIGS:-tiny small}; do
  echo "== $c: $BUILD/bench/bench_train --config $c --steps ${STEPS:-12} --threads 1"
  "$BUILD"/bench/bench_train --config "$c" --steps "${STEPS:-12}" --threads 1
  for s in 0 1 2 3; do
    echo "== $c: mpirun -np 2 --oversubscribe $BUILD/bench/bench_train --config $c --steps ${STEPS:-12} --threads 1 --zero-stage $s"
    mpirun -np 2 --oversubscribe "$BUILD"/bench/bench_train --config "$c" --steps "${STEPS:-12}" --threads 1 \
      --zero-stage "$s" --scaling $([ "$s" = 0 ] && echo 1 || echo 0)
  done
done
