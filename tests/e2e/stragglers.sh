#!/usr/bin/env bash
# Straggler detection (--straggler-every, docs/DIAGNOSE.md) on 2 ranks:
#   slow     SHARDGPT_TEST_SLOW=1:forward:300 makes rank 1 sleep 300 ms in its forward of every
#            step: rank 1 is named (one log line: rank, host, phase forward, score) and in the
#            JSONL's "stragglers" of every report row, with every rank's figures beside it
#   healthy  the same run without the hook: no rank is named
#   exclude  --straggler-exclude-after 2 with rank 1 on a host of its own name (a UTS namespace:
#            unshare --uts, root): after the second report naming it, its host is written to
#            --ckpt-dir/exclude_hosts, a checkpoint is saved and the run exits 76; the resume on
#            ONE rank (--batch-tokens: the same global batch) completes with the losses of an
#            uninterrupted 2-rank run (bitwise before the stop, within 1e-5 after). On a single
#            host (both ranks' hostname alike) nothing is recorded: the run completes. A rank
#            hung on its own host (SHARDGPT_TEST_FAULT=skip): the watchdog (--comm-timeout 5)
#            records that host before the job ends.
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

# --straggler-exclude-after: rank 1 "on another host" (its own UTS namespace), 2 ranks -> 1
if [ "$(id -u)" -eq 0 ] && unshare --uts true 2>/dev/null; then
  X="$ARGS --steps 30 --straggler-every 5 --batch-tokens 256 --log $T/x.jsonl --ckpt-dir $T/xck --resume auto"
  SHARDGPT_TEST_SLOW=1:forward:300 timeout 300 mpirun -np 1 "$BIN" train $X --straggler-exclude-after 2 : \
    -np 1 unshare --uts /bin/sh -c 'hostname sg-slow-host && exec "$0" "$@"' "$BIN" train $X --straggler-exclude-after 2 \
    > "$T/x.out" 2>&1
  rc=$?
  [ $rc -eq 76 ] || { cat "$T/x.out"; fail "exclude: exit $rc, expected 76"; }
  [ "$(cat "$T/xck/exclude_hosts")" = sg-slow-host ] || { cat "$T/x.out"; fail "exclude: exclude_hosts holds '$(cat "$T/xck/exclude_hosts")'"; }
  grep -q "^straggler: host sg-slow-host named in 2 reports in a row (--straggler-exclude-after): recorded in $T/xck/exclude_hosts; checkpointing at step 10 and exiting (status 76)" "$T/x.out" ||
    { cat "$T/x.out"; fail "exclude: no exclusion line at step 10"; }
  timeout 300 "$BIN" train $X --straggler-exclude-after 2 > "$T/x1.out" 2>&1 || { cat "$T/x1.out"; fail "exclude: the 1-rank resume failed"; }
  grep -q "resumed from $T/xck/step_00000010 at step 10 .* on 1 rank(s)" "$T/x1.out" || { cat "$T/x1.out"; fail "exclude: not resumed at 10 on 1 rank"; }
  timeout 300 mpirun -np 2 --oversubscribe "$BIN" train $ARGS --steps 30 --straggler-every 5 --batch-tokens 256 --log "$T/xref.jsonl" \
    > "$T/xref.out" 2>&1 || { cat "$T/xref.out"; fail "exclude: the reference run failed"; }
  python3 - "$T/x.jsonl" "$T/xref.jsonl" <<'PY' || fail "exclude: losses differ from the uninterrupted run"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ref = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[2]))}
assert [r["step"] for r in rows] == list(range(1, 31)), [r["step"] for r in rows]
assert all(r["loss"] == ref[r["step"]] for r in rows if r["step"] <= 10)
d = max(abs(r["loss"] - ref[r["step"]]) for r in rows if r["step"] > 10)
assert d < 1e-5, d
print(f"  steps 1..10 bitwise, 11..30 on 1 rank within {d:.1e} of the 2-rank run")
PY
  # one host: the straggler is named, nothing is recorded, the run completes
  SHARDGPT_TEST_SLOW=1:forward:300 timeout 300 mpirun -np 2 --oversubscribe "$BIN" train $ARGS --steps 20 --straggler-every 5 \
    --straggler-exclude-after 1 --ckpt-dir "$T/x2ck" > "$T/x2.out" 2>&1 || { cat "$T/x2.out"; fail "exclude: the one-host run failed"; }
  [ -e "$T/x2ck/exclude_hosts" ] && fail "exclude: a one-host job recorded its only host"
  echo "ok   exclude: host recorded, exit 76, resumed on 1 rank with the 2-rank losses; one host: nothing recorded"
  # the watchdog's verdict: rank 1 (its own host name) hangs at step 6 (SHARDGPT_TEST_FAULT=skip);
  # rank 0's watchdog names it and records its host before the job ends
  W="$ARGS --steps 30 --straggler-every 5 --straggler-exclude-after 2 --ckpt-dir $T/wck --comm-timeout 5"
  SHARDGPT_TEST_FAULT=skip:1:6 timeout 300 mpirun -np 1 "$BIN" train $W : \
    -np 1 unshare --uts /bin/sh -c 'hostname sg-hung-host && exec "$0" "$@"' "$BIN" train $W > "$T/w.out" 2>&1
  rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat "$T/w.out"; fail "watchdog: exit $rc, expected the watchdog's failure"; }
  grep -q "^shardgpt: rank 0: the watchdog's verdict names host sg-hung-host: recorded in $T/wck/exclude_hosts$" "$T/w.out" ||
    { cat "$T/w.out"; fail "watchdog: no recording line"; }
  [ "$(cat "$T/wck/exclude_hosts")" = sg-hung-host ] || { cat "$T/w.out"; fail "watchdog: exclude_hosts holds '$(cat "$T/wck/exclude_hosts")'"; }
  echo "ok   watchdog: the verdict's host recorded (exit $rc)"
else
  echo "skip exclude: needs root and unshare --uts"
fi

# --straggler-exclude-after needs --ckpt-dir and reports to count
n=0
expect_error "exclude without --ckpt-dir" "--straggler-exclude-after 2 needs --ckpt-dir" -- "$BIN" train $ARGS --straggler-exclude-after 2
expect_error "exclude without reports" "needs --ckpt-dir (where it records the host and checkpoints) and --straggler-every > 0" -- \
  "$BIN" train $ARGS --straggler-every 0 --straggler-exclude-after 2 --ckpt-dir "$T/eck"

# --straggler-every 0: no report, no field
"$BIN" train $ARGS --straggler-every 0 --steps 3 --log "$T/off.jsonl" > "$T/off.out" 2>&1 || { cat "$T/off.out"; fail "off: the run failed"; }
grep -q '"stragglers"' "$T/off.jsonl" && fail "off: a row has stragglers"
echo "stragglers ok"
