#!/usr/bin/env bash
# The requeue idiom of slurm/*.sbatch, without Slurm (tests/slurm/ runs it under a real one):
#  - --resume auto on an empty --ckpt-dir starts fresh; with a checkpoint it resumes and says
#    from which step and on how many ranks;
#  - a resumed run's JSONL log keeps the rows up to the checkpoint's step, drops the rows
#    written after it (and a row cut short by a kill), and appends: every step exactly once,
#    the rewritten rows bitwise equal to the first run's;
#  - SIGUSR1 to ONE rank while validation runs stops every rank inside that validation (not
#    after it): checkpoint, exit 75; also during the final validation; the resumed runs end with
#    the losses of an uninterrupted run and the final validation done.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"  # BIN, T, fail, mpirun as root
e2e_prepare 300 "In the beginning God created the heaven and the earth. And the earth was without form."

# ---- log rows across a resume ----
A="--data $T/data/train.bin --seq-len 32 --micro-batch 6 --steps 20 --lr 3e-3 --seed 5 --quiet --n-layer 2 --n-embd 64 --n-head 4 --ckpt-dir $T/ck --ckpt-every 5 --resume auto"
out=$(mpirun -np 2 --oversubscribe "$BIN" train $A --log "$T/a.jsonl") || fail "first run: $out"
grep -q -- "--resume auto: no checkpoint in $T/ck yet, starting from step 0 on 2 rank(s)" <<<"$out" || fail "no fresh-start line: $out"
# as if the job had been killed after logging step 20 with step 10 its newest checkpoint, in the
# middle of writing a row
rm -rf "$T/ck/step_00000015" "$T/ck/step_00000020"
echo step_00000010 > "$T/ck/latest"
cp "$T/a.jsonl" "$T/b.jsonl"
printf '{"step": 21, "loss": 2.' >> "$T/b.jsonl"
out=$(mpirun -np 2 --oversubscribe "$BIN" train $A --log "$T/b.jsonl") || fail "resumed run: $out"
grep -q "resumed from $T/ck/step_00000010 at step 10 .* on 2 rank(s)" <<<"$out" || fail "no resume line: $out"
grep -q "kept 10 row(s) up to step 10, dropped 11" <<<"$out" || fail "no log line: $out"
/usr/bin/python3 - "$T/a.jsonl" "$T/b.jsonl" <<'PY' || exit 1
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [r["step"] for r in b] == list(range(1, 21)), [r["step"] for r in b]
assert [r["loss"] for r in b] == [r["loss"] for r in a], "re-run rows must equal the first run's"
print("log: 20 rows, steps 1..20 once each after a resume from step 10 (rows 11..20 and a partial row dropped, rewritten bitwise equal)")
PY

# ---- a stop while validation runs ----
for i in $(seq 1 20000); do echo "In the beginning God created the heaven and the earth. And the earth was without form."; done > "$T/big.txt"
"$BIN" prepare --input "$T/big.txt" --output "$T/big" --val-fraction 0.5 >/dev/null || fail prepare
# The signal must land inside a validation whatever the machine's speed (no fixed delay can
# promise that): SHARDGPT_TEST_HOLD_IN_VALIDATION holds every validation after its first
# micro-batch until a stop signal has reached a rank, and says so on stdout: the signal is sent
# after that line.
V="--data $T/big/train.bin --val-data $T/big/val.bin --seq-len 64 --micro-batch 4 --n-layer 2 --n-embd 64 --n-head 4 --steps 2 --eval-every 1 --ckpt-dir $T/cv --resume auto --log $T/c.jsonl"
for want in 1 2; do
  SHARDGPT_TEST_HOLD_IN_VALIDATION=1 mpirun -np 2 --oversubscribe -x SHARDGPT_TEST_HOLD_IN_VALIDATION \
    "$BIN" train $V --val-batches 1000 > "$T/out.txt" 2>&1 &
  mpid=$!
  for i in $(seq 1 600); do grep -q "^test hook: holding in validation" "$T/out.txt" && break; sleep 0.1; done
  kill -USR1 "$(pgrep -f "shardgpt train.*$T/cv" | grep -v "^$mpid\$" | sort -n | tail -1)"
  for i in $(seq 1 300); do kill -0 $mpid 2>/dev/null || break; sleep 0.1; done
  kill -0 $mpid 2>/dev/null && { kill -9 $mpid; fail "ranks still running 30 s after SIGUSR1 during validation"; }
  wait $mpid; rc=$?
  [ $rc -eq 75 ] || { cat "$T/out.txt"; fail "exit status $rc, expected 75"; }
  grep -q "stop signal received (during validation): checkpointing at step $want " "$T/out.txt" \
    || { cat "$T/out.txt"; fail "no stop during the validation of step $want"; }
  "$BIN" ckpt verify "$T/cv" >/dev/null || fail "checkpoint after a stop in validation does not verify"
  echo "SIGUSR1 to one rank during the validation of step $want (of 2): all ranks stopped inside it, checkpoint at step $want, exit 75"
done
# the last resume has no step left: it runs the final validation it was stopped in, then ends
out=$(mpirun -np 2 --oversubscribe "$BIN" train $V --val-batches 2) || fail "final resume: $out"
grep -q "no step left to train (resumed at step 2 of 2) | val loss" <<<"$out" || fail "final validation not done: $out"
mpirun -np 2 --oversubscribe "$BIN" train ${V%%--ckpt-dir*} --val-batches 2 --log "$T/d.jsonl" >/dev/null || fail "reference run"
/usr/bin/python3 - "$T/c.jsonl" "$T/d.jsonl" <<'PY' || exit 1
import json, sys
c = [json.loads(l) for l in open(sys.argv[1])]
d = [json.loads(l) for l in open(sys.argv[2])]
assert [r["step"] for r in c] == [1, 2], c
assert [r["loss"] for r in c] == [r["loss"] for r in d], "losses must equal the uninterrupted run"
assert not any("val_loss" in r for r in c), "an interrupted validation has no val_loss"
print("stopped twice in validation, resumed: losses equal the uninterrupted run; final validation done after the last resume")
PY
echo "requeue ok"
