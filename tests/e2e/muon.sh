#!/usr/bin/env bash
# --optimizer muon through the executable: training on 2 ranks at stage 3 lowers the loss and
# logs Muon's all_to_all bytes and Newton-Schulz time; its checkpoint resumes on 1 rank at
# stage 0 with muon, and is refused with one error line (no hang, nothing written) as adamw;
# `plan` shows Muon's state and traffic; a bad --muon-momentum is one error line.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"  # BIN, T, fail, mpirun as root
e2e_text 200 "In the beginning God created the heaven and the earth. And the earth was without form."
"$BIN" prepare --input "$T/text.txt" --output "$T/data" --val-fraction 0.1 >/dev/null
train() {  # train NP [flags]
  local np=$1; shift
  mpirun -np "$np" --oversubscribe "$BIN" train --data "$T/data/train.bin" --val-data "$T/data/val.bin" \
    --n-layer 2 --n-head 2 --n-embd 32 --seq-len 32 --micro-batch 4 --lr 1e-2 --seed 3 --quiet "$@"
}
train 2 --steps 12 --zero-stage 3 --optimizer muon --log "$T/a.jsonl" --ckpt-dir "$T/ck" >/dev/null
/usr/bin/python3 - "$T/a.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert rows[-1]["loss"] < rows[0]["loss"] - 0.5, (rows[0]["loss"], rows[-1]["loss"])
for r in rows:
    assert r["comm_bytes"]["all_to_all"] > 0 and r["muon_ns_ms"] >= 0, r
print("muon: loss", round(rows[0]["loss"], 3), "->", round(rows[-1]["loss"], 3), "all_to_all",
      rows[-1]["comm_bytes"]["all_to_all"], "B/step")
PY
out=$(train 1 --steps 14 --zero-stage 0 --optimizer muon --ckpt-dir "$T/ck" --resume latest 2>&1)
grep -q "final train loss" <<<"$out"
before=$(ls -R "$T/ck" | md5sum)
if err=$(train 2 --steps 14 --zero-stage 1 --ckpt-dir "$T/ck" --resume latest 2>&1); then
  echo "an adamw run resumed a muon checkpoint"; exit 1
fi
echo "$err"
[ "$(grep -c 'shardgpt: error:' <<<"$err")" -eq 1 ]
grep -q "saved by --optimizer muon, this run uses --optimizer adamw" <<<"$err"
[ "$(ls -R "$T/ck" | md5sum)" = "$before" ]
plan=$("$BIN" plan --n-layer 2 --n-head 2 --n-embd 32 --seq-len 32 --ranks 4 --optimizer muon)
grep -q "optimizer muon: 12 matrices" <<<"$plan"
if err=$(train 1 --steps 1 --optimizer muon --muon-momentum 1.5 2>&1); then echo "accepted momentum 1.5"; exit 1; fi
[ "$(grep -c 'error' <<<"$err")" -eq 1 ]
echo "muon e2e: ok"
