#!/usr/bin/env bash
# Hugging Face, --arch llama in and out. Out: a tiny llama (L2 H8 KV2 C64, vocab 300 padded to
# 384), untied and tied, trained a few steps with --ckpt-dir, is exported with `export --hf`;
# transformers' LlamaForCausalLM.from_pretrained loads it with no missing/unexpected/mismatched
# weights (no lm_head.weight stored when tied) and its loss / first-batch logits equal `shardgpt
# eval`'s (from the HF directory and from the checkpoint) within 1e-5 / 1e-4; a bf16 export
# above SHARDGPT_HF_MAX_SHARD_BYTES is sharded with an index and loads too. In: a random
# transformers LlamaForCausalLM (GQA, rope_theta 500000, every weight off its init), saved whole
# and sharded (max_shard_size 100KB), is read by eval (the same logits) and `train --init` on 1
# rank and on 2 at ZeRO-3 (step 1's loss equals PyTorch's); --arch, --tie-embeddings,
# --rope-theta and --n-kv-head flags that disagree with it are refused naming both. Refusals,
# one line each naming config.json and the field: rope_scaling, sliding_window, attention_bias,
# hidden_act gelu, model_type mistral, head_dim, fields of the wrong JSON type; a shard tensor
# missing from the index is named.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
SRC=$2
rc=0; PY=$("$SRC/scripts/hf-venv.sh") || rc=$?
if [ $rc = 77 ]; then echo "SKIP hf_llama: PyPI unreachable, the transformers reference cannot be installed"; exit 77; fi
[ $rc = 0 ] || { echo "hf_llama: FAILED to install the Hugging Face reference stack (scripts/hf-venv.sh rc $rc)"; exit 1; }
REF=$SRC/tests/e2e/hf_ref.py

for i in $(seq 1 200); do echo "In the beginning God created the heaven and the earth. And the earth was without form, and void."; done > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" --val-fraction 0.2 >/dev/null
ev() { "$BIN" eval "$@" --data "$T/data/val.bin" --seq-len 32 --micro-batch 4 --threads 1; }
LLAMA=(--arch llama --n-layer 2 --n-head 8 --n-kv-head 2 --n-embd 64 --vocab-size 300 --max-seq-len 64)

# Out: untied, then tied
for tie in untied tied; do
  flag=(); [ $tie = tied ] && flag=(--tie-embeddings)
  "$BIN" train "${LLAMA[@]}" "${flag[@]}" --data "$T/data/train.bin" --seq-len 32 --micro-batch 4 --steps 4 --lr 3e-3 \
    --ckpt-dir "$T/ck_$tie" --threads 1 --quiet >/dev/null
  "$BIN" export "$T/ck_$tie" --hf "$T/hf_$tie" >/dev/null
  e1=$(ev "$T/hf_$tie" --logits-out "$T/logits_$tie.bin")
  e2=$(ev "$T/ck_$tie")
  [ $tie = untied ] && e_untied=$e1
  "$PY" "$REF" hf-check "$T/hf_$tie" "$T/data/val.bin" 32 4 0 "$e1" "$T/logits_$tie.bin"
  "$PY" - "$T/hf_$tie" $tie "$e1" "$e2" <<'PY'
import json, struct, sys
d, tie = sys.argv[1], sys.argv[2] == "tied"
cfg = json.load(open(d + "/config.json"))
assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama", cfg
assert (cfg["num_key_value_heads"], cfg["vocab_size"], cfg["tie_word_embeddings"]) == (2, 300, tie), cfg
with open(d + "/model.safetensors", "rb") as f:
    h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
assert ("lm_head.weight" in h) != tie, sorted(h)
assert h["model.embed_tokens.weight"]["shape"] == [300, 64], h["model.embed_tokens.weight"]
a, b = json.loads(sys.argv[3]), json.loads(sys.argv[4])
assert abs(a["loss"] - b["loss"]) <= 1e-6 and a["tokens"] == b["tokens"], (a, b)
print("%s export: config and tensor table as transformers writes them; eval of the checkpoint agrees" % sys.argv[2])
PY
done

# Out, sharded: bf16 above a 40 KB shard limit -> model-0000i-of-0000n.safetensors + the index
SHARDGPT_HF_MAX_SHARD_BYTES=40000 "$BIN" export "$T/ck_untied" --hf "$T/hf_sharded" --export-dtype bf16 >/dev/null
[ ! -e "$T/hf_sharded/model.safetensors" ] || fail "a sharded export also wrote model.safetensors"
e3=$(ev "$T/hf_sharded")
"$PY" - "$T/hf_sharded" "$e_untied" "$e3" <<'PY'
import glob, json, sys
d = sys.argv[1]
idx = json.load(open(d + "/model.safetensors.index.json"))
files = sorted(set(idx["weight_map"].values()))
assert len(files) > 2 and files == sorted(p.split("/")[-1] for p in glob.glob(d + "/model-*-of-*.safetensors")), files
from transformers import LlamaForCausalLM
m, info = LlamaForCausalLM.from_pretrained(d, output_loading_info=True)
assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
a, b = json.loads(sys.argv[2])["loss"], json.loads(sys.argv[3])["loss"]
assert abs(a - b) < 0.05, (a, b)
print("sharded bf16 export: %d files and an index; loads in transformers; loss %.5f vs fp32 %.5f" % (len(files), b, a))
PY

# In: a random transformers LlamaForCausalLM, whole and sharded
"$PY" "$REF" llama-random "$T/r" 5
"$PY" "$REF" llama-random "$T/rs" 5 100KB
[ -e "$T/rs/model.safetensors.index.json" ] || fail "max_shard_size 100KB did not shard"
r1=$(ev "$T/r" --logits-out "$T/logits_r.bin")
r2=$(ev "$T/rs" --logits-out "$T/logits_rs.bin")
"$PY" "$REF" hf-check "$T/r" "$T/data/val.bin" 32 4 0 "$r1" "$T/logits_r.bin"
"$PY" "$REF" hf-check "$T/rs" "$T/data/val.bin" 32 4 0 "$r2" "$T/logits_rs.bin"
cmp "$T/logits_r.bin" "$T/logits_rs.bin"
"$BIN" train --init "$T/rs" --data "$T/data/val.bin" --seq-len 32 --micro-batch 4 --steps 1 --no-shuffle --threads 1 \
  --log "$T/init.jsonl" --quiet >/dev/null
"$PY" "$REF" step-loss "$T/rs" "$T/data/val.bin" 32 4 "$T/init.jsonl"
mpirun -np 2 --oversubscribe "$BIN" train --init "$T/rs" --zero-stage 3 --data "$T/data/val.bin" --seq-len 32 \
  --micro-batch 4 --steps 1 --no-shuffle --threads 1 --log "$T/init2.jsonl" --quiet >/dev/null
"$PY" "$REF" step-loss "$T/rs" "$T/data/val.bin" 32 8 "$T/init2.jsonl"
"$BIN" train --init "$T/r" --arch llama --n-kv-head 2 --data "$T/data/val.bin" --seq-len 32 --micro-batch 4 --steps 2 \
  --threads 1 --quiet >/dev/null

n=0
expect_error "--arch gpt2 with --init llama" "--arch gpt2 disagrees with the imported model, whose arch is llama" -- \
  "$BIN" train --init "$T/r" --arch gpt2 --data "$T/data/val.bin" --seq-len 32 --steps 1 --threads 1 --quiet
expect_error "--tie-embeddings with --init of an untied llama" "--tie-embeddings disagrees with the imported model" -- \
  "$BIN" train --init "$T/r" --arch llama --tie-embeddings --data "$T/data/val.bin" --seq-len 32 --steps 1 --threads 1 --quiet
expect_error "--rope-theta 10000 with --init llama" "--rope-theta 10000 disagrees with the imported model, whose rope_theta is 500000" -- \
  "$BIN" train --init "$T/r" --arch llama --rope-theta 10000 --data "$T/data/val.bin" --seq-len 32 --steps 1 --threads 1 --quiet
expect_error "--n-kv-head 4 with --init llama" "--n-kv-head 4 disagrees with --init" -- \
  "$BIN" train --init "$T/r" --arch llama --n-kv-head 4 --data "$T/data/val.bin" --seq-len 32 --steps 1 --threads 1 --quiet

"$PY" - "$T" <<'PY'
import json, os, shutil, sys
T = sys.argv[1]
cases = {"rope_scaling": {"rope_scaling": {"type": "linear", "factor": 2.0}}, "sliding": {"sliding_window": 4096},
         "attn_bias": {"attention_bias": True}, "gelu": {"hidden_act": "gelu"}, "mistral": {"model_type": "mistral"},
         "kv_str": {"num_key_value_heads": "2"}, "theta_str": {"rope_theta": "500000"}, "head_dim": {"head_dim": 16}}
for name, edit in cases.items():
    d = os.path.join(T, "bad_" + name)
    shutil.copytree(T + "/r", d)
    cfg = json.load(open(d + "/config.json"))
    cfg.update(edit)
    json.dump(cfg, open(d + "/config.json", "w"))
d = os.path.join(T, "bad_missing")  # the index maps a tensor to no file's entry: drop it from the map
shutil.copytree(T + "/rs", d)
idx = json.load(open(d + "/model.safetensors.index.json"))
del idx["weight_map"]["model.layers.1.mlp.up_proj.weight"]
json.dump(idx, open(d + "/model.safetensors.index.json", "w"))
PY
for c in rope_scaling sliding attn_bias gelu mistral kv_str theta_str head_dim missing; do
  case $c in
    rope_scaling) pat='config.json: rope_scaling an object of 2 is not supported';;
    sliding) pat='config.json: sliding_window 4096 is not supported';;
    attn_bias) pat='config.json: attention_bias true is not supported';;
    gelu) pat='config.json: hidden_act "gelu" is not supported';;
    mistral) pat='config.json: model_type "mistral" is not supported';;
    kv_str) pat='config.json: num_key_value_heads is "2" (expected a positive integer)';;
    theta_str) pat='config.json: rope_theta is "500000" (expected a positive number)';;
    head_dim) pat='config.json: head_dim 16 is not supported';;
    missing) pat='tensor "model.layers.1.mlp.up_proj.weight" is not in';;
  esac
  expect_error "eval $c" "$pat" -- "$BIN" eval "$T/bad_$c" --data "$T/data/val.bin" --seq-len 32 --threads 1
  expect_error "train --init $c" "$pat" -- "$BIN" train --init "$T/bad_$c" --data "$T/data/val.bin" --seq-len 32 \
    --micro-batch 1 --steps 1 --threads 1 --quiet
done
echo "hf_llama ok: $n refusals, one line each"
