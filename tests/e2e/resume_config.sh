#!/usr/bin/env bash
# A resume that changes what the data order depends on says so in one line per change
# (app/train.cc ResumeChanges): a warning where the order continues (another global batch; the
# seed of an unshuffled run; the same files at other paths), an error where the saved position
# no longer names the same place (sequence length, shuffle setting, the seed of a shuffled run,
# other data), refused before anything is written, and accepted by --allow-config-change.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"  # BIN, T, fail, mpirun as root
e2e_text 200 "In the beginning God created the heaven and the earth. And the earth was without form, and void."
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null
head -c 10000 "$T/text.txt" > "$T/short.txt"
"$BIN" prepare --input "$T/short.txt" --output "$T/data2" >/dev/null
mkdir "$T/moved" && cp "$T/data/train.bin" "$T/moved/train.bin"
COMMON="--seq-len 16 --micro-batch 2 --lr 3e-3 --quiet --n-layer 1 --n-embd 32 --n-head 2"
train() { mpirun -np 2 --oversubscribe "$BIN" train $COMMON "$@"; }
train --data "$T/data/train.bin" --seed 5 --steps 4 --ckpt-dir "$T/shuf" --stop-at-step 2 >/dev/null
train --data "$T/data/train.bin" --seed 5 --steps 4 --ckpt-dir "$T/file" --stop-at-step 2 --no-shuffle >/dev/null
BASE_SHUF="--data $T/data/train.bin --seed 5 --steps 4 --ckpt-dir $T/shuf --resume latest"
BASE_FILE="--data $T/data/train.bin --seed 5 --steps 4 --ckpt-dir $T/file --resume latest --no-shuffle"

expect_error() {  # NAME PATTERN DIR flags...: exit 1, the error line, nothing new in DIR
  local name=$1 pat=$2 dir=$3; shift 3
  local before; before=$(ls -a "$dir" | tr '\n' ' ')
  out=$(train "$@" 2>&1 >/dev/null) && { echo "FAIL: $name: accepted"; exit 1; }
  grep -q "^shardgpt: error: resume from .*: $pat.*(--allow-config-change accepts it)$" <<<"$out" \
    || { echo "FAIL: $name: no error line matching '$pat':"; echo "$out" | head -5; exit 1; }
  [ "$(grep -c '^shardgpt: error:' <<<"$out")" = 1 ] || { echo "FAIL: $name: not one error line: $out"; exit 1; }
  [ "$(ls -a "$dir" | tr '\n' ' ')" = "$before" ] || { echo "FAIL: $name: wrote into $dir"; exit 1; }
  echo "ok: $name refused"
}
expect_warning() {  # NAME PATTERN flags...: exit 0 with the warning line (then the new checkpoint is removed)
  local name=$1 pat=$2; shift 2
  out=$(train "$@" 2>&1 >/dev/null) || { echo "FAIL: $name: refused: $out"; exit 1; }
  grep -q "^shardgpt: warning: resume from .*: $pat" <<<"$out" || { echo "FAIL: $name: no warning '$pat': $out"; exit 1; }
  [ "$(grep -c '^shardgpt: warning:' <<<"$out")" = 1 ] || { echo "FAIL: $name: not one warning line: $out"; exit 1; }
  echo "ok: $name warned"
}
reset() { rm -rf "$1/step_00000004"; echo step_00000002 > "$1/latest"; }

expect_error "sequence length" "the sequence length changes from 16 to 8 " "$T/shuf" $BASE_SHUF --seq-len 8
expect_error "shuffle setting" "the shuffle setting changes from shuffled to --no-shuffle " "$T/shuf" $BASE_SHUF --no-shuffle
expect_error "seed (shuffled)" "the seed changes from 5 to 6 .*another permutation" "$T/shuf" $BASE_SHUF --seed 6
expect_error "data files" "the data files change from 1 file(s) of [0-9]* tokens" "$T/shuf" $BASE_SHUF --data "$T/data2/train.bin"
# several changes: one line each
out=$(train $BASE_SHUF --seq-len 8 --no-shuffle 2>&1 >/dev/null) && { echo "FAIL: two changes accepted"; exit 1; }
[ "$(grep -c '^shardgpt: error: resume from' <<<"$out")" = 2 ] || { echo "FAIL: two changes, not two lines: $out"; exit 1; }
expect_warning "global batch" "the global batch changes from 4 to 8 sequences per step" $BASE_SHUF --micro-batch 4; reset "$T/shuf"
expect_warning "moved data" "the data files have other paths" $BASE_SHUF --data "$T/moved/train.bin"; reset "$T/shuf"
expect_warning "seed (file order)" "the seed changes from 5 to 6 (data in file order" $BASE_FILE --seed 6; reset "$T/file"
expect_warning "accepted change" "the sequence length changes from 16 to 8 .*(accepted by --allow-config-change)" \
  $BASE_SHUF --seq-len 8 --allow-config-change
# the accepted run's checkpoint records what it did: resuming it with the same flags says nothing
out=$(train --data "$T/data/train.bin" --seed 5 --steps 6 --ckpt-dir "$T/shuf" --resume latest --seq-len 8 2>&1 >/dev/null)
grep -q "warning\|error" <<<"$out" && { echo "FAIL: resume with the recorded config complained: $out"; exit 1; }
# an unchanged resume says nothing either
out=$(train $BASE_FILE 2>&1 >/dev/null)
grep -q "warning\|error" <<<"$out" && { echo "FAIL: unchanged resume complained: $out"; exit 1; }
echo "resume config changes: ok"
