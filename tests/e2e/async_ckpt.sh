#!/usr/bin/env bash
# --async-ckpt (ckpt/async_checkpoint.h):
#  - the files of an async run hold bitwise the values of a synchronous run's (every dataset of
#    every shard file, every checkpoint), and the losses are the same;
#  - a resume from an async checkpoint is bitwise the uninterrupted run (final model);
#  - kill -9 while a background write is in flight (training already past it) leaves the
#    previous checkpoint and `latest` intact and loadable;
#  - a stop signal during a background write waits for it, then checkpoints and exits 75.
# SHARDGPT_TEST_CKPT_HOLD=STEP:FILE holds the write of STEP's checkpoint between the shard files
# and the index until FILE exists: the test, not the machine's speed, decides when it ends.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"  # BIN, T, fail, mpirun as root
e2e_text 400 "In the beginning God created the heaven and the earth. And the earth was without form, and void."
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null
COMMON="--data $T/data/train.bin --seq-len 32 --micro-batch 4 --steps 8 --lr 3e-3 --seed 5 --quiet --n-layer 2 --n-embd 64 --n-head 4"
run() { mpirun -np 2 --oversubscribe "$BIN" train $COMMON "$@" >/dev/null; }
run --zero-stage 3 --ckpt-dir "$T/sync" --ckpt-every 2 --log "$T/sync.jsonl" --save-model "$T/full.bin"
run --zero-stage 3 --ckpt-dir "$T/async" --ckpt-every 2 --log "$T/async.jsonl" --async-ckpt
/usr/bin/python3 - "$T" <<'PY'
import json, sys, os, h5py, numpy as np
d = sys.argv[1]
rows = lambda f: [json.loads(l) for l in open(f"{d}/{f}")]
s, a = rows("sync.jsonl"), rows("async.jsonl")
assert [r["loss"] for r in s] == [r["loss"] for r in a], "async checkpoints changed the losses"
# the save after step 2, 4, 6 is reported in the next row: the time training was blocked
assert all("ckpt_stall_ms" in r for r in a if r["step"] in (3, 5, 7)), a
assert any("ckpt_write_ms" in r for r in a), a
n = 0
for step in ["step_00000002", "step_00000004", "step_00000006", "step_00000008"]:
    for f in sorted(os.listdir(f"{d}/sync/{step}")):
        if not f.startswith("rank_"): continue
        x, y = h5py.File(f"{d}/sync/{step}/{f}", "r"), h5py.File(f"{d}/async/{step}/{f}", "r")
        for k in ["master", "m", "v"]:
            assert np.array_equal(x[k][...].view(np.uint32), y[k][...].view(np.uint32)), (step, f, k)
            n += x[k].size
print(f"async = sync bitwise: {n} values in 4 checkpoints x 2 files x 3 datasets")
PY
"$BIN" ckpt verify "$T/async" >/dev/null
run --zero-stage 3 --ckpt-dir "$T/res" --resume "$T/async/step_00000004" --async-ckpt --ckpt-every 2 --save-model "$T/resumed.bin"
cmp "$T/full.bin" "$T/resumed.bin" || { echo "FAIL: resume from an async checkpoint differs from the uninterrupted run"; exit 1; }
echo "resume from an async checkpoint: final model bitwise equal"

# kill -9 inside a background write: the write of step 4 is held after its shard files (for a
# file that never comes) while training goes on (a log row of step 5 or later proves it), then
# every process dies.
BIG="--data $T/data/train.bin --seq-len 32 --micro-batch 4 --n-layer 2 --n-embd 64 --n-head 4 --steps 100000 --quiet --ckpt-every 2 --async-ckpt"
wait_for() {  # SECONDS CONDITION...
  local n=$(( $1 * 10 )); shift
  for i in $(seq 1 $n); do "$@" && return 0; sleep 0.1; done
  return 1
}
logged_past() { [ -s "$2" ] && [ "$(tail -1 "$2" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])' 2>/dev/null || echo 0)" -ge "$1" ]; }
SHARDGPT_TEST_CKPT_HOLD=4:$T/never mpirun -np 2 --oversubscribe -x SHARDGPT_TEST_CKPT_HOLD \
  "$BIN" train $BIG --ckpt-dir "$T/kill" --log "$T/kill.jsonl" >/dev/null 2>&1 &
mpid=$!
wait_for 60 test -f "$T/kill/latest" || { echo "FAIL: no first checkpoint"; kill -9 $mpid; exit 1; }
wait_for 30 test -d "$T/kill/.tmp.step_00000004" || { echo "FAIL: no second save started"; kill -9 $mpid; exit 1; }
wait_for 30 logged_past 5 "$T/kill.jsonl" || { echo "FAIL: training did not continue during the write"; kill -9 $mpid; exit 1; }
[ -d "$T/kill/.tmp.step_00000004" ] || { echo "FAIL: the held write of step 4 ended before the kill"; kill -9 $mpid; exit 1; }
pkill -9 -f "shardgpt train.*$T/kill" || true
wait $mpid 2>/dev/null || true
[ "$(cat "$T/kill/latest")" = step_00000002 ] || { echo "FAIL: latest is $(cat "$T/kill/latest") after the kill"; exit 1; }
[ ! -e "$T/kill/step_00000004" ] || { echo "FAIL: a step_00000004 directory appeared"; exit 1; }
"$BIN" ckpt verify "$T/kill" >/dev/null || { echo "FAIL: previous checkpoint damaged by kill -9"; exit 1; }
mpirun -np 2 --oversubscribe "$BIN" train $BIG --ckpt-dir "$T/kill" --resume latest --stop-at-step 3 >/dev/null \
  || { echo "FAIL: resume after the kill"; exit 1; }
echo "kill -9 during a background write (training at step >= 5): latest step 2 intact, verified, resumed"

# a stop signal while a write is in flight: the write is waited for, then the stop checkpoint.
# The write of step 2 is held until the test releases it: the run must not end before (a run
# that abandoned the write would), and ends with status 75 after.
rm -rf "$T/sig" "$T/sig.jsonl"
SHARDGPT_TEST_CKPT_HOLD=2:$T/release mpirun -np 2 --oversubscribe -x SHARDGPT_TEST_CKPT_HOLD \
  "$BIN" train $BIG --ckpt-dir "$T/sig" --log "$T/sig.jsonl" >/dev/null 2>&1 &
mpid=$!
wait_for 60 test -d "$T/sig/.tmp.step_00000002" || { echo "FAIL: no save started"; kill -9 $mpid; exit 1; }
rank_pid=$(pgrep -f "shardgpt train.*$T/sig" | grep -v "^$mpid\$" | sort -n | tail -1)
kill -USR1 "$rank_pid"
sleep 2  # (a run that ends here is wrong; on a slower machine this only checks less)
kill -0 $mpid 2>/dev/null || { echo "FAIL: the run ended while its write of step 2 was held"; exit 1; }
[ ! -e "$T/sig/step_00000002" ] || { echo "FAIL: step 2 was published while its write was held"; kill -9 $mpid; exit 1; }
touch "$T/release"
set +e; wait $mpid; rc=$?; set -e
[ $rc -eq 75 ] || { echo "FAIL: exit status $rc after SIGUSR1, expected 75"; exit 1; }
[ -f "$T/sig/step_00000002/index.h5" ] || { echo "FAIL: the save in flight was not completed"; exit 1; }
"$BIN" ckpt verify "$T/sig" >/dev/null || { echo "FAIL: stop checkpoint does not verify"; exit 1; }
echo "SIGUSR1 during a background write: it completed, stop checkpoint $(cat "$T/sig/latest"), exit 75"
echo "async checkpoints ok"
