#!/usr/bin/env bash
# The flight recorder and `shardgpt diagnose` over NCCL (--device cuda --comm nccl, 2 ranks; a
# GPU per rank, or the CUDA emulation), through the test fault hooks (SHARDGPT_TEST_FAULT,
# parallel/flight_recorder.h):
#   stop-forward  rank 1 hangs when its forward of unit 2 at step 3 begins (ZeRO stage 3: rank 0
#                 waits in the unit's NCCL all-gather). Rank 0's NCCL watchdog expires, writes
#                 its dump and asks rank 1 for its own over the MPI control communicator: both
#                 ranks dump, the job ends non-zero with rank 0's NCCL watchdog line, and
#                 diagnose says not-arrived, rank 1, phase forward unit 2, on the nccl ring.
# Every wait is for an event (the job's end); the watchdog's 10 s timeout only starts once the
# collective started (the fault fired), and the bound is far above it.
# Exits 77 (skipped) where `--device cuda` has no GPU or fewer than 2 GPUs are visible.
set -uo pipefail
source "$(dirname "$0")/../e2e/lib/common.sh"  # BIN, T, fail, mpirun as root
source "$(dirname "$0")/lib/gpu_count.sh"      # GPU_COUNT
export OMPI_MCA_rmaps_base_oversubscribe=1
e2e_prepare 200 "In the beginning God created the heaven and the earth."
MODEL="--data $T/data/train.bin --seq-len 16 --n-layer 2 --n-embd 32 --n-head 2 --micro-batch 2 --threads 1 --quiet"
if ! probe=$("$BIN" train $MODEL --steps 1 --device cuda 2>&1); then
  if grep -q "no usable GPU" <<<"$probe"; then echo "SKIP: $probe"; exit 77; fi
  echo "$probe"; exit 1
fi
[ "$GPU_COUNT" -ge 2 ] || { echo "SKIP: NCCL needs a GPU per rank, $GPU_COUNT visible"; exit 77; }

start=$SECONDS
SHARDGPT_TEST_FAULT=stop-forward:1:3:2 timeout 300 mpirun -np 2 -x SHARDGPT_TEST_FAULT "$BIN" train $MODEL \
  --steps 100000 --zero-stage 3 --device cuda --comm nccl --comm-timeout 10 --flight-dir "$T/stop" > "$T/stop.out" 2>&1
rc=$?
took=$((SECONDS - start))
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat "$T/stop.out"; fail "stop-forward: exit status $rc (124: hung)"; }
grep -q "shardgpt: error: rank 0: NCCL: .*did not complete within --comm-timeout 10 s" "$T/stop.out" ||
  { cat "$T/stop.out"; fail "stop-forward: no NCCL watchdog line from rank 0"; }
pgrep -f "$T/data/train.bin" >/dev/null && fail "stop-forward: a rank is still running"
# the job's one verdict, printed by rank 0 (the rank whose watchdog expired) from both dumps
[ "$(grep -c "the job's verdict from the flight dumps" "$T/stop.out")" -eq 1 ] ||
  { cat "$T/stop.out"; fail "stop-forward: not exactly one job verdict line"; }
grep -qE "^shardgpt: error: rank 0: NCCL: .*the job's verdict from the flight dumps \(shardgpt diagnose [^)]*\): not-arrived: culprit rank\(s\) 1\b" "$T/stop.out" ||
  { cat "$T/stop.out"; fail "stop-forward: rank 0's line does not carry the verdict naming rank 1"; }
ls "$T/stop"/rank_0000{0,1}.json >/dev/null || { cat "$T/stop.out"; fail "stop-forward: not both ranks wrote a dump"; }
grep -q '"reason":"nccl_watchdog"' "$T/stop/rank_00000.json" || fail "stop-forward: rank 0's dump is not the watchdog's"
grep -q '"reason":"peer_request"' "$T/stop/rank_00001.json" || fail "stop-forward: rank 1's dump is not at rank 0's request"

"$BIN" diagnose "$T/stop" > "$T/stop.diag" 2>&1
drc=$?
[ $drc -eq 3 ] || { cat "$T/stop.diag"; fail "stop-forward: diagnose exit status $drc, expected 3 (a verdict)"; }
for want in '^not-arrived$' '^nccl .*rank 1 never reached it' 'phase forward unit 2' 'rank\(s\) 0 arrived'; do
  grep -qE -- "$want" "$T/stop.diag" || { cat "$T/stop.out" "$T/stop.diag"; fail "stop-forward: diagnose lacks /$want/"; }
done
"$BIN" diagnose --json "$T/stop" > "$T/stop.json"  # status 3: a verdict
/usr/bin/python3 - "$T/stop.json" <<'PY' || fail "stop-forward: --json does not name rank 1 in forward unit 2"
import json, sys
j = json.load(open(sys.argv[1]))
c = [c for c in j["communicators"] if c["culprits"]][0]
assert j["verdict"] == "not-arrived" and c["culprits"][0]["rank"] == 1 and c["culprits"][0]["phase"] == "forward unit 2", j
PY
echo "ok   stop-forward over NCCL: exit $rc after $took s; $(head -2 "$T/stop.diag" | tr '\n' ' ')"
echo "flight_nccl: ok"
