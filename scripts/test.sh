#!/usr/bin/env bash
# The README's test command (and what CI runs): install what is missing, build, run every
# test (unit, multi-rank under mpirun, end to end) through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
scripts/build.sh
# The Slurm suite (label slurm: starts daemons as root) runs only when asked: -L slurm.
[ $# -eq 0 ] && set -- -LE slurm
cd "$BUILD" && ctest --output-on-failure --timeout 900 "$@"
