#!/usr/bin/env bash
# With --device cuda the GPU is set before MPI_Init, from the launcher's node-local rank
# (model/device_factory.h: SetGpuBeforeMpi), and the device chosen after MPI_Init agrees:
#   1. mpirun -np 2 --comm nccl (2 GPUs or more): rank r on cuda:r, its topology line ending in
#      ", set before MPI_Init from OMPI_COMM_WORLD_LOCAL_RANK=r";
#   2. one process (MPI's local rank 0) with LOCAL_RANK=1 and 2 GPUs: cuda:1 was set before
#      MPI_Init, MPI's local rank takes cuda:0: one warning line naming both, training on cuda:0;
#   3. the same with --device cpu: no GPU is set (no "before MPI_Init" anywhere), it trains.
# Exits 77 (skipped) where `--device cuda` has no GPU, or fewer than 2 GPUs for 1 and 2.
set -euo pipefail
BIN=$1
source "$(dirname "$0")/lib/gpu_count.sh"
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# no launcher's local rank leaks in from the caller (a Slurm step, torchrun)
unset OMPI_COMM_WORLD_LOCAL_RANK SLURM_LOCALID MPI_LOCALRANKID PMI_LOCAL_RANK LOCAL_RANK CUDA_VISIBLE_DEVICES
for i in $(seq 1 200); do echo "In the beginning God created the heaven and the earth. And the earth was without form."; done > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null
MODEL="--data $T/data/train.bin --seq-len 32 --n-layer 2 --n-embd 64 --n-head 4 --micro-batch 2 --steps 2 --threads 1"
if ! probe=$("$BIN" train $MODEL --device cuda 2>&1); then
  if grep -q "no usable GPU" <<<"$probe"; then echo "SKIP: $probe"; exit 77; fi
  echo "$probe"; exit 1
fi
[ "$GPU_COUNT" -ge 2 ] || { echo "SKIP: $GPU_COUNT GPU visible, 2 needed"; exit 77; }

# 1. mpirun: OMPI_COMM_WORLD_LOCAL_RANK
timeout 300 mpirun -np 2 --oversubscribe "$BIN" train $MODEL --device cuda --comm nccl > "$T/np2.out" 2>&1 \
  || { cat "$T/np2.out"; echo "FAIL: mpirun -np 2 --device cuda --comm nccl"; exit 1; }
for r in 0 1; do
  grep -q "^rank $r: host [^,]*, local rank $r/2, cuda:$r (.*, set before MPI_Init from OMPI_COMM_WORLD_LOCAL_RANK=$r$" "$T/np2.out" \
    || { cat "$T/np2.out"; echo "FAIL: rank $r: not on cuda:$r set before MPI_Init from OMPI_COMM_WORLD_LOCAL_RANK=$r"; exit 1; }
done
if grep -q "warning: rank .* before MPI_Init" "$T/np2.out"; then cat "$T/np2.out"; echo "FAIL: a disagreement warning"; exit 1; fi
echo "1. mpirun -np 2: rank 0 on cuda:0, rank 1 on cuda:1, each set before MPI_Init from OMPI_COMM_WORLD_LOCAL_RANK"

# 2. a launcher whose local rank is not MPI's
LOCAL_RANK=1 timeout 300 "$BIN" train $MODEL --device cuda > "$T/lr1.out" 2>&1 \
  || { cat "$T/lr1.out"; echo "FAIL: LOCAL_RANK=1 train --device cuda"; exit 1; }
want="shardgpt: warning: rank 0: GPU cuda:1 was set before MPI_Init from LOCAL_RANK=1, but MPI's node-local rank 0 of 1 takes cuda:0; training on cuda:0"
[ "$(grep -c "before MPI_Init from LOCAL_RANK=1, but" "$T/lr1.out")" = 1 ] && grep -qF "$want" "$T/lr1.out" \
  || { cat "$T/lr1.out"; echo "FAIL: expected one line: $want ..."; exit 1; }
grep -q "^rank 0: .*, cuda:0 (.*, not cuda:1 set before MPI_Init from LOCAL_RANK=1$" "$T/lr1.out" \
  || { cat "$T/lr1.out"; echo "FAIL: the topology line does not say cuda:0, not cuda:1"; exit 1; }
grep -q "final train loss" "$T/lr1.out" || { cat "$T/lr1.out"; echo "FAIL: LOCAL_RANK=1 did not train"; exit 1; }
echo "2. LOCAL_RANK=1, one process: one warning, trains on MPI's cuda:0"

# 3. --device cpu: nothing set before MPI_Init
LOCAL_RANK=1 timeout 300 "$BIN" train $MODEL --device cpu > "$T/cpu.out" 2>&1 \
  || { cat "$T/cpu.out"; echo "FAIL: LOCAL_RANK=1 train --device cpu"; exit 1; }
if grep -q "before MPI_Init" "$T/cpu.out"; then cat "$T/cpu.out"; echo "FAIL: --device cpu set a GPU"; exit 1; fi
grep -q "final train loss" "$T/cpu.out" || { cat "$T/cpu.out"; echo "FAIL: --device cpu did not train"; exit 1; }
echo "3. --device cpu with LOCAL_RANK=1: no GPU set before MPI_Init, trains"
echo "gpu before mpi ok"
