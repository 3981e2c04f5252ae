#!/usr/bin/env bash
# Hugging Face, tokenizer: a byte-level BPE tokenizer trained by `tokenizers` on one text (KJV
# Genesis), then `prepare --tokenizer` and `tokenizers` on *another* text (Unicode, emoji,
# numbers, whitespace runs, empty lines, CRLF, NBSP/NEL, <|endoftext|> inside the text): the
# same ids, with <|endoftext|> before each document; also for a 1.8 MB file cut into pieces
# encoded on 2 threads, and split into train/val. `sample --tokenizer` decodes what it
# encodes: decode(encode(x)) == x.
set -euo pipefail
BIN=$1 SRC=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rc=0; PY=$("$SRC/scripts/hf-venv.sh") || rc=$?
if [ $rc = 77 ]; then echo "SKIP hf_tokenizer: PyPI unreachable, the tokenizers reference cannot be installed"; exit 77; fi
[ $rc = 0 ] || { echo "hf_tokenizer: FAILED to install the Hugging Face reference stack (scripts/hf-venv.sh rc $rc)"; exit 1; }
REF=$SRC/tests/e2e/hf_ref.py
command -v bible >/dev/null || { echo "hf_tokenizer: needs Debian's bible-kjv (scripts/install-deps.sh)"; exit 1; }

bible -f Gen1:1-Gen50:26 > "$T/train.txt"
"$PY" "$REF" tok-train "$T/train.txt" "$T/tok.json" 1000
"$PY" "$REF" tok-text "$T/b.txt" 1
"$PY" "$REF" tok-text "$T/big.txt" 3000
"$BIN" prepare --tokenizer "$T/tok.json" --input "$T/b.txt" --output "$T/d1" --val-fraction 0 --threads 1 2>/dev/null
"$PY" "$REF" tok-compare "$T/tok.json" "$T/d1" "$T/b.txt"
out=$("$BIN" prepare --tokenizer "$T/tok.json" --input "$T/big.txt" "$T/b.txt" --output "$T/d2" --val-fraction 0.1 --threads 2 2>"$T/progress")
echo "$out"
grep -q "tokens/s" <<<"$out"
grep -q "100.0%" "$T/progress"
"$PY" "$REF" tok-compare "$T/tok.json" "$T/d2" "$T/big.txt" "$T/b.txt"

# decode(encode(x)) == x through sample: the prompt is encoded with the tokenizer and printed
# back decoded, then 0 tokens are generated (a model of the tokenizer's vocabulary is needed)
"$BIN" train --data "$T/d1/train.bin" --vocab-size 1000 --max-seq-len 32 --seq-len 16 --micro-batch 1 --steps 1 \
  --threads 1 --save-model "$T/m.bin" --quiet >/dev/null
x=$(cat "$T/b.txt")
"$BIN" sample --model-file "$T/m.bin" --tokenizer "$T/tok.json" --prompt "$x" -n 0 > "$T/round.txt"
printf '%s\n' "$x" | cmp - "$T/round.txt"
echo "decode(encode(x)) == x through sample --tokenizer"
echo "hf_tokenizer ok"
