#!/usr/bin/env bash
# --arch llama against PyTorch: tests/torch/llama_ref (shardgpt's model and AdamW) and
# tests/torch/llama_torch.py (the same model written in PyTorch) take the same initial
# parameters and tokens through 5 AdamW steps; every loss agrees within 1e-5 (fp32), for an
# untied and a tied head. Skips (77) where Debian's python3-torch is missing.
#   llama_torch.sh LLAMA_REF_BINARY SOURCE_DIR
set -euo pipefail
REF=$1 SRC=$2
/usr/bin/python3 -c 'import torch, numpy' 2>/dev/null || { echo "SKIP: no python3-torch"; exit 77; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
for head in untied tied; do
  mkdir -p "$T/$head"
  "$REF" "$T/$head" $([ $head = tied ] && echo --tied)
  /usr/bin/python3 "$SRC/tests/torch/llama_torch.py" "$T/$head" || { echo "FAIL: $head head"; exit 1; }
done
