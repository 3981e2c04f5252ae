// One warp's mma_bf16_16816 (model/cuda/mma.cuh) with its fragments placed three ways; see
// mma_test_kernels.h.
#include "tests/gpu/mma_test_kernels.h"

#include <cuda_runtime.h>

#include "model/cuda/launch.cuh"
#include "model/cuda/mma.cuh"

namespace shardgpt {
namespace mma_test {
namespace {

// A 16x16, B 16x8 ([k][n]), C 16x8, D 16x8, all row-major in global memory; one block of 32.
__global__ void mma_test_kernel(float* D, const uint16_t* A, const uint16_t* B, const float* C, int source) {
  SHARDGPT_SHARED(__align__(16) uint16_t, sa, [16 * 24]);  // leading dimension 24 (padded, a multiple of 8)
  SHARDGPT_SHARED(__align__(16) uint16_t, sb, [16 * 24]);
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  uint32_t a[4], b[2];
  if (source == 0) {
    // The PTX ISA's "Matrix Fragments for mma.m16n8k16 with floating point type", element by element.
    auto A_ = [&](int r, int c) { return A[r * 16 + c]; };
    auto B_ = [&](int k, int n) { return B[k * 8 + n]; };
    a[0] = cuda::pack_bf16(A_(g, 2 * t), A_(g, 2 * t + 1));
    a[1] = cuda::pack_bf16(A_(g + 8, 2 * t), A_(g + 8, 2 * t + 1));
    a[2] = cuda::pack_bf16(A_(g, 2 * t + 8), A_(g, 2 * t + 9));
    a[3] = cuda::pack_bf16(A_(g + 8, 2 * t + 8), A_(g + 8, 2 * t + 9));
    b[0] = cuda::pack_bf16(B_(2 * t, g), B_(2 * t + 1, g));
    b[1] = cuda::pack_bf16(B_(2 * t + 8, g), B_(2 * t + 9, g));
  } else {
    // B goes to n-tile `hi` of a 16-column shared tile; the other n-tile holds bf16 NaNs, so
    // a loader that hands back the wrong one of its two fragments poisons D.
    const bool kn = source == static_cast<int>(Source::kLoadBkn) || source == static_cast<int>(Source::kLoadBknHi);
    const int hi = source == static_cast<int>(Source::kLoadBknHi) || source == static_cast<int>(Source::kLoadBnkHi);
    for (int i = lane; i < 16 * 16; i += 32) sa[(i / 16) * 24 + i % 16] = A[i];
    for (int i = lane; i < 16 * 24; i += 32) sb[i] = 0xffff;
    __syncthreads();
    for (int i = lane; i < 16 * 8; i += 32) {
      const int k = i / 8, n = i % 8 + 8 * hi;
      if (kn) sb[k * 24 + n] = B[i];  // [k][n]
      else sb[n * 24 + k] = B[i];     // [n][k]
    }
    __syncthreads();
    cuda::load_a(a, sa, 24, 0, 0);
    uint32_t pair[2][2];
    if (kn) cuda::load_b_kn_x2(pair, sb, 24, 0, 0);
    else cuda::load_b_nk_x2(pair, sb, 24, 0, 0);
    b[0] = pair[hi][0], b[1] = pair[hi][1];
  }
  const float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
  float d[4];
  cuda::mma_bf16_16816(d, a, b, c);
  D[g * 8 + 2 * t] = d[0];
  D[g * 8 + 2 * t + 1] = d[1];
  D[(g + 8) * 8 + 2 * t] = d[2];
  D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

std::string Error(cudaError_t e) { return e == cudaSuccess ? "" : std::string(cudaGetErrorString(e)); }

}  // namespace

std::string RunMma(Source source, const uint16_t* A, const uint16_t* B, const float* C, float* D) {
  uint16_t *dA = nullptr, *dB = nullptr;
  float *dC = nullptr, *dD = nullptr;
  cudaError_t e = cudaMalloc(&dA, 256 * 2);
  if (e == cudaSuccess) e = cudaMalloc(&dB, 128 * 2);
  if (e == cudaSuccess) e = cudaMalloc(&dC, 128 * 4);
  if (e == cudaSuccess) e = cudaMalloc(&dD, 128 * 4);
  if (e == cudaSuccess) e = cudaMemcpy(dA, A, 256 * 2, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(dB, B, 128 * 2, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaMemcpy(dC, C, 128 * 4, cudaMemcpyHostToDevice);
  if (e == cudaSuccess) {
    SHARDGPT_LAUNCH(mma_test_kernel, 1, 32, 0, nullptr)(dD, dA, dB, dC, static_cast<int>(source));
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(D, dD, 128 * 4, cudaMemcpyDeviceToHost);
  cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD);
  return Error(e);
}

}  // namespace mma_test
}  // namespace shardgpt
