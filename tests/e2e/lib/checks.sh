# Sourced by the end-to-end tests that run many independent refusals (cli_errors.sh,
# args_robust.sh); needs BIN and T. run_check NAME WANT NP TIMEOUT -- ARGS... runs
# `mpirun -np NP BIN ARGS` in the background, at most CHECK_JOBS (default 4) at a time; the case
# is ok when it exits non-zero within TIMEOUT seconds with exactly one "shardgpt: error:" line,
# which contains WANT. Its verdict goes to $T/results/NNN.ok or .fail. settle waits for every
# case started so far; report_checks (after settle) prints the verdicts in the cases' order
# and sets check_fails to the number that failed or gave no verdict.
# Replaces the caller's EXIT trap: the cases still running finish before T is removed.
CHECK_JOBS=${CHECK_JOBS:-4} check_cases=0 check_pids=()
mkdir -p "$T/results"
trap 'settle 2>/dev/null; rm -rf "$T"' EXIT
run_check() {
  local name=$1 want=$2 np=$3 limit=$4; shift 5
  while [ "$(jobs -rp | wc -l)" -ge "$CHECK_JOBS" ]; do wait -n; done
  check_cases=$((check_cases + 1))
  local result; result=$(printf '%s/results/%03d' "$T" "$check_cases")
  (
    out=$(timeout "$limit" mpirun -np "$np" --oversubscribe "$BIN" "$@" 2>&1 >/dev/null); rc=$?
    n=$(grep -c '^shardgpt: error:' <<<"$out")
    if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ "$n" -ne 1 ] || ! grep -q -- "$want" <<<"$out"; then
      { echo "FAIL $name: rc=$rc, $n error lines, wanted '$want'"; echo "$out" | head -5; } >"$result.fail"
    else
      echo "ok   $name: $(grep '^shardgpt: error:' <<<"$out")" >"$result.ok"
    fi
  ) &
  check_pids+=($!)
}
settle() { [ ${#check_pids[@]} -eq 0 ] || wait "${check_pids[@]}"; check_pids=(); }
report_checks() {
  local r ran
  for r in "$T"/results/*; do [ -e "$r" ] && cat "$r"; done
  check_fails=$(find "$T/results" -name '*.fail' | wc -l)
  ran=$(find "$T/results" -type f | wc -l)
  [ "$ran" -eq "$check_cases" ] || { echo "FAIL: $check_cases cases started, $ran verdicts"; check_fails=$((check_fails + 1)); }
}
