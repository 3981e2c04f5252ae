// Device-side helpers shared by the .cu files of model/cuda/: reductions with a fixed order,
// bf16 conversion bit-identical to base/bf16.h, launch sizes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

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

// Rows per partial sum of the deterministic column reductions (layernorm dw/db, matmul dbias):
// a fixed number, so the reduction tree depends only on the problem size.
constexpr int kRowsPerChunk = 256;

// Blocks for a grid-stride loop over n elements (capped; the loop covers the rest).
inline unsigned GridFor(size_t n, int threads) {
  const size_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(blocks, size_t{1} << 20)));
}

}  // namespace cuda

// dst[i] += sum_k partial[k*stride + i], k = 0..chunks-1 in order, for i < width (one thread per
// i). Defined in kernels_cuda.cu; matmul_cuda.cu launches it for the bias gradient.
__global__ void add_chunk_sums_kernel(float* dst, const float* partial, int chunks, int stride, int width);

}  // namespace shardgpt
