#!/usr/bin/env bash
# The CPU device's block cache (model/cpu_device.cc): once the first step has filled it, a
# training step takes no host memory from the system and gives none back — no fresh pages for
# the kernels to fault in (faulting them in costs a large product, such as the LM head's weight
# gradient, several times its compute). `train` on a tiny model, ZeRO stages 0-3, fp32 and bf16
# storage, 1 and 2 ranks over MPI, --log; tests/e2e/lib/device_counters_check.py checks the
# rows from step 2 on: no system allocation (but at most one late block per rank) and no system
# free, on every rank.
set -euo pipefail
source "$(dirname "$0")/lib/common.sh"
e2e_prepare 200 "In the beginning God created the heaven and the earth. And the earth was without form."
MODEL="--data $T/data/train.bin --seq-len 32 --n-layer 2 --n-embd 64 --n-head 4 --lr 3e-3 --seed 3 --quiet --threads 1"
status=0
echo "per step 1..4, rank 0/rank 1 (step 1 fills the cache):"
for np in 1 2; do
  for dtype in fp32 bf16; do
    for stage in 0 1 2 3; do
      log="$T/${dtype}_np${np}_stage${stage}.jsonl"
      timeout 300 mpirun -np "$np" --oversubscribe "$BIN" train $MODEL --micro-batch 2 --grad-accum 2 --steps 4 \
        --zero-stage "$stage" --dtype "$dtype" --log "$log" >"$log.out" 2>&1 ||
        { cat "$log.out"; fail "mpirun -np $np train --zero-stage $stage --dtype $dtype"; }
      /usr/bin/python3 "$(dirname "$0")/lib/device_counters_check.py" "$log" "$dtype np=$np stage=$stage" || status=1
    done
  done
done
[ "$status" = 0 ] || fail "cpu_block_cache: host memory taken from or given back to the system inside a step"
echo "cpu_block_cache: from step 2 on, no host allocation (but at most one late block per rank) and no free, on every rank"
