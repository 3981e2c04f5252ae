#!/usr/bin/env bash
# --recompute and --micro-batch auto end to end: `plan --memory` names the largest micro-batch
# per stage x recompute mode; `train --micro-batch auto --memory` picks the same one, reports what
# recomputation costs, writes "recompute" into every JSONL row, and no step's measured peak
# exceeds the budget. Bad values: one error line each, non-zero exit.
set -u -o pipefail
BIN=$1
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
printf 'In the beginning God created the heaven and the earth. %.0s' $(seq 1 300) > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null || { echo "prepare failed"; exit 1; }
fail() { echo "FAIL: $*"; exit 1; }
BUDGET=6MiB
BYTES=$((6 * 1024 * 1024))

# plan: the row of stage 1, recompute block
plan=$("$BIN" plan --model tiny --ranks 2 --seq-len 128 --zero-stage 1 --memory $BUDGET) || fail "plan failed"
echo "$plan" | grep -A14 '^what fits'
row=$(awk '$1 == "1" && $2 == "block" {print $3}' <<<"$plan")
[[ "$row" =~ ^[0-9]+$ ]] && [ "$row" -ge 1 ] || fail "plan gave no micro-batch for stage 1 block: '$row'"
for s in 0 1 2 3; do for m in none gelu block; do
  n=$(awk -v s=$s -v m=$m '$1 == s && $2 == m' <<<"$plan" | wc -l)
  [ "$n" -eq 1 ] || fail "plan has $n rows for stage $s $m"
done; done
none=$(awk '$1 == "1" && $2 == "none" {print $3}' <<<"$plan")
[ "$none" -le "$row" ] || fail "block fits fewer sequences ($row) than none ($none)"

# train with the same budget: the same B, the peak within the budget
out=$(mpirun -np 2 --oversubscribe "$BIN" train --model tiny --data "$T/data/train.bin" --seq-len 128 --zero-stage 1 \
      --micro-batch auto --memory $BUDGET --recompute block --steps 3 --threads 1 --log "$T/l.jsonl" 2>&1) \
  || { echo "$out" | tail -5; fail "train failed"; }
echo "$out" | grep -E '^(--micro-batch auto|recompute )'
grep -q "^--micro-batch auto: B=$row " <<<"$out" || fail "train picked another B than plan's $row"
grep -q '^recompute block: activations .* less than none); recomputation adds .* of the step' <<<"$out" || fail "no recompute line"
rows=$(wc -l < "$T/l.jsonl")
[ "$rows" -eq 3 ] || fail "$rows JSONL rows"
python3 - "$T/l.jsonl" "$BYTES" <<'PY' || fail "JSONL check"
import json, sys
budget = int(sys.argv[2])
for line in open(sys.argv[1]):
    j = json.loads(line)
    assert j["recompute"] == "block", j.get("recompute")
    assert 0 < j["peak_bytes"] <= budget, (j["peak_bytes"], budget)
print("JSONL: recompute block, peak_bytes", max(json.loads(l)["peak_bytes"] for l in open(sys.argv[1])), "<=", budget)
PY

# errors: one line each, non-zero exit
check_error() {  # expected-pattern, args...
  local want=$1; shift
  local o rc
  o=$("$BIN" "$@" 2>&1); rc=$?
  [ $rc -ne 0 ] || fail "exit 0 for: $*"
  [ "$(grep -c '^shardgpt: error:' <<<"$o")" -eq 1 ] || fail "not one error line for: $*: $o"
  grep -q "$want" <<<"$o" || fail "'$want' not in: $o"
}
check_error 'recompute' train --data "$T/data/train.bin" --recompute layer --steps 1
check_error 'memory' train --data "$T/data/train.bin" --micro-batch auto --memory 80XB --steps 1
check_error 'give --micro-batch auto too' train --data "$T/data/train.bin" --memory 80GiB --steps 1
check_error 'micro-batch' train --data "$T/data/train.bin" --micro-batch 0 --steps 1
check_error 'not even one sequence' train --data "$T/data/train.bin" --micro-batch auto --memory 1KiB --steps 1
check_error 'memory' plan --memory -5GiB
# --micro-batch auto without --memory on data of few windows: B is the windows per rank (never
# a B the data cannot feed), the line says the data stopped it, and the run trains
printf 'And God said, Let there be light. %.0s' $(seq 1 12) > "$T/small.txt"
"$BIN" prepare --input "$T/small.txt" --output "$T/small" --val-fraction 0.1 >/dev/null || fail "prepare small failed"
tokens=$(( ($(stat -c %s "$T/small/train.bin") - 1024) / 2 ))
windows=$(( (tokens - 1) / 16 / 2 ))  # T=16, 2 ranks
out=$(mpirun -np 2 --oversubscribe "$BIN" train --model tiny --data "$T/small/train.bin" --seq-len 16 \
      --micro-batch auto --steps 1 --threads 1 2>&1) || { echo "$out" | tail -5; fail "auto on few windows failed"; }
grep '^--micro-batch auto' <<<"$out"
grep -q "^--micro-batch auto: B=$windows .*B=$windows stopped by the data: $windows window(s) per rank" <<<"$out" \
  || fail "auto on few windows: not B=$windows stopped by the data"
# and with a long sequence on plenty of data, the CPU's throughput cap (16384 tokens) stops it
out=$(mpirun -np 2 --oversubscribe "$BIN" train --model tiny --data "$T/data/train.bin" --seq-len 128 --max-seq-len 128 \
      --micro-batch auto --steps 1 --threads 1 2>&1) || { echo "$out" | tail -5; fail "auto without --memory failed"; }
grep '^--micro-batch auto' <<<"$out"
grep -q "^--micro-batch auto: B=[0-9]* .*stopped by \(the data\|the throughput cap\|memory: .* usable = \)" <<<"$out" \
  || fail "auto without --memory: no bound named"
echo "recompute e2e: OK (plan and train agree on B=$row at $BUDGET; few windows: B=$windows)"
