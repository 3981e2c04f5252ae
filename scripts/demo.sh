#!/usr/bin/env bash
# The demo: prepares the King James Bible (Debian's bible-kjv) as byte-level token shards,
# trains a small GPT on 2 MPI ranks (ZeRO stage 1 by default), prints the loss falling, a
# validation loss, and a text sample. Installs what it needs and builds only the trainer first
# (into BUILD, default build/; a folder it configures has the tests, the benchmarks and the
# CUDA backend off, since the demo trains on the CPU, and scripts/build.sh or scripts/test.sh
# turn them on in the same folder).
# Usage: scripts/demo.sh [extra train flags, e.g. --zero-stage 3 --dtype bf16]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
scripts/install-deps.sh demo
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSHARDGPT_TESTS=OFF -DSHARDGPT_BENCH=OFF \
    -DSHARDGPT_CUDA=OFF >/dev/null
fi
cmake --build "$BUILD" -j "$(nproc)" --target shardgpt
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ ! -s data/kjv/train.bin ]; then
  mkdir -p data
  bible -f Gen1:1-Rev22:21 > data/kjv.txt
  "$BUILD"/shardgpt prepare --input data/kjv.txt --output data/kjv
fi
mkdir -p runs
mpirun -np 2 --oversubscribe --mca odls_base_sigkill_timeout 30 "$BUILD"/shardgpt train \
  --data data/kjv/train.bin --val-data data/kjv/val.bin \
  --model tiny --n-layer 4 --n-head 4 --n-embd 128 --max-seq-len 128 --seq-len 128 \
  --micro-batch 8 --grad-accum 1 --steps 600 --lr 3e-3 --warmup-steps 30 \
  --zero-stage 1 --eval-every 200 --log runs/demo.jsonl --log-overwrite --save-model runs/demo.bin \
  --sample-tokens 300 --sample-prompt "And God said" "$@"
