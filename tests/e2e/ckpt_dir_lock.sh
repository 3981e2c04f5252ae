#!/usr/bin/env bash
# One job per --ckpt-dir, found at start: a second job on a directory in use is refused naming
# the directory and the holder; after the holder is killed (-9) its stale lock is taken over;
# an unwritable --ckpt-dir is reported before the first step.
set -u
BIN=$1
T=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
printf 'In the beginning God created the heaven and the earth. %.0s' $(seq 1 400) > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null || { echo "prepare failed"; exit 1; }
A="--data $T/data/train.bin --seq-len 16 --micro-batch 2 --quiet --ckpt-dir $T/ck"
fail=0
mpirun -np 2 --oversubscribe "$BIN" train $A --steps 1000000 >/dev/null 2>&1 &
first=$!
trap 'kill -9 $first 2>/dev/null; pkill -9 -f "$T/data" 2>/dev/null; rm -rf "$T"' EXIT
# Waits for the event (the lock written), however slow the start: only the first job's end stops it.
while [ ! -s "$T/ck/.lock" ] && kill -0 $first 2>/dev/null; do sleep 0.1; done
[ -s "$T/ck/.lock" ] || { echo "FAIL: the first job ended without writing its lock"; exit 1; }
out=$(timeout 300 mpirun -np 2 --oversubscribe "$BIN" train $A --steps 2 2>&1); rc=$?
echo "$out" | grep '^shardgpt: error:'
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c '^shardgpt: error:.*in use by another job' <<<"$out")" -eq 1 ] \
  || { echo "FAIL: second job: rc=$rc"; echo "$out" | head -5; fail=1; }
pkill -9 -f "$T/data"; wait $first 2>/dev/null
[ -s "$T/ck/.lock" ] || { echo "FAIL: kill -9 should leave a stale lock"; fail=1; }
out=$(timeout 300 mpirun -np 2 --oversubscribe "$BIN" train $A --steps 2 2>&1) || { echo "FAIL: stale lock not taken over"; echo "$out" | head -5; fail=1; }
[ -e "$T/ck/.lock" ] && { echo "FAIL: lock left after a clean exit"; fail=1; }
mkdir -p "$T/ro" && chmod 0555 "$T/ro"
out=$(timeout 300 mpirun -np 2 --oversubscribe "$BIN" train --data "$T/data/train.bin" --seq-len 16 --micro-batch 2 \
      --steps 2 --ckpt-dir /proc/shardgpt-nope 2>&1); rc=$?
echo "$out" | grep '^shardgpt: error:'
{ [ $rc -ne 0 ] && grep -q '^shardgpt: error: --ckpt-dir /proc/shardgpt-nope' <<<"$out" && ! grep -q 'step ' <<<"$out"; } \
  || { echo "FAIL: unwritable --ckpt-dir not reported at start (rc=$rc)"; echo "$out" | head -5; fail=1; }
exit $fail
