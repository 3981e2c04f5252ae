// Device-side helpers shared by the .cu files of model/cuda/: reductions with a fixed order,
// bf16 conversion bit-identical to base/bf16.h, launch sizes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#ifdef SHARDGPT_CUDA_EMULATION
#include "cuda_emu.h"
#endif

namespace shardgpt {
namespace cuda {

constexpr unsigned kFullMask = 0xffffffffu;

// Butterfly sum over the 32 lanes. Deterministic, and every lane ends with the same bits: at
// each step lanes i and i^o add the same two values (addition commutes).
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum / max over a block of blockDim.x threads (a multiple of 32, at most 1024): warp
// butterflies, then every thread adds the per-warp results in warp order. shm: 32 slots.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* shm) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // shm may still be read by a previous call
  if (lane == 0) shm[warp] = v;
  __syncthreads();
  T s = shm[0];
  for (int w = 1; w < nwarps; w++) s += shm[w];
  return s;
}
__device__ __forceinline__ float block_max(float v, float* shm) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shm[warp] = v;
  __syncthreads();
  float m = shm[0];
  for (int w = 1; w < nwarps; w++) m = fmaxf(m, shm[w]);
  return m;
}

// bf16 as raw bits (base/bf16.h). Widening is exact. Narrowing is __float2bfloat16_rn (round
// to nearest even, overflow to inf, denormals kept); NaN keeps its sign and top payload bits
// with the quiet bit set, exactly like FloatToBf16 on the host (cvt.rn.bf16 would return the
// canonical NaN), so GPU and CPU conversions agree bit for bit on every input.
__device__ __forceinline__ float bf16_to_f32(uint16_t bits) { return __uint_as_float(uint32_t{bits} << 16); }
__device__ __forceinline__ uint16_t f32_to_bf16(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
__device__ __forceinline__ float load_f32(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float load_f32(const uint16_t* p, size_t i) { return bf16_to_f32(p[i]); }
__device__ __forceinline__ void store_f32(float* p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_f32(uint16_t* p, size_t i, float v) { p[i] = f32_to_bf16(v); }
// p[i] = p[i] + v in fp32, rounded to p's dtype once (bf16: RNE, as store_f32).
template <typename T>
__device__ __forceinline__ void add_f32(T* p, size_t i, float v) { store_f32(p, i, load_f32(p, i) + v); }

// ---- 128-bit loads and stores (the element-wise kernels) ----
// Packed128<T>: 16 bytes, 4 floats or 8 bf16 (raw bits), moved with one 128-bit access
// (ld.global.v4 / st.global.v4): a quarter of the memory instructions of scalar fp32 loads.
// The address must be 16-byte aligned: a GPU faults on a misaligned vector access
// ("misaligned address"), and the emulation stops the run naming the kernel, block and thread
// (cuda_emu::CheckVectorAccess). Callers check Aligned16 on the host and otherwise take the
// scalar path.
template <typename T>
struct alignas(16) Packed128 {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};
using f32x4 = Packed128<float>;
using bf16x8 = Packed128<uint16_t>;

template <typename T>
__device__ __forceinline__ Packed128<T> load128(const T* p) {
#ifdef SHARDGPT_CUDA_EMULATION
  cuda_emu::CheckVectorAccess(p, 16, "load128");
#endif
  return *reinterpret_cast<const Packed128<T>*>(p);
}
template <typename T>
__device__ __forceinline__ void store128(T* p, const Packed128<T>& x) {
#ifdef SHARDGPT_CUDA_EMULATION
  cuda_emu::CheckVectorAccess(p, 16, "store128");
#endif
  *reinterpret_cast<Packed128<T>*>(p) = x;
}

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- cp.async (sm_80 and later): 16 bytes from global to shared memory, asynchronously ----
// cp_async16 starts a copy (both addresses 16-byte aligned); cp_async_commit closes this
// thread's group of started copies; cp_async_wait<N>() returns when at most N of its newer
// groups are still in flight. A copy is visible to other threads only after the copier's wait
// and a barrier. cp.async.cg caches in L2 only (the tile is read once per block). The emulation
// lands a block's copies either at their wait (the latest a GPU may) or at once (the earliest),
// drawn per block (cuda_emu::CpAsync16).
__device__ __forceinline__ void cp_async16(void* shared_dst, const void* global_src) {
#ifdef SHARDGPT_CUDA_EMULATION
  cuda_emu::CpAsync16(shared_dst, global_src);
#else
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global_src));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef SHARDGPT_CUDA_EMULATION
  cuda_emu::CpAsyncCommit();
#else
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef SHARDGPT_CUDA_EMULATION
  cuda_emu::CpAsyncWait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Elements per vector step of the element-wise kernels: 8, one 128-bit access of bf16 or two
// of fp32, so mixed fp32/bf16 kernels (convert, accumulate) move whole vectors on both sides.
constexpr int kVec = 8;
// x[0..8) = p[0..8) as floats (p 16-byte aligned).
__device__ __forceinline__ void load8(float x[kVec], const float* p) {
  const f32x4 a = load128(p), b = load128(p + 4);
  for (int j = 0; j < 4; j++) x[j] = a.v[j], x[4 + j] = b.v[j];
}
__device__ __forceinline__ void load8(float x[kVec], const uint16_t* p) {
  const bf16x8 a = load128(p);
  for (int j = 0; j < kVec; j++) x[j] = bf16_to_f32(a.v[j]);
}
// p[0..8) = x[0..8) (bf16: RNE, as store_f32).
__device__ __forceinline__ void store8(float* p, const float x[kVec]) {
  f32x4 a, b;
  for (int j = 0; j < 4; j++) a.v[j] = x[j], b.v[j] = x[4 + j];
  store128(p, a);
  store128(p + 4, b);
}
__device__ __forceinline__ void store8(uint16_t* p, const float x[kVec]) {
  bf16x8 a;
  for (int j = 0; j < kVec; j++) a.v[j] = f32_to_bf16(x[j]);
  store128(p, a);
}

// The grid-stride loop of an element-wise kernel over n elements: with `vec` (every pointer
// 16-byte aligned, checked by the caller), vec_op(i) for each whole group of kVec elements at
// i = 0, 8, 16, ..., then scalar_op(i) for the tail; without, scalar_op(i) for every i. The
// grid is GridFor(vec ? n / kVec + 1 : n, threads) (VecGrid). Each element gets the same
// expression on either path, so the results do not depend on the alignment.
template <typename VecOp, typename ScalarOp>
__device__ __forceinline__ void elementwise(size_t n, bool vec, VecOp vec_op, ScalarOp scalar_op) {
  const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  const size_t nv = vec ? n / kVec * kVec : 0;
  for (size_t i = tid * kVec; i < nv; i += stride * kVec) vec_op(i);
  for (size_t i = nv + tid; i < n; i += stride) scalar_op(i);
}

// Rows per partial sum of the deterministic column reductions (layernorm dw/db, matmul dbias):
// a fixed number, so the reduction tree depends only on the problem size.
constexpr int kRowsPerChunk = 256;

// Blocks for a grid-stride loop over n elements (capped; the loop covers the rest).
inline unsigned GridFor(size_t n, int threads) {
  const size_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(blocks, size_t{1} << 20)));
}

inline unsigned VecGrid(size_t n, bool vec, int threads) { return GridFor(vec ? n / kVec + 1 : n, threads); }

}  // namespace cuda

// dst[i] += sum_k partial[k*stride + i], k = 0..chunks-1 in order, for i < width (one thread per
// i). Defined in kernels_cuda.cu; matmul_cuda.cu launches it for the bias gradient.
__global__ void add_chunk_sums_kernel(float* dst, const float* partial, int chunks, int stride, int width);

}  // namespace shardgpt
