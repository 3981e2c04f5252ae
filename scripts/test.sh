#!/usr/bin/env bash
# The README's test command (and what CI runs): install what is missing, build, run every
# test (unit, multi-rank under mpirun, end to end) through CTest; then the CUDA backend's tests
# under the CUDA emulation (scripts/test-emu.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
scripts/build.sh
# Everything, the Slurm suite included (label slurm: it starts its own daemons as root and runs
# alone; skipped when not root). Extra arguments go to ctest (e.g. -LE slurm, -L gpu).
(cd "$BUILD" && ctest --output-on-failure --timeout 900 "$@")
# The CUDA backend under the CPU emulation of CUDA (its own build, build-emu/): every test
# labelled gpu-emu. SHARDGPT_SKIP_EMU=1 leaves it out.
if [ "${SHARDGPT_SKIP_EMU:-0}" != 1 ]; then scripts/test-emu.sh "$@"; fi
