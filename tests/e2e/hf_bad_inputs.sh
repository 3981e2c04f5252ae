#!/usr/bin/env bash
# Hugging Face, bad inputs: safetensors headers that lie (length past the file, a span that does not
# match its shape, offsets past the data, overlapping tensors), an HF config whose shapes do
# not match its tensors, a tokenizer.json of an unsupported model type, text that is not
# UTF-8: each gives one error line naming the file and what was expected, a non-zero exit, and
# nothing written. (A vocabulary above 65,536 ids gives uint32 shards instead.)
set -euo pipefail
BIN=$1 SRC=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
rc=0; PY=$("$SRC/scripts/hf-venv.sh") || rc=$?
if [ $rc = 77 ]; then echo "SKIP hf_bad_inputs: PyPI unreachable, the transformers reference cannot be installed"; exit 77; fi
[ $rc = 0 ] || { echo "hf_bad_inputs: FAILED to install the Hugging Face reference stack (scripts/hf-venv.sh rc $rc)"; exit 1; }
REF=$SRC/tests/e2e/hf_ref.py

"$PY" "$REF" hf-random "$T/good" 3
bible -f Gen1:1-Gen3:24 > "$T/text.txt"
"$PY" "$REF" tok-train "$T/text.txt" "$T/tok.json" 400
"$BIN" prepare --input "$T/text.txt" --output "$T/data" --val-fraction 0 >/dev/null
# the bad variants, each a directory (config.json + model.safetensors) or a tokenizer.json
"$PY" - "$T" <<'PY'
import json, os, shutil, struct, sys
T = sys.argv[1]
def load(d):
    b = open(d + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]
def save(name, header, data, length=None, config=None):
    d = os.path.join(T, name)
    os.makedirs(d)
    h = json.dumps(header).encode()
    open(d + "/model.safetensors", "wb").write(struct.pack("<Q", len(h) if length is None else length) + h + data)
    cfg = json.load(open(T + "/good/config.json"))
    cfg.update(config or {})
    json.dump(cfg, open(d + "/config.json", "w"))
h, data = load(T + "/good")
names = sorted(k for k in h if k != "__metadata__")
save("len_lies", h, data, length=len(data) * 4)
x = json.loads(json.dumps(h)); e = x[names[0]]; e["data_offsets"][1] += 4       # span != shape x dtype
save("span_lies", x, data)
x = json.loads(json.dumps(h)); e = x[names[-1]]; e["data_offsets"] = [len(data) - 4, len(data) + 400]
save("past_end", x, data)
x = json.loads(json.dumps(h))                      # two tensors on the same bytes
a, b = x[names[0]], x[names[1]]
if (a["data_offsets"][1] - a["data_offsets"][0]) == (b["data_offsets"][1] - b["data_offsets"][0]):
    b["data_offsets"] = list(a["data_offsets"])
else:  # move b onto a's start, its size kept
    size = b["data_offsets"][1] - b["data_offsets"][0]
    b["data_offsets"] = [a["data_offsets"][0], a["data_offsets"][0] + size]
save("overlap", x, data)
save("config_mismatch", h, data, config={"n_embd": 32})
tok = json.load(open(T + "/tok.json"))
t = json.loads(json.dumps(tok)); t["model"]["type"] = "WordPiece"
json.dump(t, open(T + "/wordpiece.json", "w"))
t = json.loads(json.dumps(tok))  # 70,000 ids: more than uint16 shards can hold
n0 = len(t["model"]["vocab"])
for i in range(n0, 70000):
    t["model"]["vocab"]["<unused%d>" % i] = i
json.dump(t, open(T + "/big_vocab.json", "w"))
# 10 x 9 bytes, "caf", then a Latin-1 byte at offset 93
open(T + "/latin1.txt", "wb").write("caf\u00e9 ok\n".encode("utf-8") * 10 + "caf\u00e9".encode("latin-1"))
PY

n=0
expect_error() {  # expect_error WHAT GREP -- command...: one stderr line containing GREP, rc != 0
  local what=$1 pat=$2; shift 3
  local err rc=0
  err=$("$@" 2>&1 >/dev/null) || rc=$?
  [ $rc -ne 0 ] || { echo "$what: exit 0, expected an error"; exit 1; }
  [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] || { echo "$what: expected one error line, got:"; echo "$err"; exit 1; }
  grep -qF "$pat" <<<"$err" || { echo "$what: error does not say '$pat': $err"; exit 1; }
  echo "$what: $err"
  n=$((n + 1))
}
nothing_written() { [ ! -e "$1" ] || { echo "$1 was written by a failing command"; ls -la "$1"; exit 1; }; }

for c in len_lies span_lies past_end overlap config_mismatch; do
  case $c in
    len_lies) pat="header length";; span_lies) pat="needs";; past_end) pat="outside the data section";;
    overlap) pat="overlaps";; config_mismatch) pat="has shape";;
  esac
  expect_error "export $c" "$pat" -- "$BIN" export "$T/$c" --hf "$T/out_$c"
  nothing_written "$T/out_$c"
  expect_error "train --init $c" "$pat" -- "$BIN" train --init "$T/$c" --data "$T/data/train.bin" --seq-len 16 \
    --micro-batch 1 --steps 1 --threads 1 --save-model "$T/m_$c.bin" --quiet
  nothing_written "$T/m_$c.bin"
  expect_error "eval $c" "$pat" -- "$BIN" eval "$T/$c" --data "$T/data/train.bin" --seq-len 16 --threads 1
done
expect_error "prepare wordpiece" 'unsupported model type "WordPiece"' -- \
  "$BIN" prepare --tokenizer "$T/wordpiece.json" --input "$T/text.txt" --output "$T/p1"
nothing_written "$T/p1"
# a vocabulary above 65,536 ids is not an error: it gives uint32 shards (llm.c's Llama 3 format)
"$BIN" prepare --tokenizer "$T/big_vocab.json" --input "$T/text.txt" --output "$T/p2" >/dev/null 2>&1 \
  || { echo "prepare big vocab: failed"; exit 1; }
[ "$(od -An -tu4 -N8 "$T/p2/train.bin" | tr -s ' ')" = " 20240801 7" ] \
  || { echo "prepare big vocab: train.bin is not a uint32 shard (magic 20240801, version 7)"; exit 1; }
expect_error "prepare latin1" "invalid UTF-8 at byte 93" -- \
  "$BIN" prepare --tokenizer "$T/tok.json" --input "$T/latin1.txt" --output "$T/p3"
nothing_written "$T/p3"
expect_error "export without outputs" "give at least one of" -- "$BIN" export "$T/good"
echo "hf_bad_inputs ok: $n bad inputs refused with one line each"
