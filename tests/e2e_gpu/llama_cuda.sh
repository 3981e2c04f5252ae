#!/usr/bin/env bash
# --arch llama end to end with --device cuda (a GPU, or the CUDA emulation of a build-emu/ build)
# against --device cpu on the same data and flags: grouped-query attention (8 query heads, 2 kv
# heads), an untied head, θ = 500,000, T = 31 (not a multiple of anything), 2 ranks:
#   fp32 at ZeRO stages 0 and 3: every step's loss within 1e-4 of the CPU run's;
#   bf16 (--dtype bf16) at stage 1, and multi-query tied (--n-kv-head 1 --tie-embeddings) at
#   stage 2 in fp32: within 2e-2 and 1e-4 (the bands of train_cuda.sh);
#   two CUDA runs give bitwise equal losses, and the loss falls.
# Where fewer GPUs than ranks are visible, the runs go over --comm mpi (ranks sharing a GPU).
# Exits 77 (skipped) where `--device cuda` has no GPU.
set -euo pipefail
source "$(dirname "$0")/../e2e/lib/common.sh"  # BIN, T, fail, mpirun as root
source "$(dirname "$0")/lib/gpu_count.sh"      # gpu_comm: --comm mpi where ranks share a GPU
e2e_text 200 "In the beginning God created the heaven and the earth. And the earth was without form, and void."
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null
LLAMA="--arch llama --n-layer 2 --n-head 8 --n-kv-head 2 --n-embd 64 --ffn-hidden 96 --rope-theta 500000"
MODEL="--data $T/data/train.bin --seq-len 31 --micro-batch 2 --grad-accum 2 --lr 3e-3 --seed 5 --quiet --threads 1"
if ! probe=$("$BIN" train $MODEL $LLAMA --steps 1 --device cuda 2>&1); then
  if grep -q "no usable GPU" <<<"$probe"; then echo "SKIP: $probe"; exit 77; fi
  echo "FAIL: the probe run:"; echo "$probe"; exit 1
fi
COMM=$(gpu_comm 2)
train() {  # train LOG [flags]: 2 ranks, 4 steps
  local log=$1; shift
  timeout 600 mpirun -np 2 --oversubscribe "$BIN" train $MODEL --steps 4 --log "$log" "$@" >"$log.out" 2>&1 ||
    fail "train $* (log $log.out): $(cat "$log.out")"
}
compare() {  # compare CUDA.jsonl CPU.jsonl TOL WHAT
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
a = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[1]))}
b = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[2]))}
tol, what = float(sys.argv[3]), sys.argv[4]
assert sorted(a) == sorted(b) and len(a) == 4, (what, sorted(a), sorted(b))
worst = max(abs(a[s] - b[s]) for s in a)
assert worst <= tol, "%s: max |loss - cpu| %.3g > %.3g: %s vs %s" % (what, worst, tol, a, b)
assert a[4] < a[1], "%s: the loss did not fall: %s" % (what, a)
print("llama %-40s max |loss - cpu| = %.2e over 4 steps (%.4f -> %.4f)" % (what, worst, a[1], a[4]))
PY
}
for stage in 0 3; do
  train "$T/cpu_$stage.jsonl" $LLAMA --zero-stage $stage --device cpu
  train "$T/cuda_$stage.jsonl" $LLAMA --zero-stage $stage --device cuda --comm "$COMM"
  compare "$T/cuda_$stage.jsonl" "$T/cpu_$stage.jsonl" 1e-4 "fp32 stage $stage --comm $COMM"
done
train "$T/cuda_3b.jsonl" $LLAMA --zero-stage 3 --device cuda --comm "$COMM"
cmp -s <(grep -o '"loss":[^,]*' "$T/cuda_3.jsonl") <(grep -o '"loss":[^,]*' "$T/cuda_3b.jsonl") ||
  fail "two CUDA llama runs differ: $(grep -o '"loss":[^,]*' "$T/cuda_3.jsonl" "$T/cuda_3b.jsonl")"
train "$T/cpu_bf16.jsonl" $LLAMA --zero-stage 1 --dtype bf16 --device cpu
train "$T/cuda_bf16.jsonl" $LLAMA --zero-stage 1 --dtype bf16 --device cuda --comm "$COMM"
compare "$T/cuda_bf16.jsonl" "$T/cpu_bf16.jsonl" 2e-2 "bf16 stage 1 --comm $COMM"
MQA="--arch llama --n-layer 2 --n-head 4 --n-kv-head 1 --n-embd 40 --ffn-hidden 24 --tie-embeddings"
train "$T/cpu_mqa.jsonl" $MQA --zero-stage 2 --device cpu
train "$T/cuda_mqa.jsonl" $MQA --zero-stage 2 --device cuda --comm "$COMM"
compare "$T/cuda_mqa.jsonl" "$T/cpu_mqa.jsonl" 1e-4 "multi-query tied hs 10, stage 2"
echo "llama on cuda ok"
