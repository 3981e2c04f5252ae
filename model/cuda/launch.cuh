// The one way the .cu files launch a kernel and declare dynamic shared memory, so that the same
// source runs on a GPU (nvcc: <<<...>>>) and under the CUDA emulation for tests (host compiler,
// emu/cuda/: the grid is queued on the stream and run by fibers on the CPU).
//
//   SHARDGPT_LAUNCH(kernel, grid, block, shared_bytes, stream)(args...);
//   SHARDGPT_DYNAMIC_SHARED(float, smem);  // extern __shared__ __align__(16) float smem[];
// (16-byte aligned on both: kernels move 128-bit vectors through it; the emulation mallocs it.)
//   SHARDGPT_SHARED(float, shm, [32]);  // __shared__ float shm[32];
//   SHARDGPT_SHARED(__align__(16) uint16_t, tile, [16 * 24]);
// Static shared memory: one declarator per use (the third argument is its extents, empty for a
// scalar). The emulation gives each host thread its own copy, poisoned (0xff bytes) when a block
// first reaches the declaration, so a read before the block's own write sees garbage, as on a
// GPU; a bare __shared__ does not compile there.
#pragma once

#ifdef SHARDGPT_CUDA_EMULATION
#define SHARDGPT_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  ::cuda_emu::MakeLauncher(#kernel, kernel, grid, block, shared_bytes, stream)
#define SHARDGPT_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::cuda_emu::DynamicShared())
#define SHARDGPT_SHARED(type, name, extents) \
  static thread_local type name extents;     \
  ::cuda_emu::PoisonStaticShared(&name, sizeof(name))
#else
#define SHARDGPT_LAUNCH(kernel, grid, block, shared_bytes, stream) kernel<<<grid, block, shared_bytes, stream>>>
#define SHARDGPT_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#define SHARDGPT_SHARED(type, name, extents) __shared__ type name extents
#endif
