#!/usr/bin/env bash
# The CUDA backend's tests on a machine without a GPU (part of scripts/test.sh, so of CI): the
# same model/cuda/*.cu and parallel/nccl/*.cc sources compiled by the host compiler against the
# CUDA emulation (emu/cuda/, -DSHARDGPT_CUDA_EMULATION=ON) into BUILD_EMU (default build-emu/),
# then every test labelled gpu-emu: the emulation's own tests, tests/gpu/ (kernels against their
# CPU twins, NCCL against MPI, whole training runs), tests/e2e_gpu/ (shardgpt train --device
# cuda) and, as root, the Slurm GPU template (tests/slurm/gpu.sh). Extra arguments go to ctest.
# Nothing here runs on, or says anything about the speed of, a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_EMU:-build-emu}
scripts/install-deps.sh
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSHARDGPT_CUDA_EMULATION=ON -DSHARDGPT_BENCH=ON >/dev/null
# Only what the gpu-emu tests run (the CPU suite is scripts/test.sh's main build).
cmake --build "$BUILD" -j "$(nproc)" --target shardgpt gpu_tests train_gpu_test nccl_gpu_test runtime_emu_test \
  cublaslt_emu_test mma_layout_emu_test nccl_emu_test overlap_emu_test recompute_test bench_train
cd "$BUILD" && ctest --output-on-failure --timeout 1200 -j "${SHARDGPT_TEST_JOBS:-$(nproc)}" -L gpu-emu "$@"
# The kernel tests again under other emulation seeds (the seed draws the block order, whether a
# block's warps run in step or ahead, and where cp.async copies land): two fixed seeds and one
# drawn and printed, so that a failure names the seed that replays it
# (SHARDGPT_CUDA_EMU_SEED=N ctest -L gpu-emu -R ...). SHARDGPT_EMU_SEEDS replaces the list.
seeds=${SHARDGPT_EMU_SEEDS:-"2 3 $((RANDOM * 32768 + RANDOM + 4))"}
[ $# -eq 0 ] || seeds=""  # a filtered run (extra ctest arguments) runs its tests once
for seed in $seeds; do
  echo "test-emu: the kernel tests under SHARDGPT_CUDA_EMU_SEED=$seed"
  SHARDGPT_CUDA_EMU_SEED=$seed ctest --output-on-failure --timeout 600 -j "${SHARDGPT_TEST_JOBS:-$(nproc)}" \
    -L gpu-emu -R '^(GpuTest|TcAttentionTest|Precision/GpuBf16Act|Fragments/MmaTest|MmaLayout)' ||
    { echo "test-emu: FAILED under SHARDGPT_CUDA_EMU_SEED=$seed"; exit 1; }
done
