#!/usr/bin/env bash
# Installs the Debian packages shardgpt needs, only when something is missing. Safe to run again.
#   scripts/install-deps.sh        everything: the build, the tests, the benchmarks, the CUDA emulation
#   scripts/install-deps.sh demo   only what scripts/demo.sh needs: the trainer's build and bible-kjv
# Called by the README commands, the Makefile and .ci/run.
set -euo pipefail
DEMO_PKGS=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libhdf5-dev libopenblas-dev libdnnl-dev
           libcli11-dev nlohmann-json3-dev libpcre2-dev zlib1g-dev bible-kjv)  # PCRE2: the BPE pre-tokenizer; zlib: gzip'd prepare inputs
# The rest: GoogleTest and Google Benchmark, Boost.Context (the CUDA emulation's fibers), the
# tests' Python (numpy, h5py, matplotlib; torch + venv for the Hugging Face tests, scripts/hf-venv.sh).
ALL_PKGS=("${DEMO_PKGS[@]}" hdf5-tools libgtest-dev googletest libbenchmark-dev libboost-context-dev
          python3-numpy python3-h5py python3-matplotlib python3-torch python3-venv)
case "${1:-all}" in
  demo) PKGS=("${DEMO_PKGS[@]}") ;;
  all) PKGS=("${ALL_PKGS[@]}") ;;
  *) echo "install-deps: unknown set '$1' (expected demo or all)" >&2; exit 2 ;;
esac
# The cuDNN frontend's headers (PyPI's nvidia-cudnn-frontend wheel, unpacked into .deps/, not
# installed) where a CUDA toolkit is present: the nvcc build then compiles --attention cudnn
# (model/cuda/attention_cudnn.cc), so that a change of the frontend's API shows here, not on a GPU.
# Where pip cannot fetch it the build goes on without --attention cudnn.
cudnn_frontend() {
  [ "${1:-all}" = all ] || return 0
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || return 0
  [ -f .deps/cudnn-frontend/include/cudnn_frontend.h ] && return 0
  command -v python3 >/dev/null 2>&1 || return 0
  # shellcheck source=scripts/gpu-deps.sh
  if (source scripts/gpu-deps.sh && gpu_deps_cudnn_frontend .deps/cudnn-frontend 2>/tmp/shardgpt-cudnn-frontend.log); then
    echo "shardgpt: cuDNN frontend headers in .deps/cudnn-frontend ($(cat .deps/cudnn-frontend/version))" >&2
  else
    echo "shardgpt: no cuDNN frontend headers (pip: $(tail -1 /tmp/shardgpt-cudnn-frontend.log)): --attention cudnn is not built" >&2
  fi
}
cd "$(dirname "$0")/.."
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then cudnn_frontend "${1:-all}"; exit 0; fi
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
cudnn_frontend "${1:-all}"
