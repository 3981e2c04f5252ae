#!/usr/bin/env bash
# End to end through the executable with --device cuda (a GPU, or the CUDA emulation of a
# build-emu/ build): a tiny model on 1 and 2 ranks, --comm nccl and --comm mpi, ZeRO stages 0-3,
# against --device cpu on the same data and flags:
#   fp32: every step's loss within 1e-4 of the CPU run's (stages 0-3 on 1 and 2 ranks);
#   bf16 (--dtype bf16): within 2e-2, the band of tests/gpu/train_gpu_test.cc; also with
#   --gelu fused (CUDA: the GELU in cuBLASLt's epilogues; the CPU: their twins);
#   HSDP (4 ranks, 2 shard groups of 2) at stages 2 and 3 over NCCL: within 1e-4;
#   a checkpoint written by a CUDA run resumes on the CPU and one written on the CPU resumes on
#   CUDA: the resumed steps' losses within 1e-4 of the uninterrupted CPU run's;
#   a token id outside the vocabulary in the data file is refused before it reaches the device.
# Where fewer GPUs than ranks are visible (one GPU), the multi-rank cases run over --comm mpi
# (ranks sharing the GPU) instead of nccl, and say so.
# Exits 77 (skipped) where `--device cuda` has no GPU.
set -euo pipefail
BIN=$1
source "$(dirname "$0")/lib/gpu_count.sh"  # GPU_COUNT, gpu_comm: --comm mpi where ranks share a GPU
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for i in $(seq 1 200); do echo "In the beginning God created the heaven and the earth. And the earth was without form."; done > "$T/text.txt"
"$BIN" prepare --input "$T/text.txt" --output "$T/data" >/dev/null
GELU=
MODEL="--data $T/data/train.bin --seq-len 32 --n-layer 2 --n-embd 64 --n-head 4 --lr 3e-3 --seed 3 --quiet --threads 1"
if ! probe=$("$BIN" train $MODEL --micro-batch 2 --steps 1 --device cuda 2>&1); then
  if grep -q "no usable GPU" <<<"$probe"; then echo "SKIP: $probe"; exit 77; fi
  echo "$probe"; exit 1
fi

train() {  # train NP LOG [flags]
  local np=$1 log=$2; shift 2
  timeout 600 mpirun -np "$np" --oversubscribe "$BIN" train $MODEL --steps 4 --log "$log" "$@" >"$log.out" 2>&1 ||
    { echo "FAIL: mpirun -np $np train $* (log $log.out):"; cat "$log.out"; exit 1; }
}
compare() {  # compare A.jsonl B.jsonl TOL WHAT [FIRST_STEP]
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
a = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[1]))}
b = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[2]))}
tol, what = float(sys.argv[3]), sys.argv[4]
first = int(sys.argv[5]) if len(sys.argv) > 5 else 1
steps = [s for s in sorted(a) if s >= first]
assert steps and all(s in b for s in steps), (what, sorted(a), sorted(b))
worst = max(abs(a[s] - b[s]) for s in steps)
assert worst <= tol, "%s: max |loss diff| %.3g > %.3g: %s vs %s" % (what, worst, tol, [a[s] for s in steps], [b[s] for s in steps])
print("%-44s max |loss - cpu| = %.2e over %d steps" % (what, worst, len(steps)))
PY
}

# fp32: every stage on 1 and 2 ranks over NCCL, stages 0 and 3 on 2 ranks over MPI; bf16:
# stages 0 and 3 on 2 ranks over NCCL. 2 micro-batches of 2 sequences per rank and step.
run_case() {  # run_case DTYPE NP STAGE COMM...
  local dtype=$1 np=$2 stage=$3; shift 3
  local tol=1e-4; [ "$dtype" = bf16 ] && tol=2e-2
  local F="--micro-batch 2 --grad-accum 2 --zero-stage $stage --dtype $dtype $GELU"
  local tag="${dtype}_${np}_${stage// /_}${GELU:+_fused}"
  train "$np" "$T/cpu_$tag.jsonl" $F --device cpu
  local comms=() c
  for c in "$@"; do [ "$c" = nccl ] && c=$(gpu_comm "$np"); [[ " ${comms[*]} " == *" $c "* ]] || comms+=("$c"); done
  for comm in "${comms[@]}"; do
    train "$np" "$T/cuda_${tag}_$comm.jsonl" $F --device cuda --comm "$comm"
    compare "$T/cuda_${tag}_$comm.jsonl" "$T/cpu_$tag.jsonl" $tol "$dtype np=$np stage=$stage --comm $comm $GELU"
  done
}
[ "$GPU_COUNT" -ge 4 ] || echo "$GPU_COUNT GPU(s) visible: the cases of more ranks than GPUs run over --comm mpi"
for stage in 0 1 2 3; do run_case fp32 1 $stage nccl; done
for stage in 0 3; do run_case fp32 2 $stage nccl mpi; done
for stage in 1 2; do run_case fp32 2 $stage nccl; done
for stage in 0 3; do run_case bf16 2 $stage nccl; done
# --gelu fused: cuBLASLt's GELU epilogues against their CPU twins (bf16 storage: the fc bias is a
# stored bf16 value, so the forward has its GELU_AUX_BIAS epilogue too)
GELU="--gelu fused"
for stage in 0 3; do run_case bf16 2 $stage nccl; done
GELU=
# HSDP: 4 ranks in 2 shard groups of 2 (shard and replica NCCL communicators on one stream).
for stage in 2 3; do run_case fp32 4 "$stage --shard-group-size 2" nccl; done

# Checkpoints across devices: CUDA saves at step 2, the CPU resumes (and the reverse).
F="--micro-batch 2 --grad-accum 2 --zero-stage 1"
train 2 "$T/ref.jsonl" $F --device cpu
train 2 "$T/g1.jsonl" $F --device cuda --comm "$(gpu_comm 2)" --ckpt-dir "$T/ck_gpu" --stop-at-step 2
train 2 "$T/g2.jsonl" $F --device cpu --ckpt-dir "$T/ck_gpu" --resume latest
compare "$T/g2.jsonl" "$T/ref.jsonl" 1e-4 "CUDA checkpoint resumed on the CPU" 3
train 2 "$T/c1.jsonl" $F --device cpu --ckpt-dir "$T/ck_cpu" --stop-at-step 2
train 2 "$T/c2.jsonl" $F --device cuda --comm "$(gpu_comm 2)" --ckpt-dir "$T/ck_cpu" --resume latest
compare "$T/c2.jsonl" "$T/ref.jsonl" 1e-4 "CPU checkpoint resumed on CUDA" 3

# A token id the model's vocabulary does not have never reaches the device: the data loader
# (the one path that feeds ids to --device cuda; `sample` runs on the CPU) refuses byte 101 ('e')
# for a 100-token vocabulary, with its one error line, before the model exists.
if out=$("$BIN" train $MODEL --micro-batch 2 --steps 1 --device cuda --vocab-size 100 2>&1); then
  echo "FAIL: a token outside the vocabulary was accepted"; exit 1
fi
grep -q "out of range (expected < vocab_size 100)" <<<"$out" || { echo "FAIL: unexpected error: $out"; exit 1; }
echo "out-of-vocabulary data refused: $(grep error <<<"$out" | head -1)"
echo "train_cuda: all comparisons passed"
