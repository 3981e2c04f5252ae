#!/usr/bin/env bash
# Barrier mutation check of the attention kernels under the CUDA emulation: removes each
# __syncthreads() of model/cuda/attention_tc_cuda.cu and model/cuda/attention_cuda.cu, one at a
# time, rebuilds the emulated GPU test binary (gpu_tests in BUILD_EMU, default build-emu/, an
# existing -DSHARDGPT_CUDA_EMULATION=ON build) and runs the attention tests under the emulation
# seeds that scripts/test-emu.sh runs (the default seed 1, then 2 and 3) until one fails.
# Prints one row per barrier: file:line, the code around it, and the first test and seed that
# caught its removal, or NOT CAUGHT. Exits non-zero when a removal is not caught.
#
# The kernel file is edited in place and restored from a copy on every exit (Ctrl-C included);
# the build folder then holds a binary of the unmutated source only after the next build.
#
#   scripts/mutate-barriers.sh [file.cu ...]
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD=${BUILD_EMU:-build-emu}
SEEDS=${SHARDGPT_MUTATE_SEEDS:-"1 2 3"}
FILTER=${SHARDGPT_MUTATE_FILTER:-'TcAttentionTest.*:GpuTest.Attention*:Precision/GpuBf16Act.Attention*:Precision/GpuBf16Act.TinyModel*'}
FILES=("$@")
[ ${#FILES[@]} -gt 0 ] || FILES=(model/cuda/attention_tc_cuda.cu model/cuda/attention_cuda.cu)

backup_dir=$(mktemp -d)
current=""  # the file being mutated, restored by restore()
restore() {
  if [ -n "$current" ]; then
    cp "$backup_dir/original" "$current"  # a new mtime: the next build recompiles it
    current=""
  fi
}
cleanup() {
  restore
  rm -rf "$backup_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The code around line $2 of $1, on one line: the barrier and its neighbours, trimmed.
context() {
  sed -n "$(($2 - 1)),$(($2 + 1))p" "$1" | sed 's/^ *//; s/ *\/\/.*$//' | grep -v '^$' | paste -sd'|' | cut -c1-110
}

# The tests FILTER selects, one full name a line, in the binary's order.
list_tests() {
  "$BUILD/tests/gpu_tests" --gtest_filter="$FILTER" --gtest_list_tests |
    awk '/^[^ ]/ { suite = $1 } /^  / { print suite $1 }'
}

# The first test of FILTER that fails under seed $1, or nothing (each test its own process, so
# that the search stops at the first failure).
first_failure() {
  local test
  for test in $(list_tests); do
    if ! SHARDGPT_CUDA_EMU_SEED=$1 "$BUILD/tests/gpu_tests" --gtest_filter="$test" >/dev/null 2>&1; then
      echo "$test"
      return
    fi
  done
}

# Runs the filter under each seed; prints "TEST at seed S" for the first failure, or NOT CAUGHT.
verdict() {
  local seed failed
  for seed in $SEEDS; do
    failed=$(first_failure "$seed")
    if [ -n "$failed" ]; then
      echo "$failed at seed $seed"
      return
    fi
  done
  echo "NOT CAUGHT"
}

# Baseline: the unmutated source passes under every seed.
cmake --build "$BUILD" -j "$(nproc)" --target gpu_tests >/dev/null
for seed in $SEEDS; do
  [ -z "$(first_failure "$seed")" ] || { echo "mutate-barriers: the unmutated tests fail at seed $seed" >&2; exit 2; }
done

rows=()
missed=0
for file in "${FILES[@]}"; do
  mapfile -t lines < <(grep -n '^[^/]*__syncthreads();' "$file" | cut -d: -f1)
  for line in "${lines[@]}"; do
    cp -p "$file" "$backup_dir/original"
    current=$file
    sed -i "${line}s/__syncthreads();/(void)0;/" "$file"
    if cmake --build "$BUILD" -j "$(nproc)" --target gpu_tests >"$backup_dir/build.log" 2>&1; then
      result=$(verdict)
    else
      result="BUILD FAILED"
    fi
    restore
    [[ "$result" == *" at seed "* ]] || missed=$((missed + 1))
    rows+=("$file:$line | $(context "$file" "$line") | $result")
    echo "${rows[-1]}"
  done
done

cmake --build "$BUILD" -j "$(nproc)" --target gpu_tests >/dev/null  # the unmutated binary again

echo
echo "barrier | code around it | caught by"
printf '%s\n' "${rows[@]}"
echo "mutate-barriers: ${#rows[@]} barriers, $missed not caught (seeds: $SEEDS)"
[ "$missed" -eq 0 ]
