#!/usr/bin/env bash
# ThreadSanitizer pass over the MPI communicator and the engine with two communication threads
# under MPI_THREAD_MULTIPLE, as two-host HSDP/ZeRO-3 jobs run them (races there are rare).
# Not part of .ci/run (CI time): run by hand.
#  1. builds the multi-rank tests with clang -fsanitize=thread (LLVM's OpenMP, whose runtime
#     TSan understands; no CUDA) into build-tsan/;
#  2. runs the HSDP, ZeRO-3 and communicator tests under mpirun, over and over, for
#     TSAN_MINUTES (default 20) or TSAN_RUNS rounds (default 100), whichever ends first;
#     Open MPI's and the other libraries' own reports are suppressed by library name
#     (tests/tsan.supp). Any report of ours fails the round; the script prints the count.
# Extra arguments: the test binaries to run (default: hsdp_test hsdp_order_test engine_test
# communicator_test).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_TSAN:-build-tsan}
MINUTES=${TSAN_MINUTES:-20}
RUNS=${TSAN_RUNS:-100}
TESTS=("$@"); [ ${#TESTS[@]} -eq 0 ] && TESTS=(hsdp_test hsdp_order_test engine_test communicator_test)
dpkg-query -W -f='${Status}' clang 2>/dev/null | grep -q "install ok installed" || { echo "needs clang (apt-get install clang libomp-dev)"; exit 1; }
CC=clang CXX=clang++ cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=TSan -DCMAKE_C_FLAGS_TSAN="-O1 -g -fsanitize=thread" \
  -DCMAKE_CXX_FLAGS_TSAN="-O1 -g -fsanitize=thread" -DCMAKE_EXE_LINKER_FLAGS_TSAN="-fsanitize=thread" \
  -DSHARDGPT_CUDA=OFF -DSHARDGPT_BENCH=OFF >/dev/null || exit 1
cmake --build "$BUILD" -j "${JOBS:-2}" --target "${TESTS[@]}" || exit 1
[ "${SHARDGPT_TSAN_BUILD_ONLY:-0}" = 1 ] && exit 0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
export TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp:halt_on_error=1:exitcode=66:second_deadlock_stack=1:report_signal_unsafe=0"
logs="$BUILD/tsan-logs"; mkdir -p "$logs"
np_of() { case $1 in hsdp_test|hsdp_order_test) echo 4 ;; *) echo 2 ;; esac; }
end=$(( $(date +%s) + MINUTES * 60 ))
rounds=0; bad=0
while [ $rounds -lt "$RUNS" ] && [ "$(date +%s)" -lt $end ]; do
  rounds=$((rounds + 1))
  for t in "${TESTS[@]}"; do
    log="$logs/$t.round$rounds.log"
    timeout 900 mpirun -np "$(np_of "$t")" "$BUILD/tests/mpi/$t" > "$log" 2>&1; rc=$?
    if [ $rc -ne 0 ] || grep -q "WARNING: ThreadSanitizer" "$log"; then
      bad=$((bad + 1)); echo "round $rounds $t: status $rc, see $log"; grep -m3 -A12 "WARNING: ThreadSanitizer" "$log"
    else
      rm -f "$log"
    fi
  done
done
echo "tsan: $rounds round(s) of ${TESTS[*]} in $(( (MINUTES * 60 - (end - $(date +%s))) )) s; $bad failing run(s)"
[ $bad -eq 0 ]
