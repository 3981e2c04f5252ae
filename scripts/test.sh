#!/usr/bin/env bash
# The README's test command (and what CI runs): install what is missing, build, run every
# test (unit, multi-rank under mpirun, end to end) through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
scripts/build.sh
# Everything, the Slurm suite included (label slurm: it starts its own daemons as root and runs
# alone; skipped when not root). Extra arguments go to ctest (e.g. -LE slurm, -L gpu).
cd "$BUILD" && ctest --output-on-failure --timeout 900 "$@"
