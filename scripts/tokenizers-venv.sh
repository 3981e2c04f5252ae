#!/usr/bin/env bash
# Prints the python of a virtual environment with a newer Hugging Face `tokenizers` than
# scripts/hf-venv.sh's (which transformers 4.36.2 pins to 0.15.2): tokenizers 0.21.4, the
# reference for the Llama 3-style tokenizer.json features that 0.15.2 does not read
# (model.ignore_merges). Debian's python3 with its system site packages (numpy), creating the
# environment on first use. Never needed to build or train.
#
# Exit status: 0 (the python path on stdout); 77 when PyPI cannot be reached at all (the
# caller skips, saying so); 1 when the install fails otherwise (the caller fails).
set -euo pipefail
# /opt for root (CI), else the user's cache; SHARDGPT_TOKENIZERS_VENV overrides
if [ -z "${SHARDGPT_TOKENIZERS_VENV:-}" ]; then
  if [ -w /opt ] || [ -x /opt/shardgpt-tokenizers-venv/bin/python ]; then SHARDGPT_TOKENIZERS_VENV=/opt/shardgpt-tokenizers-venv
  else SHARDGPT_TOKENIZERS_VENV=${XDG_CACHE_HOME:-$HOME/.cache}/shardgpt-tokenizers-venv; mkdir -p "$(dirname "$SHARDGPT_TOKENIZERS_VENV")"; fi
fi
VENV=$SHARDGPT_TOKENIZERS_VENV
PY=$VENV/bin/python
VERSION=0.21.4
check() { "$PY" -c "import numpy, tokenizers; assert tokenizers.__version__ == '$VERSION'" >/dev/null 2>&1; }
if [ -x "$PY" ] && check; then echo "$PY"; exit 0; fi
exec 9>"/tmp/shardgpt-tokenizers-venv.lock"; flock 9  # two tests may create it at once
if [ -x "$PY" ] && check; then echo "$PY"; exit 0; fi
/usr/bin/python3 -c 'import numpy' 2>/dev/null || { echo "tokenizers-venv: Debian's python3-numpy is not installed (scripts/install-deps.sh)" >&2; exit 1; }
/usr/bin/python3 -m venv --system-site-packages "$VENV" >&2
if ! "$VENV/bin/pip" install -q --disable-pip-version-check "tokenizers==$VERSION" >&2; then
  if ! /usr/bin/python3 -c 'import urllib.request; urllib.request.urlopen("https://pypi.org/simple/", timeout=15)' 2>/dev/null; then
    echo "tokenizers-venv: PyPI (https://pypi.org) is unreachable from here: cannot install tokenizers $VERSION" >&2
    exit 77
  fi
  echo "tokenizers-venv: pip install of tokenizers==$VERSION failed (PyPI is reachable)" >&2
  exit 1
fi
check || { echo "tokenizers-venv: the installed tokenizers does not import (python: $PY)" >&2; exit 1; }
echo "$PY"
