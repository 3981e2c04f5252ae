#!/usr/bin/env bash
# Checkpoint save/load throughput beside a plain fwrite+fsync of the same bytes, and the async
# writer's stall, on 1 and 2 ranks in one run, after the machine line (bench_ckpt; figures, not
# a test).   bench/ckpt.sh [BUILD_DIR=build] [DIR=/var/tmp/shardgpt-bench-ckpt]   knobs: PRESET (d6), REPS (5)
set -euo pipefail
BUILD=${1:-build}
DIR=${2:-/var/tmp/shardgpt-bench-ckpt}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$(dirname "$0")"/machine.sh
trap 'rm -rf "$DIR"' EXIT
for n in 1 2; do
  echo "== mpirun -np $n --oversubscribe $BUILD/bench/bench_ckpt ${PRESET:-d6} $DIR ${REPS:-5}"
  mpirun -np "$n" --oversubscribe "$BUILD/bench/bench_ckpt" "${PRESET:-d6}" "$DIR" "${REPS:-5}"
  rm -rf "$DIR"
done
