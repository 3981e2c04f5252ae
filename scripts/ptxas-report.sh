#!/usr/bin/env bash
# Register report of the CUDA kernels: compiles each model/cuda/*.cu (or the files named) for
# one architecture with the flags the real build gives them (root CMakeLists.txt: -O3 -DNDEBUG
# -std=c++17, and --fmad=false for attention_tc_cuda.cu) plus -Xptxas -v, and prints one line
# per kernel:
#   kernel (demangled, without namespaces and parameters; unsigned short = bf16), registers,
#   spill store / load bytes, static shared memory bytes,
#   threads per block, blocks per SM as limited by registers.
# Threads per block: a table for attention_tc_cuda.cu (128: kTile / 16 warps), else the file's
# `constexpr int kThreads = N` (the block of its row and element-wise kernels), else 256; the
# column is the file's block size, not read from each launch (layernorm_backward_partial_kernel's
# 32x8 is 256 too; the matmul and attention_cuda.cu kernels may use others: check the launch).
# Dynamic shared memory (the attention tiles) is not in the static column.
# Blocks per SM by registers (sm_80 / sm_90: 65536 registers in 4 partitions of 16384, one
# warp's registers allocated in units of 256, i.e. 8 per thread, at most 64 warps and 32
# blocks per SM):  warps = 4 * floor(16384 / (ceil(regs / 8) * 8 * 32)),
#                  blocks = min(32, floor(min(warps, 64) / (threads / 32))).
#
# Usage: scripts/ptxas-report.sh [-a sm_90] [file.cu ...]   (NVCC: the compiler, default
#        /usr/local/cuda/bin/nvcc or nvcc on PATH). Exit 1 if a file does not compile.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
arch=sm_90
if [[ ${1:-} == -a ]]; then
  arch=$2
  shift 2
fi
nvcc=${NVCC:-}
if [[ -z $nvcc ]]; then
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then nvcc=/usr/local/cuda/bin/nvcc; else nvcc=nvcc; fi
fi
files=("$@")
if ((${#files[@]} == 0)); then files=("$root"/model/cuda/*.cu); fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf '%-48s %5s %7s %7s %7s %5s %6s\n' kernel regs spill_st spill_ld smem thr blk/SM
for f in "${files[@]}"; do
  extra=()
  [[ $(basename "$f") == attention_tc_cuda.cu ]] && extra=(--fmad=false)
  # Threads per block: the table below, else the file's `constexpr int kThreads = N`, else 256.
  case $(basename "$f") in
    attention_tc_cuda.cu) threads=128 ;;  # kThreads = kWarps * 32, kWarps = kTile / 16, kTile = 64
    *) threads=$(sed -n 's/^constexpr int kThreads = \([0-9][0-9]*\);.*/\1/p' "$f" | head -1) ;;
  esac
  threads=${threads:-256}
  echo "# $(basename "$f") ($arch, $threads threads per block)"
  if ! "$nvcc" -arch="$arch" -std=c++17 -I"$root" -O3 -DNDEBUG "${extra[@]}" -Xptxas -v -c "$f" \
      -o "$tmp/x.o" >"$tmp/log" 2>&1; then
    cat "$tmp/log" >&2
    exit 1
  fi
  # ptxas: "Compiling entry function 'NAME'", then "N bytes stack frame, S bytes spill stores,
  # L bytes spill loads", then "Used R registers, ... [, M bytes smem]".
  awk -v threads="$threads" '
    /Compiling entry function/ { match($0, /'"'"'[^'"'"']*'"'"'/); name = substr($0, RSTART + 1, RLENGTH - 2); st = 0; ld = 0; next }
    /bytes spill stores/ { for (i = 1; i <= NF; i++) { if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) == "stores,") st = $i; if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) == "loads") ld = $i } next }
    /Used [0-9]+ registers/ && name != "" {
      regs = 0; smem = 0
      for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^registers/) regs = $i; if ($(i+1) == "bytes" && $(i+2) ~ /^smem/) smem = $i }
      per_warp = int((regs + 7) / 8) * 8 * 32
      warps = per_warp > 0 ? 4 * int(16384 / per_warp) : 64
      if (warps > 64) warps = 64
      blocks = int(warps / (threads / 32)); if (blocks > 32) blocks = 32
      print name, regs, st, ld, smem, threads, blocks
      name = ""
    }' "$tmp/log" |
    while read -r mangled regs st ld smem thr blocks; do
      demangled=$(c++filt "$mangled" | sed -e 's/(anonymous namespace):://g' -e 's/shardgpt::cuda:://g' -e 's/shardgpt:://g' \
        -e 's/^void //' -e 's/unsigned short/bf16/g' -e 's/(.*)$//')
      printf '%-48s %5s %7s %7s %7s %5s %6s\n' "$demangled" "$regs" "$st" "$ld" "$smem" "$thr" "$blocks"
    done
done
