#!/usr/bin/env bash
# Installs the Debian packages shardgpt needs, only when something is missing.
# Called by the README commands, the Makefile and .ci/run. Safe to run again.
set -euo pipefail
PKGS=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools
      libopenblas-dev libdnnl-dev libcli11-dev nlohmann-json3-dev libgtest-dev googletest libbenchmark-dev libboost-context-dev
      bible-kjv python3-numpy python3-h5py python3-matplotlib
      libpcre2-dev python3-torch python3-venv)  # PCRE2: BPE pre-tokenizer; torch + venv: the Hugging Face tests (scripts/hf-venv.sh)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "shardgpt: apt-get not available; please install: ${missing[*]}" >&2
  echo "  (Open MPI, HDF5 with C++ bindings, OpenBLAS, oneDNN, CLI11, nlohmann-json, GoogleTest, Google Benchmark, CMake >= 3.20)" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "shardgpt: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
