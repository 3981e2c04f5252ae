#!/usr/bin/env bash
# End to end through the tensor-core attention (model/cuda/attention_tc_cuda.cu): a model with
# head size 64 (--n-embd 128 --n-head 2) and a sequence length that is not a multiple of the
# 64-row tile, --dtype bf16 --compute-dtype bf16 on --device cuda (a GPU, or the CUDA emulation)
# against --device cpu with the same flags (the bf16 CPU kernels): every step's loss within
# 2e-2 (the bf16 band of train_cuda.sh); two CUDA runs give bitwise equal losses; every CUDA
# row's attention_tc_calls (the step's attention calls on the tensor-core kernels) is 2: one
# layer, one micro-batch, one forward and one backward, so the tensor-core path is the one run.
# Exits 77 (skipped) where `--device cuda` has no GPU.
set -euo pipefail
source "$(dirname "$0")/../e2e/lib/common.sh"  # BIN, T, fail, mpirun as root
e2e_text 200 "In the beginning God created the heaven and the earth. And the earth was without form."
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null
MODEL="--data $T/data/train.bin --seq-len 80 --n-layer 1 --n-embd 128 --n-head 2 --lr 3e-3 --seed 3 --quiet --threads 1
       --micro-batch 2 --dtype bf16 --compute-dtype bf16"
train() {  # train LOG [flags]
  local log=$1; shift
  if ! out=$(timeout 600 "$BIN" train $MODEL --steps 3 --log "$log" "$@" 2>&1); then
    if grep -q "no usable GPU" <<<"$out"; then echo "SKIP: $out"; exit 77; fi
    echo "FAIL: train $*:"; echo "$out"; exit 1
  fi
}
train "$T/cuda1.jsonl" --device cuda
train "$T/cuda2.jsonl" --device cuda
train "$T/cpu.jsonl" --device cpu
/usr/bin/python3 - "$T/cuda1.jsonl" "$T/cuda2.jsonl" "$T/cpu.jsonl" <<'PY'
import json, sys
rows = [list(map(json.loads, open(f))) for f in sys.argv[1:4]]
for f, rs in zip(sys.argv[1:3], rows[:2]):
    calls = [r.get("attention_tc_calls") for r in rs]
    assert calls and all(n == 2 for n in calls), "%s: attention_tc_calls per step %s, expected 2 (the tensor-core path)" % (f, calls)
a, b, c = ({r["step"]: r["loss"] for r in rs} for rs in rows)
assert sorted(a) == sorted(b) == sorted(c) and len(a) == 3, (sorted(a), sorted(b), sorted(c))
assert a == b, "two CUDA runs differ: %s vs %s" % (a, b)
worst = max(abs(a[s] - c[s]) for s in a)
assert worst <= 2e-2, "max |loss - cpu| %.3g > 2e-2: %s vs %s" % (worst, a, c)
print("tensor-core attention, bf16: max |loss - cpu| = %.2e over %d steps; two CUDA runs bitwise equal; 2 tensor-core attention calls per step" % (worst, len(a)))
PY
