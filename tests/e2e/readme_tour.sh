#!/usr/bin/env bash
# The README's tour, run as written: every ```sh block of README.md that follows a line
# `<!-- tour -->` or `<!-- tour: needs transformers -->` is taken from README.md at test time
# and run in order, in one bash -e shell, in a scratch folder where build/shardgpt is the binary
# under test. STEPS and MORE (the run lengths the README documents) are set small. Then each
# step's result is checked: the shards, the loss lines and the log rows, the resume line, the
# eval JSON, the sample, the checkpoint check, the plan tables, the exported files.
#
# Blocks marked `needs transformers` run when a Python with transformers and tokenizers is
# found by the rule of the hf_* tests: python3 on PATH if it imports them, else
# scripts/hf-venv.sh (exit 77, PyPI unreachable: those blocks are skipped, saying so; any
# other failure fails the test). Every other block always runs.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"  # BIN, T, fail, mpirun as root
SRC=$2
README=$SRC/README.md
command -v bible >/dev/null || fail "needs Debian's bible-kjv (scripts/install-deps.sh)"

# Extract the blocks: tour_N.sh, and tour_N.kind = always | transformers.
/usr/bin/python3 - "$README" "$T" <<'PY'
import re, sys
lines = open(sys.argv[1], encoding="utf-8").read().split("\n")
n, i = 0, 0
while i < len(lines):
    m = re.fullmatch(r"<!-- tour(: needs transformers)? -->", lines[i].strip())
    if m:
        j = i + 1
        while j < len(lines) and lines[j].strip() == "":
            j += 1
        if j >= len(lines) or lines[j].strip() != "```sh":
            sys.exit("README.md line %d: a tour marker must be followed by a ```sh block" % (i + 1))
        k = j + 1
        while k < len(lines) and lines[k].strip() != "```":
            k += 1
        n += 1
        open("%s/tour_%d.sh" % (sys.argv[2], n), "w").write("\n".join(lines[j + 1:k]) + "\n")
        open("%s/tour_%d.kind" % (sys.argv[2], n), "w").write("transformers" if m.group(1) else "always")
        i = k
    i += 1
if n < 6:
    sys.exit("README.md: found %d tour blocks, expected at least 6" % n)
open("%s/tour_count" % sys.argv[2], "w").write(str(n))
print("readme_tour: %d blocks from README.md" % n)
PY

# A Python with transformers and tokenizers, by the hf_* tests' rule.
HF=""
if python3 -c 'import transformers, tokenizers, torch' 2>/dev/null; then
  HF=$(command -v python3)
else
  rc=0; HF=$("$SRC/scripts/hf-venv.sh") || rc=$?
  if [ $rc = 77 ]; then HF=""; echo "readme_tour: PyPI unreachable, no transformers: the blocks marked 'needs transformers' are SKIPPED"
  elif [ $rc != 0 ]; then fail "scripts/hf-venv.sh failed (rc $rc): cannot run the blocks marked 'needs transformers'"; fi
fi
mkdir -p "$T/work/build" "$T/bin"
ln -s "$(readlink -f "$BIN")" "$T/work/build/shardgpt"
# python3 for the README's blocks (a wrapper, not a link: a venv's python finds its packages by its own path)
[ -n "$HF" ] && printf '#!/bin/sh\nexec "%s" "$@"\n' "$HF" > "$T/bin/python3" && chmod +x "$T/bin/python3"

# One script: the blocks in order, each announced; skipped blocks say so.
S=$T/tour.sh
echo 'set -euo pipefail' > "$S"
ran_hf=0 hf1=0
for n in $(seq 1 "$(cat "$T/tour_count")"); do
  if [ "$(cat "$T/tour_$n.kind")" = transformers ]; then
    [ $hf1 = 0 ] && hf1=$n
    if [ -z "$HF" ]; then echo "echo '=== block $n: SKIPPED (needs transformers)'" >> "$S"; continue; fi
    ran_hf=1
  fi
  echo "echo '=== block $n'" >> "$S"; cat "$T/tour_$n.sh" >> "$S"
done
# small sizes through the README's variables; more ranks than cores allowed on small machines
export STEPS=12 MORE=18 PATH=$T/bin:$PATH OMPI_MCA_rmaps_base_oversubscribe=1
cd "$T/work"
if ! bash "$S" > "$T/out.txt" 2>&1; then
  tail -30 "$T/out.txt"; fail "a tour command failed (the last block started: $(grep '^=== block' "$T/out.txt" | tail -1))"
fi
out=$T/out.txt

# What each step must have left behind.
[ -s data/mine/train.bin ] && [ -s data/mine/val.bin ] || fail "prepare wrote no shards"
grep -q "prepared .* byte-level tokens" "$out" || fail "prepare printed no summary"
[ "$(grep -c '^final train loss [0-9.]* | val loss [0-9.]*' "$out")" -ge 2 ] || fail "train did not print its final losses twice"
grep -q "resumed from .*step_0*12 at step 12" "$out" || fail "the second train did not resume from step 12"
[ -d runs/ckpt/step_00000018 ] || fail "no checkpoint at step 18"
/usr/bin/python3 - runs/train.jsonl <<'PY' || fail "runs/train.jsonl"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == list(range(1, 19)), [r["step"] for r in rows]
assert all(math.isfinite(r["loss"]) for r in rows)
assert rows[-1]["loss"] < rows[0]["loss"] - 1.0, (rows[0]["loss"], rows[-1]["loss"])
print("train.jsonl: 18 rows, loss %.3f -> %.3f" % (rows[0]["loss"], rows[-1]["loss"]))
PY
grep '^{"loss"' "$out" | /usr/bin/python3 -c '
import json, sys
e = json.loads(sys.stdin.readline())
assert e["loss"] < 4.5 and e["tokens"] > 0 and e["perplexity"] > 1, e
print("eval: loss %.3f over %d tokens" % (e["loss"], e["tokens"]))' || fail "eval printed no valid JSON line"
grep -q "^And God said" "$out" || fail "sample did not continue the prompt"
grep -q "^ok: runs/ckpt/step_00000018: step 18" "$out" || fail "ckpt verify did not pass"
grep -q "saved by *3 rank(s), zero stage 1" "$out" || fail "ckpt inspect did not print the index"
grep -q "^\*3 " "$out" || fail "plan printed no stage table"
grep -q "what fits in 80.000 GiB per rank" "$out" || fail "plan --memory printed no table"
[ -s runs/hf/config.json ] && [ -s runs/hf/model.safetensors ] || fail "export --hf wrote no model"
[ -s my.jsonl ] && [ -s data/jsonl/train.bin ] || fail "the JSON Lines block wrote no shards"
[ -d runs/llama/step_00000012 ] || fail "the llama run left no checkpoint at step 12"
grep -q '"LlamaForCausalLM"' runs/hf-llama/config.json || fail "export --hf of the llama run wrote no LlamaForCausalLM config"
if [ $ran_hf = 1 ]; then
  grep -A1 "^=== block $hf1$" "$out" | grep -q "^And God said" || fail "transformers did not continue the prompt"
  grep -q "^llama: And God said" "$out" || fail "transformers' LlamaForCausalLM did not continue the prompt"
  [ -s tokenizer.json ] && [ -s data/bpe/train.bin ] && [ -s runs/hf-bpe/tokenizer.json ] || fail "the BPE path wrote no files"
  tail -1 "$out" | grep -q "And God said" || fail "transformers with the BPE tokenizer did not continue the prompt"
  echo "readme_tour: the transformers blocks ran ($HF)"
fi
grep -E '^(=== block|final train loss|resumed from|\{"loss"|ok: )' "$out"
echo "readme_tour ok"
