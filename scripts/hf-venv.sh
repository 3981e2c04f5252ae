#!/usr/bin/env bash
# Prints the python of a virtual environment with the Hugging Face reference stack for the
# tests/e2e/hf_*.sh tests and bench/tokenize.sh, creating it on first use: Debian's python3
# (python3-torch 1.13, from scripts/install-deps.sh) with its system site packages, plus
# transformers 4.36.2 (the last line that works with torch 1.13), tokenizers and safetensors
# from PyPI. Never needed to build or train.
#
# Exit status: 0 (the python path on stdout); 77 when PyPI cannot be reached at all (the
# caller skips, saying so); 1 when the install fails otherwise (the caller fails).
set -euo pipefail
# /opt for root (CI), else the user's cache; SHARDGPT_HF_VENV overrides
if [ -z "${SHARDGPT_HF_VENV:-}" ]; then
  if [ -w /opt ] || [ -x /opt/shardgpt-hf-venv/bin/python ]; then SHARDGPT_HF_VENV=/opt/shardgpt-hf-venv
  else SHARDGPT_HF_VENV=${XDG_CACHE_HOME:-$HOME/.cache}/shardgpt-hf-venv; mkdir -p "$(dirname "$SHARDGPT_HF_VENV")"; fi
fi
VENV=$SHARDGPT_HF_VENV
PY=$VENV/bin/python
check() { "$PY" -c 'import torch, transformers, tokenizers, safetensors' >/dev/null 2>&1; }
if [ -x "$PY" ] && check; then echo "$PY"; exit 0; fi
exec 9>"/tmp/shardgpt-hf-venv.lock"; flock 9  # two tests may create it at once
if [ -x "$PY" ] && check; then echo "$PY"; exit 0; fi
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "hf-venv: Debian's python3-torch is not installed (scripts/install-deps.sh)" >&2; exit 1; }
/usr/bin/python3 -m venv --system-site-packages "$VENV" >&2
if ! "$VENV/bin/pip" install -q --disable-pip-version-check "transformers==4.36.2" "tokenizers==0.15.2" "safetensors>=0.4" >&2; then
  if ! /usr/bin/python3 -c 'import urllib.request; urllib.request.urlopen("https://pypi.org/simple/", timeout=15)' 2>/dev/null; then
    echo "hf-venv: PyPI (https://pypi.org) is unreachable from here: cannot install the Hugging Face reference stack" >&2
    exit 77
  fi
  echo "hf-venv: pip install of transformers==4.36.2 tokenizers==0.15.2 safetensors failed (PyPI is reachable)" >&2
  exit 1
fi
check || { echo "hf-venv: the installed stack does not import (python: $PY)" >&2; exit 1; }
echo "$PY"
