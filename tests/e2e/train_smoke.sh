#!/usr/bin/env bash
# End to end through the executable: prepare -> train on 2 ranks (loss falls, val loss and a
# sample printed, JSONL fields present) -> the same seed gives bit-identical logs -> the saved
# llm.c model is read back by `sample` and by `train --init` (same starting loss as the end).
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"  # BIN, T, fail, mpirun as root
e2e_text 300 "In the beginning God created the heaven and the earth. And the earth was without form."
"$BIN" prepare --input "$T/text.txt" --output "$T/data" --val-fraction 0.1 >/dev/null
run() {  # run LOGFILE [flags]
  local log=$1; shift
  mpirun -np 2 --oversubscribe "$BIN" train --data "$T/data/train.bin" --val-data "$T/data/val.bin" \
    --seq-len 32 --micro-batch 4 --steps 30 --lr 3e-3 --eval-every 10 --log "$log" --seed 7 "$@"
}
out=$(run "$T/a.jsonl" --zero-stage 2 --save-model "$T/m.bin" --sample-tokens 40 --sample-prompt "In the")
echo "$out" | tail -4
grep -q "final train loss" <<<"$out"
grep -q -- "---- sample" <<<"$out"
run "$T/b.jsonl" --zero-stage 2 --quiet >/dev/null
/usr/bin/python3 - "$T/a.jsonl" "$T/b.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == 30, len(a)
for k in ["step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s", "ms", "comm_bytes", "model_state_bytes",
          "activation_bytes", "peak_bytes", "exposed_comm_ms", "exposed_forward_ms", "exposed_backward_ms",
          "exposed_after_backward_ms", "comm_busy_ms"]:
    assert k in a[0], k
for r in a:  # the peak counts the persistent state, the activations and stage 2's gradient scratch
    assert r["peak_bytes"] > r["model_state_bytes"] + r["activation_bytes"], r
    assert r["activation_bytes"] > 0, r
    parts = r["exposed_forward_ms"] + r["exposed_backward_ms"] + r["exposed_after_backward_ms"]
    assert abs(parts - r["exposed_comm_ms"]) <= 1e-6 * max(1.0, r["exposed_comm_ms"]) + 1e-9, r
assert [r["loss"] for r in a] == [r["loss"] for r in b], "same seed must give identical losses"
assert sum("val_loss" in r for r in a) == 3
assert a[-1]["loss"] < a[0]["loss"] - 1.0, (a[0]["loss"], a[-1]["loss"])
assert a[0]["comm_bytes_per_rank"][0] > 0 and len(a[0]["comm_bytes_per_rank"]) == 2
print("jsonl ok: loss %.3f -> %.3f, val %.3f" % (a[0]["loss"], a[-1]["loss"], a[-1]["val_loss"]))
PY
s=$("$BIN" sample --model-file "$T/m.bin" --prompt "In the" -n 20 --seed 3)
[ ${#s} -ge 20 ] || { echo "sample too short: $s"; exit 1; }
# --init from the saved model starts at (about) the final loss, far below ln(256)
mpirun -np 1 "$BIN" train --data "$T/data/train.bin" --init "$T/m.bin" --seq-len 32 --micro-batch 8 --steps 1 \
  --lr 1e-9 --log "$T/c.jsonl" --quiet >/dev/null
/usr/bin/python3 - "$T/a.jsonl" "$T/c.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
c = [json.loads(l) for l in open(sys.argv[2])]
assert c[0]["loss"] < a[0]["loss"] - 1.0, (c[0]["loss"], a[0]["loss"])
print("init ok: %.3f" % c[0]["loss"])
PY
echo "train smoke ok"
