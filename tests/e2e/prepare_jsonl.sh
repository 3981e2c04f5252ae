#!/usr/bin/env bash
# prepare --input with JSON Lines and gzip: a .jsonl, .jsonl.gz and .json.gz file give the same
# shards, byte for byte, as the text files of their records (one document each); --text-field
# picks the field; a gzip'd text file reads as the text. Malformed input (bad JSON at line 3, a
# missing field, a number for the text, gzip cut short) is one error line naming file:line, a
# non-zero exit, and nothing written.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"

python3 - "$T" <<'PY'
import gzip, json, sys
T = sys.argv[1]
docs = ["In the beginning God created the heaven and the earth.\n", "And the earth was without form, \"and void\".\n",
        "caf\u00e9 \u2014 line one\nline two", "x"]
for i, d in enumerate(docs):
    open("%s/doc%d.txt" % (T, i), "w", encoding="utf-8").write(d)
lines = "".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs))
open(T + "/docs.jsonl", "w", encoding="utf-8").write(lines)
gzip.open(T + "/docs.jsonl.gz", "wt", encoding="utf-8").write(lines)
gzip.open(T + "/docs.json.gz", "wt", encoding="utf-8").write(lines.replace('"text"', '"body"'))
gzip.open(T + "/doc0.txt.gz", "wt", encoding="utf-8").write(docs[0])
ok = json.dumps({"text": "fine"}) + "\n"
open(T + "/bad_json.jsonl", "w").write(ok + ok + '{"text": "no end}\n' + ok)
open(T + "/missing.jsonl", "w").write(ok + '{"txt": "typo"}\n')
open(T + "/number.jsonl", "w").write(ok + ok + ok + '{"text": 42}\n')
big = "".join(json.dumps({"text": "record %d %s" % (i, "y" * (i % 40))}) + "\n" for i in range(3000))
data = gzip.compress(big.encode())
open(T + "/cut.jsonl.gz", "wb").write(data[: len(data) // 2])
PY

"$BIN" prepare --input "$T"/doc0.txt "$T"/doc1.txt "$T"/doc2.txt "$T"/doc3.txt --output "$T/text" --val-fraction 0.2 \
  >/dev/null || fail "prepare of the text files"
for f in docs.jsonl docs.jsonl.gz; do
  "$BIN" prepare --input "$T/$f" --output "$T/$f.out" --val-fraction 0.2 >/dev/null || fail "prepare $f"
  cmp "$T/text/train.bin" "$T/$f.out/train.bin" && cmp "$T/text/val.bin" "$T/$f.out/val.bin" \
    || fail "$f: shards differ from those of the text files"
done
"$BIN" prepare --input "$T/docs.json.gz" --text-field body --output "$T/body" --val-fraction 0.2 >/dev/null \
  || fail "prepare --text-field body"
cmp "$T/text/train.bin" "$T/body/train.bin" || fail "--text-field body: shards differ"
"$BIN" prepare --input "$T/doc0.txt" --output "$T/t0" >/dev/null || fail "prepare doc0.txt"
"$BIN" prepare --input "$T/doc0.txt.gz" --output "$T/g0" >/dev/null || fail "prepare doc0.txt.gz"
cmp "$T/t0/train.bin" "$T/g0/train.bin" || fail "doc0.txt.gz: shards differ from doc0.txt's"
echo "jsonl, jsonl.gz, json.gz (--text-field) and txt.gz give the text files' shards"

n=0
nothing_written() { [ ! -e "$1" ] || { ls -la "$1"; fail "$1 was written by a failing prepare"; }; }
expect_error "bad json" "$T/bad_json.jsonl:3: not valid JSON" -- \
  "$BIN" prepare --input "$T/doc0.txt" "$T/bad_json.jsonl" --output "$T/e1"
nothing_written "$T/e1"
expect_error "missing field" "$T/missing.jsonl:2: no field \"text\"" -- \
  "$BIN" prepare --input "$T/missing.jsonl" --output "$T/e2"
nothing_written "$T/e2"
expect_error "number" "$T/number.jsonl:4: field \"text\" is a number (expected a string)" -- \
  "$BIN" prepare --input "$T/number.jsonl" --output "$T/e3"
nothing_written "$T/e3"
expect_error "truncated gzip" "gzip data ends early" -- \
  "$BIN" prepare --input "$T/cut.jsonl.gz" --output "$T/e4"
nothing_written "$T/e4"
grep -q "$T/cut.jsonl.gz:[0-9]*: gzip data ends early" <<<"$("$BIN" prepare --input "$T/cut.jsonl.gz" --output "$T/e4" 2>&1)" \
  || fail "truncated gzip: the error does not name file:line"
echo "prepare_jsonl ok: $n malformed inputs refused with one line each"
