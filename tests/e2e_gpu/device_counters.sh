#!/usr/bin/env bash
# Nothing is allocated, freed or synchronised with the host inside a training step once the
# first step has filled the caches (CudaDevice's caching allocator, its pinned staging ring, the
# kernels' scratch): `train --device cuda` on a tiny model, ZeRO stages 0-3, fp32 and bf16, 1
# and 2 ranks over NCCL, --log. From step 2 on, on every rank (*_per_rank):
#   device_frees == 0 and device_allocations == 0 in every row, but for at most one block per
#     rank over the run (tests/e2e/lib/device_counters_check.py says why; the NCCL watchdog's
#     polls run the emulated streams too, so the timing varies there as well);
#   host_syncs <= 1: the one read of the step's loss and gradient norm (kept on the device
#   through the step: the fused classifier's loss, the norm, the clip factor and their sums
#   over ranks; token ids go up through pinned asynchronous copies; the embedding backward
#   sorts on the device; collectives are retired in stream order).
# Under the CUDA emulation the counters are the whole process's CUDA calls (the NCCL
# communicator's and its watchdog's included); on a GPU they are CudaDevice's own
# cudaMalloc/cudaFree calls and host_syncs is not counted (printed as "?", not checked).
# SHARDGPT_CUDA_EMU_TRACE_SYNCS=1 makes the emulator print each sync's call stack.
# Rows without the counters fail the test. Where fewer GPUs than ranks are visible, the 2-rank
# runs use --comm mpi (ranks sharing the GPU). Exits 77 (skipped) where `--device cuda` has no GPU.
set -euo pipefail
BIN=$1
source "$(dirname "$0")/lib/gpu_count.sh"  # gpu_comm: --comm mpi where ranks share a GPU
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for i in $(seq 1 200); do echo "In the beginning God created the heaven and the earth. And the earth was without form."; done > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null
MODEL="--data $T/data/train.bin --seq-len 32 --n-layer 2 --n-embd 64 --n-head 4 --lr 3e-3 --seed 3 --quiet --threads 1"
if ! probe=$("$BIN" train $MODEL --micro-batch 2 --steps 1 --device cuda --log "$T/probe.jsonl" 2>&1); then
  if grep -q "no usable GPU" <<<"$probe"; then echo "SKIP: $probe"; exit 77; fi
  echo "$probe"; exit 1
fi
if ! grep -q '"device_allocations"' "$T/probe.jsonl"; then
  echo "FAIL: the JSONL rows of --device cuda carry no device counters (device_allocations)"; cat "$T/probe.jsonl"; exit 1
fi

train() {  # train NP LOG [flags]
  local np=$1 log=$2; shift 2
  timeout 600 mpirun -np "$np" --oversubscribe "$BIN" train $MODEL --steps 4 --log "$log" "$@" >"$log.out" 2>&1 ||
    { echo "FAIL: mpirun -np $np train $* (log $log.out):"; cat "$log.out"; exit 1; }
}
check() {  # check LOG WHAT: from step 2 on, on every rank: no free, no allocation (but one late block), <= 1 host sync
  /usr/bin/python3 "$(dirname "$0")/../e2e/lib/device_counters_check.py" "$@"
}

echo "per step 1..4, rank 0/rank 1 (step 1 fills the caches):"
status=0
for np in 1 2; do
  for dtype in fp32 bf16; do
    for stage in 0 1 2 3; do
      tag="${dtype}_np${np}_stage${stage}"
      train "$np" "$T/$tag.jsonl" --micro-batch 2 --grad-accum 2 --zero-stage "$stage" --dtype "$dtype" \
        --device cuda --comm "$(gpu_comm "$np")"
      check "$T/$tag.jsonl" "$dtype np=$np stage=$stage" || status=1
    done
  done
done
[ "$status" = 0 ] || { echo "FAIL: device_counters"; exit 1; }
echo "device_counters: from step 2 on, no device free, no allocation but at most one late block per rank, at most one host sync per rank and step"
