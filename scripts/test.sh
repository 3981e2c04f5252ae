#!/usr/bin/env bash
# The README's test command (and what CI runs): install what is missing, build, run every test
# (unit, multi-rank under mpirun, end to end, the real-Slurm scenarios) through CTest, several
# at a time; then the CUDA backend's tests under the CUDA emulation (scripts/test-emu.sh).
#   scripts/test.sh               the whole suite
#   scripts/test.sh --quick       the inner loop: builds only what the quick suite needs
#                                 (target quick: shardgpt and the unit tests, CPU backend only,
#                                 into BUILD_QUICK, default build-quick/) and runs them (the
#                                 labels unit and quick: every unit test and a few end-to-end runs);
#                                 no emulation build
#   scripts/test.sh [--quick] ARGS  extra arguments go to ctest (e.g. -R resume, -L mpi, -LE slurm)
# SHARDGPT_TEST_JOBS: how many tests run at once (default: the cores). Tests labelled serial
# (RUN_SERIAL) run alone whatever it is. SHARDGPT_SKIP_EMU=1 leaves the emulation out.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
JOBS=${SHARDGPT_TEST_JOBS:-$(nproc)}
if [ "${1:-}" = --quick ]; then
  shift
  BUILD=${BUILD_QUICK:-build-quick}
  BUILD=$BUILD SHARDGPT_CUDA=${SHARDGPT_CUDA:-OFF} scripts/build.sh quick
  (cd "$BUILD" && ctest --output-on-failure --timeout 900 -j "$JOBS" -L '^(unit|quick)$' "$@")
  exit 0
fi
scripts/build.sh
(cd "$BUILD" && ctest --output-on-failure --timeout 900 -j "$JOBS" "$@")
if [ "${SHARDGPT_SKIP_EMU:-0}" != 1 ]; then scripts/test-emu.sh "$@"; fi
