#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: build with the CUDA backend, run the `gpu`
# tests (every CUDA kernel, whole-model gradients, loss trajectories, engine stages, resume and
# checkpoint round trips against the CPU backend), then benchmark GPT-2 124M (d12, T=1024,
# bf16) at ZeRO stages 0-3 on one GPU: tokens/s, model TFLOP/s and MFU against the GPU's dense
# bf16 peak; with >= 2 GPUs also every stage on all GPUs over NCCL with its scaling efficiency
# (N ranks vs N x one GPU, measured side by side) and the all-reduce bus bandwidth.
# Writes everything to a report file (default gpu-report.txt, or $OUT/gpu-report.txt).
# Budget: about 8 minutes on one H200 (build ~3, tests ~2, benchmarks ~2).
#   scripts/gpu-check.sh [--skip-build] [--steps N]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
REPORT=${OUT:+$OUT/}gpu-report.txt
STEPS=12
SKIP_BUILD=0
while [ $# -gt 0 ]; do
  case $1 in
    --skip-build) SKIP_BUILD=1 ;;
    --steps) STEPS=$2; shift ;;
    *) echo "gpu-check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
exec > >(tee "$REPORT") 2>&1
echo "== shardgpt gpu-check $(date -u +%FT%TZ) on $(hostname)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,pci.bus_id,memory.total,driver_version --format=csv
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$NVCC" ] || { echo "gpu-check: no nvcc (CUDA toolkit) found"; exit 1; }
if [ $SKIP_BUILD -eq 0 ]; then
  scripts/install-deps.sh || exit 1
  t0=$(date +%s)
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" -DSHARDGPT_BENCH=ON >/dev/null || exit 1
  cmake --build "$BUILD" -j "$(nproc)" --target shardgpt gpu_tests train_gpu_test nccl_gpu_test bench_train bench_comm 2>&1 | grep -E "error|warning: " ; \
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu-check: build failed"; exit 1; }
  echo "== build: $(( $(date +%s) - t0 )) s"
fi
echo "== gpu tests (ctest -L gpu)"
t0=$(date +%s)
(cd "$BUILD" && timeout 300 ctest -L gpu --output-on-failure) ; TESTS_RC=$?
echo "== gpu tests: rc=$TESTS_RC, $(( $(date +%s) - t0 )) s"
echo "== benchmark: d12 (GPT-2 124M), T=1024, B=16, bf16, 1 GPU, $STEPS steps (median after 2 warm-up)"
for stage in 0 1 2 3; do
  timeout 120 "$BUILD/bench/bench_train" --device cuda --config d12 --dtype bf16 --zero-stage $stage --steps "$STEPS"
done
echo "== benchmark: the same in fp32 (TF32 off), stage 0"
timeout 120 "$BUILD/bench/bench_train" --device cuda --config d12 --dtype fp32 --zero-stage 0 --steps "$STEPS"
echo "== 2 ranks sharing the GPU (MPI staging through host memory), d12 B=4, bf16, stage 1"
timeout 120 mpirun -np 2 "$BUILD/bench/bench_train" --device cuda --comm mpi --config d12 --micro-batch 4 --dtype bf16 --zero-stage 1 --steps 6
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 0)
if [ "$GPUS" -ge 2 ]; then
  echo "== multi-GPU: $GPUS GPUs, NCCL, d12 bf16 T=1024 B=16 per rank"
  tps() { grep -o '| [0-9]* tokens/s' | grep -o '[0-9]*'; }
  one=$(timeout 120 "$BUILD/bench/bench_train" --device cuda --config d12 --dtype bf16 --zero-stage 0 --steps "$STEPS" | tee /dev/stderr | tps)
  for stage in 0 1 2 3; do
    all=$(timeout 180 mpirun -np "$GPUS" "$BUILD/bench/bench_train" --device cuda --comm nccl --config d12 --dtype bf16 \
          --zero-stage $stage --steps "$STEPS" | tee /dev/stderr | tps)
    # scaling efficiency, side by side: N ranks vs N x the same per-rank work on one GPU
    [ -n "$one" ] && [ -n "$all" ] && awk -v a="$all" -v o="$one" -v n="$GPUS" -v s="$stage" \
      'BEGIN { printf "stage %d: %d GPUs %.0f tokens/s = %.1f%% of %d x one GPU (%.0f)\n", s, n, a, 100*a/(n*o), n, o }'
  done
  echo "== all-reduce bus bandwidth (nccl-tests' busbw), NCCL, fp32"
  timeout 120 mpirun -np "$GPUS" "$BUILD/bench/bench_comm" --device cuda --comm nccl 64 256
else
  echo "== multi-GPU section skipped: $GPUS GPU(s) visible (needs >= 2)"
fi
echo "== report: $REPORT"
exit $TESTS_RC
