#!/usr/bin/env bash
# AddressSanitizer + UBSan loop over the multi-rank tests that start several communicators and
# communication threads: each test under `mpirun -np 4`, round after round,
# for ASAN_MINUTES (default 20) or ASAN_RUNS rounds (default 100), whichever ends first; prints
# per test the runs passed and failed, and keeps the log of every failing run. Not part of
# .ci/run (CI time; CI's sanitizer pass runs each test once): run by hand, beside
# scripts/test-tsan.sh.
#   scripts/test-asan-loop.sh [TEST ...]      default: hsdp_test hsdp_order_test checkpoint_test
# The build (BUILD_ASAN, default build-asan/): clang, the options of scripts/test-sanitize.sh,
# CUDA off (faster to build; the tests here do not use it).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_ASAN:-build-asan}
MINUTES=${ASAN_MINUTES:-20}
RUNS=${ASAN_RUNS:-100}
TESTS=("$@"); [ ${#TESTS[@]} -eq 0 ] && TESTS=(hsdp_test hsdp_order_test checkpoint_test)
command -v clang++ >/dev/null || { echo "needs clang (apt-get install clang libomp-dev)"; exit 1; }
CC=clang CXX=clang++ cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Sanitize -DCMAKE_C_FLAGS_SANITIZE="-O1 -g" \
  -DCMAKE_CXX_FLAGS_SANITIZE="-O1 -g" -DSHARDGPT_SANITIZE=ON -DSHARDGPT_CUDA=OFF -DSHARDGPT_BENCH=OFF >/dev/null || exit 1
cmake --build "$BUILD" -j "${JOBS:-2}" --target "${TESTS[@]}" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:symbolize=1:fast_unwind_on_malloc=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0
logs="$BUILD/asan-logs"; mkdir -p "$logs"
declare -A ok bad
for t in "${TESTS[@]}"; do ok[$t]=0; bad[$t]=0; done
end=$(( $(date +%s) + MINUTES * 60 ))
round=0
while [ $round -lt "$RUNS" ] && [ "$(date +%s)" -lt $end ]; do
  round=$((round + 1))
  for t in "${TESTS[@]}"; do
    log="$logs/$t.round$round.log"
    timeout 900 mpirun -np 4 "$BUILD/tests/mpi/$t" > "$log" 2>&1; rc=$?
    if [ $rc -eq 0 ]; then ok[$t]=$((ok[$t] + 1)); rm -f "$log"
    else bad[$t]=$((bad[$t] + 1)); echo "round $round $t: status $rc, see $log"; fi
  done
  line="asan round $round ($(date -u +%T)):"
  for t in "${TESTS[@]}"; do line="$line $t ${ok[$t]} passed ${bad[$t]} failed;"; done
  echo "$line"
done
total_bad=0; for t in "${TESTS[@]}"; do total_bad=$((total_bad + bad[$t])); done
[ $total_bad -eq 0 ] && echo "asan loop: $round round(s), no failure" || { echo "asan loop: $total_bad failing run(s)"; exit 1; }
