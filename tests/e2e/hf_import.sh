#!/usr/bin/env bash
# Hugging Face, import: a randomly initialised transformers GPT2LMHeadModel (every tensor off its
# default init, vocab 300 padded to 384 here), saved by save_pretrained, starts a shardgpt run
# with --init DIR (1 rank, DDP) and --init DIR/model.safetensors (2 ranks, ZeRO-3: each rank
# reads only its owned ranges); the first step's loss equals PyTorch's on the same batch
# within 1e-5.
set -euo pipefail
BIN=$1 SRC=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rc=0; PY=$("$SRC/scripts/hf-venv.sh") || rc=$?
if [ $rc = 77 ]; then echo "SKIP hf_import: PyPI unreachable, the transformers reference cannot be installed"; exit 77; fi
[ $rc = 0 ] || { echo "hf_import: FAILED to install the Hugging Face reference stack (scripts/hf-venv.sh rc $rc)"; exit 1; }
REF=$SRC/tests/e2e/hf_ref.py

"$PY" "$REF" hf-random "$T/hf" 5
for i in $(seq 1 100); do echo "And God said, Let there be light: and there was light. 0123456789"; done > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" --val-fraction 0 >/dev/null
"$BIN" train --init "$T/hf" --data "$T/data/train.bin" --seq-len 32 --micro-batch 4 --steps 1 --no-shuffle --threads 1 \
  --log "$T/a.jsonl" --quiet >/dev/null
"$PY" "$REF" step-loss "$T/hf" "$T/data/train.bin" 32 4 "$T/a.jsonl"
mpirun -np 2 --oversubscribe "$BIN" train --init "$T/hf/model.safetensors" --zero-stage 3 --data "$T/data/train.bin" \
  --seq-len 32 --micro-batch 4 --steps 1 --no-shuffle --threads 1 --log "$T/b.jsonl" --quiet >/dev/null
"$PY" "$REF" step-loss "$T/hf" "$T/data/train.bin" 32 8 "$T/b.jsonl"
echo "hf_import ok"
