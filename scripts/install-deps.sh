#!/usr/bin/env bash
# Installs the Debian packages shardgpt needs, only when something is missing. Safe to run again.
#   scripts/install-deps.sh        everything: the build, the tests, the benchmarks, the CUDA emulation
#   scripts/install-deps.sh demo   only what scripts/demo.sh needs: the trainer's build and bible-kjv
# Called by the README commands, the Makefile and .ci/run.
set -euo pipefail
DEMO_PKGS=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libhdf5-dev libopenblas-dev libdnnl-dev
           libcli11-dev nlohmann-json3-dev libpcre2-dev bible-kjv)  # PCRE2: the BPE pre-tokenizer
# The rest: GoogleTest and Google Benchmark, Boost.Context (the CUDA emulation's fibers), the
# tests' Python (numpy, h5py, matplotlib; torch + venv for the Hugging Face tests, scripts/hf-venv.sh).
ALL_PKGS=("${DEMO_PKGS[@]}" hdf5-tools libgtest-dev googletest libbenchmark-dev libboost-context-dev
          python3-numpy python3-h5py python3-matplotlib python3-torch python3-venv)
case "${1:-all}" in
  demo) PKGS=("${DEMO_PKGS[@]}") ;;
  all) PKGS=("${ALL_PKGS[@]}") ;;
  *) echo "install-deps: unknown set '$1' (expected demo or all)" >&2; exit 2 ;;
esac
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
