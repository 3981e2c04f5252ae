#!/usr/bin/env bash
# SIGUSR1 (or SIGTERM) delivered to ONE rank: every rank agrees at the next step boundary,
# a checkpoint is written, all ranks exit with status 75, and --resume latest continues.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"  # BIN, T, fail, mpirun as root
e2e_text 400 "In the beginning God created the heaven and the earth."
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null || exit 1
ARGS="--data $T/data/train.bin --seq-len 64 --micro-batch 4 --n-layer 4 --n-embd 256 --n-head 4 --steps 100000 --quiet --ckpt-dir $T/ck"
for sig in USR1 TERM; do
  rm -rf "$T/ck" "$T/l.jsonl"
  mpirun -np 2 --oversubscribe "$BIN" train $ARGS --log "$T/l.jsonl" > "$T/out.txt" 2>&1 &
  mpid=$!
  # wait until both ranks are training (a first step logged: both installed their handlers
  # before it; start-up takes seconds under a sanitizer build), then signal only the rank
  # with the highest pid
  for i in $(seq 1 600); do [ -s "$T/l.jsonl" ] && break; sleep 0.1; done
  rank_pid=$(pgrep -f "shardgpt train.*$T/ck" | grep -v "^$mpid\$" | sort -n | tail -1)
  kill -$sig "$rank_pid"
  for i in $(seq 1 300); do kill -0 $mpid 2>/dev/null || break; sleep 0.1; done
  if kill -0 $mpid 2>/dev/null; then echo "FAIL: ranks still running 30 s after SIG$sig"; kill -9 $mpid; exit 1; fi
  wait $mpid; rc=$?
  [ $rc -eq 75 ] || { echo "FAIL: SIG$sig: exit status $rc, expected 75"; cat "$T/out.txt"; exit 1; }
  grep -q "stop signal received" "$T/out.txt" || { echo "FAIL: no stop message"; cat "$T/out.txt"; exit 1; }
  "$BIN" ckpt verify "$T/ck" >/dev/null || { echo "FAIL: checkpoint after SIG$sig does not verify"; exit 1; }
  step=$(sed 's/step_0*//' "$T/ck/latest")
  mpirun -np 2 --oversubscribe "$BIN" train $ARGS --resume latest --stop-at-step $((step + 2)) --log "$T/r-$sig.jsonl" >/dev/null \
    || { echo "FAIL: resume after SIG$sig"; exit 1; }
  first=$(head -1 "$T/r-$sig.jsonl" | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['step'])")
  [ "$first" -eq $((step + 1)) ] || { echo "FAIL: resumed at step $first, expected $((step + 1))"; exit 1; }
  echo "SIG$sig to one rank: all ranks checkpointed at step $step and exited 75; resumed at step $first"
done
echo "signal ok"
