#!/usr/bin/env bash
# Arguments out of range or in conflict (--threads, sample's options) are one clear error line
# with a non-zero exit on every rank, and outputs that would overwrite an input of the same
# command (by realpath through symlinks, by device+inode for hard links, or inside the
# checkpoint read) are refused before anything is written; the input is unchanged after. The
# refusals run four at a time where none writes what another reads (tests/e2e/lib/checks.sh);
# `settle` waits for them before a check that depends on their outcome.
set -u
BIN=$1
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
printf 'In the beginning God created the heaven and the earth. %.0s' $(seq 1 400) > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null || { echo "prepare failed"; exit 1; }
M="--n-layer 1 --n-embd 32 --n-head 2 --seq-len 16 --micro-batch 2"
D="--data $T/data/train.bin --steps 2 $M"
"$BIN" train $D --ckpt-dir "$T/ck" --save-model "$T/model.bin" --quiet >/dev/null || { echo "setup train failed"; exit 1; }
CK="$T/ck/$(cat "$T/ck/latest")"
fails=0
source "$(dirname "$0")/lib/checks.sh"
# check NAME EXPECTED_SUBSTRING NP -- ARGS...: within 120 s (lib/checks.sh)
check() { local name=$1 want=$2 np=$3; shift 4; run_check "$name" "$want" "$np" 120 -- "$@"; }
# ---- --threads bounded by the cores this process may use ----
for n in 0 -1 40000 100000; do check "threads $n" "--threads" 2 -- train $D --threads "$n"; done
# ---- sample ----
S="sample --model-file $T/model.bin"
check "sample -n -1"          "tokens"        1 -- $S -n -1
check "sample -n -5"          "tokens"        1 -- $S -n -5
check "sample temperature<0"  "temperature"   1 -- $S --temperature -0.5
check "sample top-k<0"        "top-k"         1 -- $S --top-k -3
check "sample prompt+ids"     "prompt"        1 -- $S --prompt "In the" --prompt-ids 1 2 3
# ---- outputs that are inputs ----
sum_before=$(cat "$T/data/train.bin" "$T/data/val.bin" "$CK"/* | md5sum)
ln -s "$T/data/val.bin" "$T/val-link.bin"
ln "$T/data/train.bin" "$T/train-hard.bin"
ln "$CK/index.h5" "$T/index-hard.h5"
check "train --log VAL"            "is the input --val-data" 2 -- train $D --val-data "$T/data/val.bin" --log "$T/data/val.bin"
check "train --log symlink to VAL" "is the input --val-data" 2 -- train $D --val-data "$T/data/val.bin" --log "$T/val-link.bin"
check "train --save-model TRAIN"   "is the input --data"     2 -- train $D --save-model "$T/data/train.bin"
check "train --save-model hardlink" "is the input --data"    2 -- train $D --save-model "$T/train-hard.bin"
check "train --log in resumed ckpt" "inside the input --resume" 2 -- train $D --steps 4 --ckpt-dir "$T/ck" --resume latest --log "$CK/log.jsonl"
check "export --out CK/rank"       "inside the input checkpoint" 1 -- export "$CK" --out "$CK/rank_00000.h5"
check "export --llmc CK/index"     "inside the input checkpoint" 1 -- export "$CK" --out "$T/x.h5" --llmc "$CK/index.h5"
check "export --out via ckpt-dir"  "inside the input checkpoint" 1 -- export "$T/ck" --out "$CK/index.h5"
check "export --out hardlink"      "inside the input checkpoint" 1 -- export "$CK" --out "$T/index-hard.h5"
check "export --out = --llmc"      "same file"                   1 -- export "$CK" --out "$T/y.bin" --llmc "$T/y.bin"
check "prepare over its input"     "is the input --input"        1 -- prepare --input "$T/data/train.bin" --output "$T/data"
# a Hugging Face directory and the files in it, eval --logits-out, prepare --tokenizer
"$BIN" export "$CK" --hf "$T/hf" >/dev/null || { echo "FAIL: export --hf"; fails=$((fails+1)); }
echo '{"model": {"type": "BPE", "vocab": {}, "merges": []}}' > "$T/tok.json"
hf_before=$(cat "$T/hf"/* "$T/tok.json" | md5sum)
check "train --save-model into HF dir" "inside the input --init"  2 -- train $D --init "$T/hf" --save-model "$T/hf/model.safetensors"
check "train --log HF config.json"    "inside the input --init"   2 -- train $D --init "$T/hf" --log "$T/hf/config.json"
check "train --log HF file's config"  "is the input --init"        2 -- train $D --init "$T/hf/model.safetensors" --log "$T/hf/config.json"
check "train --save-model = --init"   "is the input --init"        2 -- train $D --init "$T/model.bin" --save-model "$T/model.bin"
check "eval --logits-out onto model"  "inside the input model"     2 -- eval "$T/hf" --data "$T/data/val.bin" --seq-len 16 --logits-out "$T/hf/model.safetensors"
check "eval --logits-out onto data"   "is the input --data"        2 -- eval "$T/model.bin" --data "$T/data/val.bin" --seq-len 16 --logits-out "$T/data/val.bin"
check "eval --logits-out onto .bin"   "is the input model"         2 -- eval "$T/model.bin" --data "$T/data/val.bin" --seq-len 16 --logits-out "$T/model.bin"
check "prepare over its tokenizer"    "is the input --tokenizer"   1 -- prepare --input "$T/text.txt" --tokenizer "$T/data/train.bin" --output "$T/data"
# the validation shards matched by --data's glob too
check "val-data inside the data glob" "--val-data $T/data/val.bin is also a --data file" 2 -- train $D --data "$T/data/*.bin" --val-data "$T/data/val.bin"
# an existing --log: refused for a fresh run; --log-overwrite replaces it; a running job's log is locked
echo '{"step": 1}' > "$T/old.jsonl"
check "fresh run onto an existing log" "--log $T/old.jsonl exists" 2 -- train $D --log "$T/old.jsonl"
settle
[ "$(cat "$T/old.jsonl")" = '{"step": 1}' ] || { echo "FAIL: the existing log was changed"; fails=$((fails+1)); }
"$BIN" train $D --log "$T/old.jsonl" --log-overwrite --quiet >/dev/null && [ "$(wc -l < "$T/old.jsonl")" -eq 2 ] \
  || { echo "FAIL: --log-overwrite did not replace the log"; fails=$((fails+1)); }
[ ! -e "$T/old.jsonl.lock" ] || { echo "FAIL: the log's lock is left after the run"; fails=$((fails+1)); }
echo '{"step": 7}' > "$T/other.jsonl"
check "resume onto another run's log" "has no row of step 2" 2 -- train $D --steps 4 --ckpt-dir "$T/ck" --resume latest --log "$T/other.jsonl"
settle
# --resume auto (the requeue idiom) before any checkpoint: the log is the job's own, started again
echo '{"step": 1}' > "$T/req.jsonl"
"$BIN" train $D --ckpt-dir "$T/ck_req" --resume auto --log "$T/req.jsonl" --quiet >/dev/null \
  && [ "$(wc -l < "$T/req.jsonl")" -eq 2 ] || { echo "FAIL: --resume auto with no checkpoint did not start its log again"; fails=$((fails+1)); }
sleep 600 & holder=$!
echo "$(hostname) $holder -" > "$T/held.jsonl.lock"
check "log held by a running job"    "--log $T/held.jsonl is in use by another job" 2 -- train $D --log "$T/held.jsonl"
settle
kill $holder; wait $holder 2>/dev/null
[ ! -e "$T/held.jsonl" ] || { echo "FAIL: the held log was opened"; fails=$((fails+1)); }
"$BIN" train $D --log "$T/held.jsonl" --quiet >/dev/null || { echo "FAIL: a dead holder's log lock was not taken over"; fails=$((fails+1)); }
[ "$(cat "$T/hf"/* "$T/tok.json" | md5sum)" = "$hf_before" ] || { echo "FAIL: the HF directory or tokenizer changed"; fails=$((fails+1)); }
sum_after=$(cat "$T/data/train.bin" "$T/data/val.bin" "$CK"/* | md5sum)
[ "$sum_before" = "$sum_after" ] || { echo "FAIL: an input changed"; fails=$((fails+1)); }
"$BIN" ckpt verify "$CK" >/dev/null || { echo "FAIL: the checkpoint no longer verifies"; fails=$((fails+1)); }
# and the legal neighbours still work: a --threads inside the bound, an export beside the checkpoint
"$BIN" train $D --threads 1 --quiet >/dev/null || { echo "FAIL: --threads 1 refused"; fails=$((fails+1)); }
"$BIN" export "$CK" --out "$T/e.h5" --llmc "$T/e.bin" >/dev/null || { echo "FAIL: a legal export failed"; fails=$((fails+1)); }
settle
report_checks
fails=$((fails + check_fails))
[ $fails -eq 0 ] || { echo "$fails case(s) failed"; exit 1; }
echo "args_robust ok"
