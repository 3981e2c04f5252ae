// Test access to the bf16 tensor-core primitive (model/cuda/mma.cuh) on the current GPU (or the
// CUDA emulation): one warp computes D[16,8] = A[16,16] B[16,8] + C[16,8]. Used by
// tests/gpu/attention_gpu_test.cc; the kernel lives in mma_test_kernels.cu.
#pragma once

#include <cstdint>
#include <string>

namespace shardgpt {
namespace mma_test {

// How the kernel gets its fragments.
//   kRegisters: each lane builds its registers from global memory by the PTX ISA layout, written
//               out in the test kernel (independently of mma.cuh's loaders);
//   kLoadBkn:   A, B copied to shared memory, load_a and load_b_kn_x2 (B stored [k][n]) as the
//               first of its two n-tiles; kLoadBknHi as the second;
//   kLoadBnk:   A, B^T copied to shared memory, load_a and load_b_nk_x2 (B stored [n][k]) as the
//               first n-tile; kLoadBnkHi as the second.
enum class Source { kRegisters, kLoadBkn, kLoadBnk, kLoadBknHi, kLoadBnkHi };

// A: 16x16 bf16 bits row-major; B: 16x8 bf16 bits row-major ([k][n]); C, D: 16x8 fp32 row-major.
// Returns "" or the CUDA error.
std::string RunMma(Source source, const uint16_t* A, const uint16_t* B, const float* C, float* D);

}  // namespace mma_test
}  // namespace shardgpt
