#!/usr/bin/env bash
# Hugging Face inputs that would give a wrong model or a crash, through every subcommand that
# reads them (eval, train --init, sample, export): a config.json field of the wrong JSON type,
# an option that changes the computation at a value shardgpt does not compute, an untied
# lm_head.weight, and a tokenizer.json field of the wrong type (prepare --tokenizer, sample
# --tokenizer). Each: one error line naming the file and the field, a non-zero exit, nothing
# written. Needs no Hugging Face library: the model is shardgpt's own `export --hf`.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
e2e_prepare 200 "In the beginning God created the heaven and the earth."
"$BIN" train --data "$T/data/train.bin" --n-layer 1 --n-embd 32 --n-head 2 --max-seq-len 16 --seq-len 16 \
  --micro-batch 1 --steps 1 --threads 1 --save-model "$T/m.bin" --quiet >/dev/null || fail "train"
"$BIN" export "$T/m.bin" --hf "$T/good" >/dev/null || fail "export --hf"
"$BIN" eval "$T/good" --data "$T/data/train.bin" --seq-len 16 --threads 1 >/dev/null || fail "eval of the good export"
/usr/bin/python3 - "$T" "$(dirname "$0")/lib" <<'PY' || fail "making the bad inputs"
import json, os, shutil, struct, sys
T = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from byte_level import byte_vocab
cases = {  # name: config.json fields to set
    "tie_yes": {"tie_word_embeddings": "yes"}, "act_null": {"activation_function": None},
    "act_int": {"activation_function": 1}, "inv_null": {"scale_attn_by_inverse_layer_idx": None},
    "eps_str": {"layer_norm_epsilon": "1e-5"}, "nlayer_float": {"n_layer": 1.0},
    "no_scale": {"scale_attn_weights": False}, "upcast": {"reorder_and_upcast_attn": True},
    "cross": {"add_cross_attention": True}, "pruned": {"pruned_heads": {"0": [1]}},
}
for name, edit in cases.items():
    d = os.path.join(T, name)
    shutil.copytree(T + "/good", d)
    cfg = json.load(open(d + "/config.json"))
    cfg.update(edit)
    json.dump(cfg, open(d + "/config.json", "w"))
# an untied head: lm_head.weight = wte with one element changed, appended to the data section
d = os.path.join(T, "untied")
shutil.copytree(T + "/good", d)
b = open(d + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h, data = json.loads(b[8:8 + n]), bytearray(b[8 + n:])
w = h["transformer.wte.weight"]
head = bytearray(data[w["data_offsets"][0]:w["data_offsets"][1]])
head[4 * 7:4 * 8] = struct.pack("<f", struct.unpack("<f", head[4 * 7:4 * 8])[0] + 1.0)
h["lm_head.weight"] = {"dtype": w["dtype"], "shape": w["shape"], "data_offsets": [len(data), len(data) + len(head)]}
hb = json.dumps(h).encode()
open(d + "/model.safetensors", "wb").write(struct.pack("<Q", len(hb)) + hb + bytes(data) + bytes(head))
# tokenizer.json: a byte-level BPE with one merge, then fields of the wrong type
vocab = byte_vocab()
vocab["th"] = 256
tok = {"added_tokens": [{"id": 257, "content": "<|endoftext|>", "special": True}], "normalizer": None,
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
       "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": vocab, "merges": ["t h"]}}
json.dump(tok, open(T + "/tok.json", "w"))
t = json.loads(json.dumps(tok)); t["added_tokens"][0]["normalized"] = "yes"; json.dump(t, open(T + "/tok_norm.json", "w"))
t = json.loads(json.dumps(tok)); t["model"]["merges"] = [["t", 1]]; json.dump(t, open(T + "/tok_merge.json", "w"))
t = json.loads(json.dumps(tok)); t["added_tokens"][0]["id"] = None; json.dump(t, open(T + "/tok_id.json", "w"))
PY

n=0
nothing_written() { [ ! -e "$1" ] || fail "$1 was written by a failing command"; }

for c in tie_yes act_null act_int inv_null eps_str nlayer_float no_scale upcast cross pruned untied; do
  case $c in
    tie_yes) pat='config.json: tie_word_embeddings is "yes"';; act_null) pat='config.json: activation_function null';;
    act_int) pat='config.json: activation_function 1';; inv_null) pat='config.json: scale_attn_by_inverse_layer_idx is null';;
    eps_str) pat='config.json: layer_norm_epsilon "1e-5"';; nlayer_float) pat='config.json: n_layer is 1.0';;
    no_scale) pat='config.json: scale_attn_weights false is not supported';;
    upcast) pat='config.json: reorder_and_upcast_attn true is not supported';;
    cross) pat='config.json: add_cross_attention true is not supported';;
    pruned) pat='config.json: pruned_heads an object of 1 is not supported';;
    untied) pat='tensor "lm_head.weight" differs from "transformer.wte.weight" at element 7';;
  esac
  expect_error "eval $c" "$pat" -- "$BIN" eval "$T/$c" --data "$T/data/train.bin" --seq-len 16 --threads 1
  expect_error "train --init $c" "$pat" -- "$BIN" train --init "$T/$c" --data "$T/data/train.bin" --seq-len 16 \
    --micro-batch 1 --steps 1 --threads 1 --save-model "$T/m_$c.bin" --quiet
  nothing_written "$T/m_$c.bin"
  expect_error "sample $c" "$pat" -- "$BIN" sample --model-file "$T/$c" --prompt x -n 1
  expect_error "export $c" "$pat" -- "$BIN" export "$T/$c" --llmc "$T/x_$c.bin"
  nothing_written "$T/x_$c.bin"
done
for c in norm merge id; do
  case $c in
    norm) pat='tok_norm.json: added_tokens[0] "<|endoftext|>" normalized is "yes" (expected true or false)';;
    merge) pat='tok_merge.json: merge 0 is an array of 2';; id) pat='tok_id.json: added_tokens[0].id is null';;
  esac
  expect_error "prepare --tokenizer tok_$c" "$pat" -- "$BIN" prepare --tokenizer "$T/tok_$c.json" --input "$T/text.txt" \
    --output "$T/p_$c"
  nothing_written "$T/p_$c"
  expect_error "sample --tokenizer tok_$c" "$pat" -- "$BIN" sample --model-file "$T/m.bin" --tokenizer "$T/tok_$c.json" \
    --prompt x -n 0
done
echo "hf_config_types ok: $n refusals, one line each"
