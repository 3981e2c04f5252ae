#!/usr/bin/env bash
# --arch llama through the executable, the invariants GPT-2 holds:
#  - 1 rank = 2 and 3 ranks at ZeRO 0-3, flat and per-parameter layouts, HSDP (4 ranks, groups
#    of 2), with accumulation (losses within 1e-5; the same global batch of 12 sequences);
#    Muon on 1 and 2 ranks likewise; --recompute gelu and block bitwise the plain run;
#  - resume at the same ranks and stage bitwise (every loss after the checkpoint), on other rank
#    counts and stages within 1e-5, and an async checkpoint;
#  - refusals: llama options on gpt2, a kv head count that does not divide the heads, --gelu
#    fused, --save-model, --arch llama with --init of a gpt2 model, a llama checkpoint resumed
#    as gpt2 (naming arch); plan's sizes.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"  # BIN, T, fail, mpirun as root
e2e_text 300 "In the beginning God created the heaven and the earth. And the earth was without form, and void."
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null
LLAMA="--arch llama --n-layer 2 --n-head 8 --n-kv-head 2 --n-embd 64 --ffn-hidden 96 --rope-theta 500000"
COMMON="--data $T/data/train.bin --seq-len 31 --steps 6 --lr 3e-3 --seed 5 --quiet --threads 1 $LLAMA"
train() {  # train NP B ACCUM LOG [flags]: global batch NP x B x ACCUM
  local np=$1 b=$2 a=$3 log=$4; shift 4
  mpirun -np "$np" --oversubscribe "$BIN" train $COMMON --micro-batch "$b" --grad-accum "$a" --log "$log" "$@" \
    >/dev/null || fail "train -np $np $*"
}
train 1 6 2 "$T/ref.jsonl"
train 1 12 1 "$T/ref_b12.jsonl"
train 2 3 2 "$T/s0.jsonl" --zero-stage 0
train 2 6 1 "$T/s1.jsonl" --zero-stage 1
train 3 2 2 "$T/s2.jsonl" --zero-stage 2
train 3 4 1 "$T/s3.jsonl" --zero-stage 3
train 2 3 2 "$T/pp.jsonl" --zero-stage 3 --shard-layout per-param
train 4 3 1 "$T/hsdp.jsonl" --zero-stage 3 --shard-group-size 2
train 1 6 2 "$T/rg.jsonl" --recompute gelu
train 1 6 2 "$T/rb.jsonl" --recompute block
train 1 6 2 "$T/mu1.jsonl" --optimizer muon
train 2 3 2 "$T/mu2.jsonl" --optimizer muon --zero-stage 1
# resume: same ranks and stage, bitwise; then 3 ranks at stage 1 from a 2-rank stage-3 checkpoint
train 2 6 1 "$T/full.jsonl" --zero-stage 3
train 2 6 1 "$T/r1.jsonl" --zero-stage 3 --ckpt-dir "$T/ck" --stop-at-step 3
train 2 6 1 "$T/r2.jsonl" --zero-stage 3 --ckpt-dir "$T/ck" --resume latest
train 3 4 1 "$T/r3.jsonl" --zero-stage 1 --ckpt-dir "$T/ck3" --resume "$T/ck/step_00000003"
train 2 6 1 "$T/as.jsonl" --zero-stage 2 --ckpt-dir "$T/cka" --ckpt-every 2 --async-ckpt
"$BIN" ckpt verify "$T/cka" >/dev/null || fail "ckpt verify of the async llama checkpoint"
/usr/bin/python3 - "$T" <<'PY'
import json, sys
d = sys.argv[1]
L = lambda n: [json.loads(l)["loss"] for l in open("%s/%s.jsonl" % (d, n))]
ref = L("ref")
assert len(ref) == 6 and ref[-1] < ref[0] - 0.5, ref
def close(name, want=ref, tol=1e-5):
    got = L(name)
    assert len(got) == len(want), (name, got)
    for a, b in zip(got, want):
        assert abs(a - b) <= tol * abs(b), (name, got, want)
for n in ["ref_b12", "s0", "s1", "s2", "s3", "pp", "hsdp"]:
    close(n)
assert L("rg") == ref and L("rb") == ref, "recompute must be bitwise"
close("mu2", L("mu1"))
assert L("mu1") != ref, "muon ran"
full = L("full")
assert L("r1") + L("r2") == full, ("resume must be bitwise", L("r1"), L("r2"), full)
close("r3", full[3:])
close("as", full)
print("llama ok: loss %.4f -> %.4f; ranks, stages, layouts, HSDP, Muon, recompute, resume" % (ref[0], ref[-1]))
PY
refused() {  # refused NEEDLE ARGS...: non-zero exit, one line naming NEEDLE
  local needle=$1; shift
  out=$("$BIN" "$@" 2>&1) && fail "accepted: $*"
  grep -q -- "$needle" <<<"$out" || fail "expected '$needle' for $*: $out"
}
D="--data $T/data/train.bin --seq-len 31 --steps 2 --quiet"
refused "--n-kv-head is a llama option" train $D --n-kv-head 2
refused "--tie-embeddings is a llama option" train $D --tie-embeddings
refused "must divide --n-head 8" train $D --arch llama --n-head 8 --n-embd 64 --n-kv-head 3
refused "--gelu fused is a gpt2 option" train $D $LLAMA --gelu fused
refused "llm.c model format holds GPT-2 models only" train $D $LLAMA --save-model "$T/m.bin"
refused "another model (arch: llama vs gpt2" train $D --n-head 8 --n-embd 64 --ckpt-dir "$T/ck" --resume latest --steps 8
[ ! -e "$T/m.bin" ] || fail "a refused run wrote --save-model"
"$BIN" train $D --n-layer 2 --n-head 8 --n-embd 64 --save-model "$T/m.bin" >/dev/null || fail "gpt2 model for --init"
refused "--arch llama" train $D --arch llama --n-layer 2 --n-head 8 --n-embd 64 --init "$T/m.bin"
out=$("$BIN" plan $LLAMA --seq-len 256 --micro-batch 4 --ranks 2 --zero-stage 3 2>&1) || fail "plan: $out"
grep -q "llama KV2 F96" <<<"$out" || fail "plan does not show the llama config: $out"
echo "refusals ok"
