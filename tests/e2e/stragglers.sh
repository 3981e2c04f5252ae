#!/usr/bin/env bash
# Straggler detection (--straggler-every, docs/DIAGNOSE.md) on 2 ranks:
#   slow     SHARDGPT_TEST_SLOW=1:forward:300 makes rank 1 sleep 300 ms in its forward of every
#            step: rank 1 is named (one log line: rank, host, phase forward, score) and in the
#            JSONL's "stragglers" of every report row, with every rank's figures beside it
#   healthy  the same run without the hook: no rank is named
# Independent of the machine's speed: the hook's 300 ms is far above a step of this model, and
# the runs use --straggler-threshold 0.3 so that a loaded machine's jitter (a rank preempted for
# a few ms) is never a straggler while the hooked rank's score (well under 0.1) always is. Only
# the named rank is asserted, never a score's value.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"  # BIN, T, fail, mpirun as root
e2e_prepare 400 "In the beginning God created the heaven and the earth."
ARGS="--data $T/data/train.bin --n-layer 2 --n-embd 64 --n-head 2 --seq-len 32 --micro-batch 4 --steps 20 --quiet
      --threads 1 --straggler-every 10 --straggler-threshold 0.3"

SHARDGPT_TEST_SLOW=1:forward:300 timeout 300 mpirun -np 2 --oversubscribe "$BIN" train $ARGS --log "$T/slow.jsonl" \
  > "$T/slow.out" 2>&1 || { cat "$T/slow.out"; fail "slow: the run failed"; }
[ "$(grep -c '^shardgpt: straggler: rank 1 on host .*, phase forward, score 0\.[0-9]* over steps' "$T/slow.out")" -eq 2 ] ||
  { cat "$T/slow.out"; fail "slow: rank 1 is not named once per report (steps 2-10, 11-20)"; }
grep -q 'straggler: rank 0' "$T/slow.out" && { cat "$T/slow.out"; fail "slow: rank 0 named"; }
python3 - "$T/slow.jsonl" <<'PY' || fail "slow: the JSONL rows do not name rank 1"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
reports = [r for r in rows if "stragglers" in r]
assert [r["step"] for r in reports] == [10, 20], [r["step"] for r in reports]
for r in reports:
    assert [(s["rank"], s["phase"]) for s in r["stragglers"]] == [(1, "forward")], r["stragglers"]
    assert r["stragglers"][0]["host"] and 0 < r["stragglers"][0]["score"] < 0.3
    assert len(r["straggler_score_per_rank"]) == 2 and r["straggler_score_per_rank"][0] == 1.0
    ms = r["phase_ms_per_rank"]
    assert set(ms) == {"data", "forward", "backward", "optimizer", "comm_wait"}, ms
    assert all(len(v) == 2 for v in ms.values()) and ms["forward"][1] >= 300, ms
    assert r["straggler_steps"] == (9 if r["step"] == 10 else 10)  # the first step is not timed
assert all("stragglers" not in r for r in rows if r["step"] % 10)
PY
echo "ok   slow: rank 1 named in forward"

timeout 300 mpirun -np 2 --oversubscribe "$BIN" train $ARGS --log "$T/healthy.jsonl" > "$T/healthy.out" 2>&1 ||
  { cat "$T/healthy.out"; fail "healthy: the run failed"; }
grep -q 'straggler:' "$T/healthy.out" && { cat "$T/healthy.out"; fail "healthy: a rank is named without the hook"; }
python3 - "$T/healthy.jsonl" <<'PY' || fail "healthy: a JSONL row names a straggler"
import json, sys
reports = [r for r in map(json.loads, open(sys.argv[1])) if "stragglers" in r]
assert len(reports) == 2 and all(r["stragglers"] == [] for r in reports), reports
PY
echo "ok   healthy: no rank named"

# --straggler-every 0: no report, no field
"$BIN" train $ARGS --straggler-every 0 --steps 3 --log "$T/off.jsonl" > "$T/off.out" 2>&1 || { cat "$T/off.out"; fail "off: the run failed"; }
grep -q '"stragglers"' "$T/off.jsonl" && fail "off: a row has stragglers"
echo "stragglers ok"
