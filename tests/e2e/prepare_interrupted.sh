#!/usr/bin/env bash
# prepare --tokenizer, interrupted: SIGTERM or SIGHUP mid-way removes train.bin.tmp (and the
# output directory it made) and the process dies by that signal; after SIGKILL the leftover
# temporary is replaced by the next prepare, which then succeeds; a second prepare into a
# directory another one is writing is refused with one line, the first one's file untouched.
# No race with the machine's speed: the signal is sent while the prepare holds after its first
# block (SHARDGPT_TEST_HOLD_IN_PREPARE), which the test waits to see.
set -uo pipefail
source "$(dirname "$0")/lib/common.sh"
# a tiny byte-level BPE tokenizer.json (GPT-2's byte symbols, two merges), Python's json only
/usr/bin/python3 - "$T/tok.json" "$(dirname "$0")/lib" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[2])
from byte_level import byte_vocab
vocab = byte_vocab()
vocab["th"] = 256; vocab["the"] = 257
json.dump({"added_tokens": [{"id": 258, "content": "<|endoftext|>", "special": True}], "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
           "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": vocab, "merges": ["t h", "th e"]}}, open(sys.argv[1], "w"))
PY
e2e_text 2000 "In the beginning God created the heaven and the earth."
held() { for _ in $(seq 1 600); do grep -q "test hook: holding prepare" "$1" 2>/dev/null && return 0; sleep 0.1; done; return 1; }
start_held() {  # start_held OUT ERRFILE: a prepare into OUT held after its first block; sets pid
  SHARDGPT_TEST_HOLD_IN_PREPARE=1 "$BIN" prepare --tokenizer "$T/tok.json" --input "$T/text.txt" --output "$1" \
    >/dev/null 2>"$2" &
  pid=$!
  held "$2" || { kill -9 $pid; fail "prepare did not reach the test hold: $(cat "$2")"; }
  [ -s "$1/train.bin.tmp" ] || { kill -9 $pid; fail "no $1/train.bin.tmp while held"; }
}
"$BIN" prepare --tokenizer "$T/tok.json" --input "$T/text.txt" --output "$T/ref" >/dev/null 2>&1 || fail "reference prepare"

for sig in TERM HUP; do
  start_held "$T/o_$sig" "$T/e_$sig"
  kill -$sig $pid; wait $pid; rc=$?
  want=$((128 + $(kill -l $sig)))
  [ $rc -eq $want ] || fail "SIG$sig: status $rc, expected $want"
  [ ! -e "$T/o_$sig" ] || fail "SIG$sig left $(ls -A "$T/o_$sig") in the output directory it made"
  echo "ok   SIG$sig mid-way: status $rc, no train.bin.tmp, no output directory left"
done

# into a directory that exists: only the temporary goes; the next prepare over it succeeds
mkdir "$T/keep"; echo x > "$T/keep/notes.txt"
start_held "$T/keep" "$T/e_keep"
kill -TERM $pid; wait $pid
[ "$(ls -A "$T/keep")" = notes.txt ] || fail "after SIGTERM the directory holds: $(ls -A "$T/keep")"
echo "ok   SIGTERM into an existing directory: only the temporary removed"

# SIGKILL cannot be caught: the temporary stays, and the next prepare replaces it
start_held "$T/k" "$T/e_k"
kill -KILL $pid; wait $pid 2>/dev/null
[ -e "$T/k/train.bin.tmp" ] || fail "expected the SIGKILLed prepare's temporary to remain"
"$BIN" prepare --tokenizer "$T/tok.json" --input "$T/text.txt" --output "$T/k" >/dev/null 2>&1 || fail "prepare after SIGKILL"
[ ! -e "$T/k/train.bin.tmp" ] || fail "train.bin.tmp still there after a successful prepare"
cmp "$T/k/train.bin" "$T/ref/train.bin" || fail "train.bin after a SIGKILLed run differs from a clean run's"
cmp "$T/k/val.bin" "$T/ref/val.bin" || fail "val.bin after a SIGKILLed run differs from a clean run's"
echo "ok   after SIGKILL: the leftover temporary replaced, the shards equal a clean run's"

# two prepares into one directory at once: the second is refused, the first goes on
start_held "$T/two" "$T/e_two"
size=$(stat -c %s "$T/two/train.bin.tmp")
err=$("$BIN" prepare --tokenizer "$T/tok.json" --input "$T/text.txt" --output "$T/two" 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] || { kill -9 $pid; fail "a second prepare into the same directory exited 0"; }
[ "$(printf '%s\n' "$err" | wc -l)" = 1 ] || { kill -9 $pid; fail "expected one error line, got: $err"; }
grep -q "another prepare is writing into this directory" <<<"$err" || { kill -9 $pid; fail "error: $err"; }
[ "$(stat -c %s "$T/two/train.bin.tmp")" = "$size" ] || { kill -9 $pid; fail "the first prepare's temporary changed"; }
kill -TERM $pid; wait $pid
echo "ok   a second prepare into the same directory: $err"
echo "prepare_interrupted ok"
