#!/usr/bin/env bash
# --gelu fused end to end on the CPU (the twins of the CUDA backend's cuBLASLt GELU epilogues),
# 2 ranks, ZeRO stage 2, 4 steps of 2 micro-batches:
#   fp32: every step's loss bitwise the --gelu separate run's (at fp32 activations the fused
#         arithmetic is the separate kernels');
#   bf16 (--act-dtype bf16): within 2% of the separate run's, and not all equal (the GELU reads the unrounded
#         product); --recompute block reproduces the fused run bitwise;
#   every JSONL row names the mode ("gelu": "fused" / "separate").
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"  # BIN, T, fail, mpirun as root
e2e_prepare 200 "In the beginning God created the heaven and the earth. And the earth was without form."
MODEL="--data $T/data/train.bin --seq-len 32 --n-layer 2 --n-embd 64 --n-head 4 --lr 3e-3 --seed 3 --quiet --threads 1
       --micro-batch 2 --grad-accum 2 --zero-stage 2 --steps 4"
train() {  # train LOG [flags]
  local log=$1; shift
  timeout 300 mpirun -np 2 --oversubscribe "$BIN" train $MODEL --log "$log" "$@" >"$log.out" 2>&1 ||
    { cat "$log.out"; fail "train $* (log above)"; }
}
for dtype in fp32 bf16; do  # bf16 activations asked for: the default depends on the CPU's bf16 products
  train "$T/sep_$dtype.jsonl" --dtype $dtype --act-dtype $dtype
  train "$T/fused_$dtype.jsonl" --dtype $dtype --act-dtype $dtype --gelu fused
done
train "$T/fused_block.jsonl" --dtype bf16 --act-dtype bf16 --gelu fused --recompute block
python3 - "$T" <<'PY'
import json, sys
d = sys.argv[1]
def rows(name):
    return [json.loads(l) for l in open("%s/%s.jsonl" % (d, name))]
def losses(name):
    return [r["loss"] for r in rows(name)]
for name, mode in (("sep_fp32", "separate"), ("fused_fp32", "fused"), ("sep_bf16", "separate"),
                   ("fused_bf16", "fused"), ("fused_block", "fused")):
    got = {r["gelu"] for r in rows(name)}
    assert got == {mode}, (name, got)
    assert len(rows(name)) == 4, (name, len(rows(name)))
assert losses("fused_fp32") == losses("sep_fp32"), ("fp32: fused vs separate", losses("fused_fp32"), losses("sep_fp32"))
f, s = losses("fused_bf16"), losses("sep_bf16")
worst = max(abs(a - b) / b for a, b in zip(f, s))
assert worst < 0.02, ("bf16: fused vs separate", f, s)
assert f != s, ("bf16: the fused GELU should read the unrounded product", f, s)
assert losses("fused_block") == f, ("--recompute block with --gelu fused", losses("fused_block"), f)
print("gelu fused e2e: fp32 bitwise the separate run (%s); bf16 within %.2g%% of it; --recompute block bitwise; "
      "JSONL names the mode: OK" % (" ".join("%.4f" % x for x in s), 100 * worst))
PY
