// The one way the .cu files launch a kernel and declare dynamic shared memory, so that the same
// source runs on a GPU (nvcc: <<<...>>>) and under the CUDA emulation for tests (host compiler,
// emu/cuda/: the grid is queued on the stream and run by fibers on the CPU).
//
//   SHARDGPT_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...);
//   SHARDGPT_DYNAMIC_SHARED(float, smem);  // extern __shared__ __align__(16) float smem[];
// (16-byte aligned on both: kernels move 128-bit vectors through it; the emulation mallocs it.)
#pragma once

#ifdef SHARDGPT_CUDA_EMULATION
#define SHARDGPT_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  ::cuda_emu::MakeLauncher(#kernel, kernel, grid, block, shared_bytes, stream)
#define SHARDGPT_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::cuda_emu::DynamicShared())
#else
#define SHARDGPT_LAUNCH(kernel, grid, block, shared_bytes, stream) kernel<<<grid, block, shared_bytes, stream>>>
#define SHARDGPT_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#endif
