#!/usr/bin/env bash
# The sanitizer pass CI runs after scripts/test.sh (.ci/run):
#  1. the whole project built with clang, AddressSanitizer + UndefinedBehaviorSanitizer, the
#     CUDA backend included through the CPU emulation of CUDA (emu/cuda/; its tests: gpu-emu)
#     (any UB aborts), at -O1 without -march=native (another optimisation level than the
#     Release build: the tests' float tolerances must hold for both), into build-asan/;
#  2. the whole test suite under it (Open MPI's own leaks at exit are suppressed by
#     tests/lsan.supp, which names third-party libraries only);
#  3. every fuzz target (tests/fuzz) for FUZZ_SECONDS (default 60) on its corpus, two at a
#     time; any finding fails the script (see scripts/fuzz.sh).
# Extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_ASAN:-build-asan}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
scripts/install-deps.sh
# clang (Debian 12: clang 14, whose compiler-rt has libFuzzer) and the LLVM OpenMP runtime
missing=()
for p in clang libomp-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "shardgpt: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
CC=clang CXX=clang++ cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Sanitize -DCMAKE_C_FLAGS_SANITIZE="-O1 -g" \
  -DCMAKE_CXX_FLAGS_SANITIZE="-O1 -g" -DSHARDGPT_CUDA_EMULATION=ON -DSHARDGPT_BENCH=OFF -DSHARDGPT_FUZZ=ON >/dev/null
cmake --build "$BUILD" -j "$(nproc)"
[ "${SHARDGPT_SANITIZE_BUILD_ONLY:-0}" = 1 ] && exit 0

# Executables that initialise MPI record full allocation stacks (fast_unwind_on_malloc=0, compiled
# in: tests/asan_mpi_defaults.cc), so that Open MPI's leaks at exit name the libraries
# tests/lsan.supp suppresses (its unloaded components would show as unknown modules); the
# others keep the fast unwinder. Not set here: the environment would override both.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:symbolize=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0
start=$(date +%s)
(cd "$BUILD" && ctest --output-on-failure --timeout 1800 -j "${SHARDGPT_TEST_JOBS:-$(nproc)}" "$@")
echo "sanitized test suite: $(( $(date +%s) - start )) s"

start=$(date +%s)
targets=(token_shard llmc_model tokenizer ckpt_index ckpt_shard prepare cli_numbers safetensors tokenizer_json hf_config)
logs="$BUILD/fuzz/logs"; mkdir -p "$logs"
found=0
printf '%s\n' "${targets[@]}" | xargs -P 2 -I{} sh -c "scripts/fuzz.sh {} $FUZZ_SECONDS > $logs/{}.log 2>&1" || found=1
for t in "${targets[@]}"; do
  if grep -q '^Done [0-9]* runs' "$logs/$t.log"; then
    echo "fuzz $t: $(grep -E '^#[0-9]+[[:space:]]+DONE' "$logs/$t.log" | tail -1)"
  else
    echo "fuzz $t: FINDING or failure, last lines of $logs/$t.log:"; tail -30 "$logs/$t.log"; found=1
  fi
done
echo "fuzzing: $(( $(date +%s) - start )) s"
exit $found
