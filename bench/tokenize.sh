#!/usr/bin/env bash
# Tokenization speed per core: shardgpt's `prepare --tokenizer` (one thread, and all threads)
# beside Hugging Face `tokenizers`' encoder called from Python, in one run on the same text
# and the same tokenizer.json, the ids checked equal. Prints MB/s of each and the ratio.
# tokenizers gets the text in pieces of about 64 KB cut where the ids cannot change (after a
# '\n' between ASCII non-space bytes, the rule of shardgpt's own cuts), through encode_batch
# with RAYON_NUM_THREADS=1 (one core): one encode() of the whole 20 MB string is far slower
# in tokenizers 0.15 and would not be a fair reference.
#
#   bench/tokenize.sh BUILD/shardgpt [SOURCE_DIR]
# Then one long word: WORD_KB (192) KB of the KJV's letters with everything else removed, a
# single pre-token that BPE merges whole (the case that made a quadratic merge loop look hung):
# the seconds of `prepare --threads 1` and of `tokenizers`' encode() on it, the ids checked equal.
# Knobs (environment): VOCAB (50257: a GPT-2-sized vocabulary trained by `tokenizers` on the
# KJV Bible, Debian's bible-kjv; GPT-2's own file cannot be downloaded here), COPIES (4: the
# text is the KJV plus the Unicode test text, repeated), ROUNDS (3: best of), WORD_KB (192),
# TOKENIZERS_PY (a python with tokenizers and numpy; default: scripts/hf-venv.sh's).
set -euo pipefail
BIN=$(realpath "$1"); SRC=$(realpath "${2:-$(dirname "$0")/..}")
VOCAB=${VOCAB:-50257} COPIES=${COPIES:-4} ROUNDS=${ROUNDS:-3} WORD_KB=${WORD_KB:-192}
"$SRC/bench/machine.sh"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
PY=${TOKENIZERS_PY:-$("$SRC/scripts/hf-venv.sh")}
REF=$SRC/tests/e2e/hf_ref.py
bible -f Gen1:1-Rev22:21 > "$T/kjv.txt"
"$PY" "$REF" tok-train "$T/kjv.txt" "$T/tok.json" "$VOCAB"
"$PY" "$REF" tok-text "$T/uni.txt" 2000
for i in $(seq 1 "$COPIES"); do cat "$T/kjv.txt" "$T/uni.txt"; done > "$T/text.txt"
MB=$(stat -c %s "$T/text.txt")
best() { sort -g | head -1; }
ours1=$(for r in $(seq 1 "$ROUNDS"); do
  "$BIN" prepare --tokenizer "$T/tok.json" --input "$T/text.txt" --output "$T/d1" --val-fraction 0 --threads 1 2>/dev/null |
    sed -E 's/.* in ([0-9.]+) s:.*/\1/'; done | best)
oursN=$(for r in $(seq 1 "$ROUNDS"); do
  "$BIN" prepare --tokenizer "$T/tok.json" --input "$T/text.txt" --output "$T/dN" --val-fraction 0 --threads "$(nproc)" 2>/dev/null |
    sed -E 's/.* in ([0-9.]+) s:.*/\1/'; done | best)
cmp "$T/d1/train.bin" "$T/dN/train.bin"
RAYON_NUM_THREADS=1 "$PY" - "$T/tok.json" "$T/text.txt" "$T/d1/train.bin" "$ROUNDS" "$MB" "$ours1" "$oursN" "$(nproc)" "$VOCAB" <<'PY'
import sys, time, numpy as np
from tokenizers import Tokenizer
tokjson, textf, ours_bin, rounds, nbytes, ours1, oursN, cores, vocab = sys.argv[1:]
tok = Tokenizer.from_file(tokjson)
text = open(textf, encoding="utf-8", newline="").read()
import re
cuts = [0]
for m in re.finditer(r"(?<=[!-~]\n)(?=[!-~])", text):
    if m.start() - cuts[-1] >= 65536:
        cuts.append(m.start())
cuts.append(len(text))
pieces = [text[a:b] for a, b in zip(cuts, cuts[1:])]
best, ids = 1e9, None
for _ in range(int(rounds)):
    t0 = time.perf_counter()
    enc = tok.encode_batch(pieces)
    best = min(best, time.perf_counter() - t0)
ids = [i for e in enc for i in e.ids]
h = np.fromfile(ours_bin, dtype=np.int32, count=256)
got = np.fromfile(ours_bin, dtype=np.uint16, offset=1024)[: h[2]].tolist()
eot = tok.token_to_id("<|endoftext|>")
assert got == [eot] + ids, "ids differ"
mb = int(nbytes) / 1e6
o1, oN = mb / float(ours1), mb / float(oursN)
hf = mb / best
print("text %.1f MB, vocab %d (asked %s), %d tokens, ids identical" % (mb, tok.get_vocab_size(), vocab, len(ids)))
print("tokenizers %s (Python, encode_batch of %d pieces, RAYON_NUM_THREADS=1): %.2f MB/s" % (__import__("tokenizers").__version__, len(pieces), hf))
print("shardgpt prepare --threads 1:                  %.2f MB/s  (%.2fx tokenizers)" % (o1, o1 / hf))
print("shardgpt prepare --threads %s (this machine):   %.2f MB/s  (%.2fx tokenizers)" % (cores, oN, oN / hf))
PY

# one long word
{ tr -cd 'A-Za-z' < "$T/kjv.txt" || true; } | head -c $((WORD_KB * 1024)) > "$T/word.txt"  # tr ends by SIGPIPE
word_s=$(for r in $(seq 1 "$ROUNDS"); do
  "$BIN" prepare --tokenizer "$T/tok.json" --input "$T/word.txt" --output "$T/dw" --val-fraction 0 --threads 1 2>/dev/null |
    sed -E 's/.* in ([0-9.]+) s:.*/\1/'; done | best)
RAYON_NUM_THREADS=1 "$PY" - "$T/tok.json" "$T/word.txt" "$T/dw/train.bin" "$ROUNDS" "$word_s" <<'PY'
import sys, time, numpy as np
from tokenizers import Tokenizer
tokjson, wordf, ours_bin, rounds, ours = sys.argv[1:]
tok = Tokenizer.from_file(tokjson)
word = open(wordf, encoding="utf-8").read()
best = 1e9
for _ in range(int(rounds)):
    t0 = time.perf_counter()
    ids = tok.encode(word).ids
    best = min(best, time.perf_counter() - t0)
h = np.fromfile(ours_bin, dtype=np.int32, count=256)
got = np.fromfile(ours_bin, dtype=np.uint16, offset=1024)[: h[2]].tolist()
assert got == [tok.token_to_id("<|endoftext|>")] + ids, "ids differ on the long word"
print("one word of %d KB (%d tokens), ids identical: tokenizers encode() %.3f s, shardgpt prepare --threads 1 %.3f s"
      % (len(word) // 1024, len(ids), best, float(ours)))
PY
