#!/usr/bin/env bash
# Hugging Face, export: a model trained a few steps by shardgpt (2 ranks, ZeRO-3, vocab 300 padded
# to 384) is exported with `export --hf` from its --ckpt-dir and from its llm.c .bin;
# transformers' GPT2LMHeadModel.from_pretrained loads it with no missing/unexpected weights,
# and its loss on a held-out token file equals `shardgpt eval`'s (on 1 and 2 ranks, from the
# HF directory, the checkpoint and the .bin) within 1e-5, its logits on the first micro-batch
# within 1e-4. A bf16 export holds BF16 tensors and evaluates close to fp32. `--init` from the
# exported directory starts where the training ended.
set -euo pipefail
BIN=$1 SRC=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rc=0; PY=$("$SRC/scripts/hf-venv.sh") || rc=$?
if [ $rc = 77 ]; then echo "SKIP hf_export: PyPI unreachable, the transformers reference cannot be installed"; exit 77; fi
[ $rc = 0 ] || { echo "hf_export: FAILED to install the Hugging Face reference stack (scripts/hf-venv.sh rc $rc)"; exit 1; }
REF=$SRC/tests/e2e/hf_ref.py

for i in $(seq 1 200); do echo "In the beginning God created the heaven and the earth. And the earth was without form, and void."; done > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" --val-fraction 0.2 >/dev/null
mpirun -np 2 --oversubscribe "$BIN" train --data "$T/data/train.bin" --vocab-size 300 --max-seq-len 64 --seq-len 32 \
  --micro-batch 4 --steps 6 --lr 3e-3 --zero-stage 3 --ckpt-dir "$T/ck" --save-model "$T/m.bin" --threads 1 --quiet >/dev/null
"$BIN" export "$T/ck" --hf "$T/hf"
"$BIN" export "$T/m.bin" --hf "$T/hf_from_bin" >/dev/null
cmp "$T/hf/model.safetensors" "$T/hf_from_bin/model.safetensors"
cmp "$T/hf/config.json" "$T/hf_from_bin/config.json"

ev() { "$BIN" eval "$@" --data "$T/data/val.bin" --seq-len 32 --micro-batch 4 --threads 1; }
e1=$(ev "$T/hf" --logits-out "$T/logits.bin")
e2=$(mpirun -np 2 --oversubscribe "$BIN" eval "$T/hf" --data "$T/data/val.bin" --seq-len 32 --micro-batch 4 --threads 1)
e3=$(ev "$T/ck"); e4=$(ev "$T/m.bin")
echo "$e1"
"$PY" "$REF" hf-check "$T/hf" "$T/data/val.bin" 32 4 0 "$e1" "$T/logits.bin"
"$PY" "$REF" hf-check "$T/hf" "$T/data/val.bin" 32 4 0 "$e2" "$T/logits.bin"
"$PY" - "$e1" "$e2" "$e3" "$e4" <<'PY'
import json, sys
r = [json.loads(a) for a in sys.argv[1:]]
assert r[1]["ranks"] == 2 and r[0]["ranks"] == 1, r
for x in r[1:]:
    assert abs(x["loss"] - r[0]["loss"]) <= 1e-6 and x["tokens"] == r[0]["tokens"], (r[0], x)
print("eval agrees on 1 and 2 ranks and from the HF directory, the checkpoint and the llm.c file")
PY
# --batches: the first K micro-batches only
e5=$(ev "$T/hf" --batches 3)
"$PY" "$REF" hf-check "$T/hf" "$T/data/val.bin" 32 4 3 "$e5" "$T/logits.bin"

# bf16 export: BF16 tensors, torch_dtype bfloat16, loss close to the fp32 one
"$BIN" export "$T/ck" --hf "$T/hf16" --export-dtype bf16 >/dev/null
e6=$(ev "$T/hf16")
"$PY" - "$T/hf16" "$e1" "$e6" <<'PY'
import json, struct, sys
d = sys.argv[1]
with open(d + "/model.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
assert n % 8 == 0, n
assert all(v["dtype"] == "BF16" for k, v in h.items() if k != "__metadata__"), h
assert json.load(open(d + "/config.json"))["torch_dtype"] == "bfloat16"
from transformers import GPT2LMHeadModel
m, info = GPT2LMHeadModel.from_pretrained(d, output_loading_info=True)
assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
a, b = json.loads(sys.argv[2])["loss"], json.loads(sys.argv[3])["loss"]
assert abs(a - b) < 0.05, (a, b)
print("bf16 export: BF16 tensors, loads in transformers; loss %.5f vs fp32 %.5f" % (b, a))
PY

# --init from the exported directory: step 1's loss is the trained model's loss on that batch
"$BIN" train --init "$T/hf" --data "$T/data/val.bin" --seq-len 32 --micro-batch 4 --steps 1 --no-shuffle \
  --threads 1 --log "$T/init.jsonl" --quiet >/dev/null
"$PY" "$REF" step-loss "$T/hf" "$T/data/val.bin" 32 4 "$T/init.jsonl"
echo "hf_export ok"
