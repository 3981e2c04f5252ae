#!/usr/bin/env bash
# Hugging Face, Llama 3-style tokenizer: a tokenizer.json built by `tokenizers` 0.21.4 as Llama
# 3's is (pre_tokenizer Sequence[Split with Llama 3's regex, Isolated; ByteLevel without regex],
# BPE with ignore_merges and whole words in the vocabulary that merges do not build, special
# tokens after the vocabulary, a <|begin_of_text|> template), trained on KJV Genesis; then
# `prepare --tokenizer` and `tokenizers` (add_special_tokens=False) on another text: hf_tokenizer's
# text plus code (indentation, tabs, CRLF), digit runs, mixed-case contractions, CJK, emoji,
# whitespace runs, special tokens inline, and a seeded random mix of such pieces: the same ids,
# on 1 thread and on a 0.6 MB file cut into pieces encoded on 2 threads, each document after
# the template's <|begin_of_text|> (the vocabulary has no <|endoftext|>). `sample --tokenizer`
# decodes what it encodes.
set -euo pipefail
BIN=$1 SRC=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
rc=0; PY=$("$SRC/scripts/tokenizers-venv.sh") || rc=$?
if [ $rc = 77 ]; then echo "SKIP hf_llama3_tokenizer: PyPI unreachable, the tokenizers reference cannot be installed"; exit 77; fi
[ $rc = 0 ] || { echo "hf_llama3_tokenizer: FAILED to install tokenizers (scripts/tokenizers-venv.sh rc $rc)"; exit 1; }
REF=$SRC/tests/e2e/hf_ref.py
command -v bible >/dev/null || { echo "hf_llama3_tokenizer: needs Debian's bible-kjv (scripts/install-deps.sh)"; exit 1; }

bible -f Gen1:1-Gen50:26 > "$T/train.txt"
"$PY" "$REF" tok-train-llama3 "$T/train.txt" "$T/tok.json" 1000
"$PY" "$REF" tok-text-llama3 "$T/b.txt" 1 7
"$PY" "$REF" tok-text-llama3 "$T/big.txt" 12 8
"$BIN" prepare --tokenizer "$T/tok.json" --input "$T/b.txt" --output "$T/d1" --val-fraction 0 --threads 1 2>/dev/null
"$PY" "$REF" tok-compare "$T/tok.json" "$T/d1" "$T/b.txt"
# no <|endoftext|> in this vocabulary: each document starts with the template's <|begin_of_text|>
"$PY" - "$T/tok.json" "$T/d1/train.bin" <<'PY'
import sys
import numpy as np
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
assert tok.token_to_id("<|endoftext|>") is None
ids = np.fromfile(sys.argv[2], dtype=np.uint16, offset=1024)
assert ids[0] == tok.token_to_id("<|begin_of_text|>"), ids[:4]
print("prepare starts the document with <|begin_of_text|> (%d)" % ids[0])
PY
"$BIN" prepare --tokenizer "$T/tok.json" --input "$T/big.txt" "$T/b.txt" --output "$T/d2" --val-fraction 0.1 --threads 2 \
  2>/dev/null
"$PY" "$REF" tok-compare "$T/tok.json" "$T/d2" "$T/big.txt" "$T/b.txt"

# decode(encode(x)) == x through sample (a model of the tokenizer's vocabulary, 0 tokens generated)
V=$("$PY" -c 'import sys; from tokenizers import Tokenizer; print(Tokenizer.from_file(sys.argv[1]).get_vocab_size())' "$T/tok.json")
"$BIN" train --data "$T/d1/train.bin" --vocab-size "$V" --max-seq-len 32 --seq-len 16 --micro-batch 1 --steps 1 \
  --threads 1 --save-model "$T/m.bin" --quiet >/dev/null
x=$("$PY" -c 'import sys; print(open(sys.argv[1], encoding="utf-8", newline="").read()[:3000], end="")' "$T/b.txt")
"$BIN" sample --model-file "$T/m.bin" --tokenizer "$T/tok.json" --prompt "$x" -n 0 > "$T/round.txt"
printf '%s\n' "$x" | cmp - "$T/round.txt"
echo "decode(encode(x)) == x through sample --tokenizer"
echo "hf_llama3_tokenizer ok"
