#!/usr/bin/env bash
# Installs missing dependencies, then configures and builds everything (the trainer, the tests,
# the benchmarks) into BUILD (default build/). Extra arguments are build targets (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
scripts/install-deps.sh
# The options explicitly: a build folder the demo configured has the tests, the benchmarks and
# the CUDA backend off. The backend is built where a CUDA toolkit is found, unless
# SHARDGPT_CUDA=OFF.
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSHARDGPT_TESTS=ON -DSHARDGPT_BENCH=ON \
  -DSHARDGPT_CUDA="${SHARDGPT_CUDA:-ON}" >/dev/null
if [ $# -gt 0 ]; then
  cmake --build "$BUILD" -j "$(nproc)" --target "$@"
else
  cmake --build "$BUILD" -j "$(nproc)"
fi
