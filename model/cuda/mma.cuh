// The bf16 tensor-core product of one warp, mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32,
// on registers, and the loads of its fragments from shared memory (ldmatrix). Used by the tensor-core
// attention (attention_tc_cuda.cu).
//
//   D[16,8] = A[16,16] B[16,8] + C[16,8]      A, B bf16; C, D fp32
//
// Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), for
// lane l of the warp, g = l / 4 (groupID), t = l % 4 (threadID_in_group); each .b32 register
// holds two bf16, the lower column/row index in its low 16 bits:
//   A (4 regs):  a0 = A[g  ][2t, 2t+1]    a1 = A[g+8][2t, 2t+1]
//                a2 = A[g  ][2t+8, 2t+9]  a3 = A[g+8][2t+8, 2t+9]
//   B (2 regs):  b0 = B[2t, 2t+1][g]      b1 = B[2t+8, 2t+9][g]
//   C, D (4 fp32): c0 = C[g][2t]  c1 = C[g][2t+1]  c2 = C[g+8][2t]  c3 = C[g+8][2t+1]
// The C layout of two adjacent n-tiles (columns 16j..16j+15) is the A layout of one k-step:
// a score tile S = Q K^T kept in registers feeds P V without going through shared memory.
//
// Under nvcc this is the PTX instruction (sm_80 and later). Under the CUDA emulation it is
// computed from the same layout: every lane gathers the A rows g, g+8 and the B columns 2t, 2t+1
// it needs from the lanes that hold them with __shfl_sync (all 32 lanes must call it, as on a
// GPU), then sums c + sum_k a_k b_k in fp32 in k order. Products of two bf16 values are exact
// in fp32; the hardware's internal summation order and rounding are not documented, so GPU and
// emulation may differ in the last bits of D, not in which elements meet which.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "model/cuda/device_util.cuh"

namespace shardgpt {
namespace cuda {

// Two bf16 (as raw bits) in one .b32 register: lo in bits 0..15.
__device__ __forceinline__ uint32_t pack_bf16(uint16_t lo, uint16_t hi) { return uint32_t{lo} | (uint32_t{hi} << 16); }
__device__ __forceinline__ uint32_t pack_f32_as_bf16(float lo, float hi) {
  return pack_bf16(f32_to_bf16(lo), f32_to_bf16(hi));
}

#ifdef SHARDGPT_CUDA_EMULATION
__device__ __forceinline__ float bf16_lo(uint32_t r) { return bf16_to_f32(static_cast<uint16_t>(r & 0xffffu)); }
__device__ __forceinline__ float bf16_hi(uint32_t r) { return bf16_to_f32(static_cast<uint16_t>(r >> 16)); }
#endif

// d = a b + c (d may alias c).
__device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
#ifdef SHARDGPT_CUDA_EMULATION
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // Row g of A is a0 (cols 2j, 2j+1) and a2 (cols 2j+8, 2j+9) of lanes 4g+j; row g+8 is a1, a3.
  float ar0[16], ar1[16], bc0[16], bc1[16];
  const uint64_t a01 = uint64_t{a[0]} | (uint64_t{a[1]} << 32), a23 = uint64_t{a[2]} | (uint64_t{a[3]} << 32);
  for (int j = 0; j < 4; j++) {
    const uint64_t x = __shfl_sync(kFullMask, a01, 4 * g + j), y = __shfl_sync(kFullMask, a23, 4 * g + j);
    const uint32_t x0 = (uint32_t)x, x1 = (uint32_t)(x >> 32), y0 = (uint32_t)y, y1 = (uint32_t)(y >> 32);
    ar0[2 * j] = bf16_lo(x0), ar0[2 * j + 1] = bf16_hi(x0), ar0[2 * j + 8] = bf16_lo(y0), ar0[2 * j + 9] = bf16_hi(y0);
    ar1[2 * j] = bf16_lo(x1), ar1[2 * j + 1] = bf16_hi(x1), ar1[2 * j + 8] = bf16_lo(y1), ar1[2 * j + 9] = bf16_hi(y1);
  }
  // Column n of B is b0 (rows 2j, 2j+1) and b1 (rows 2j+8, 2j+9) of lanes 4n+j.
  const uint64_t b01 = uint64_t{b[0]} | (uint64_t{b[1]} << 32);
  for (int j = 0; j < 4; j++) {
    const uint64_t x = __shfl_sync(kFullMask, b01, 4 * (2 * t) + j);
    const uint64_t y = __shfl_sync(kFullMask, b01, 4 * (2 * t + 1) + j);
    const uint32_t x0 = (uint32_t)x, x1 = (uint32_t)(x >> 32), y0 = (uint32_t)y, y1 = (uint32_t)(y >> 32);
    bc0[2 * j] = bf16_lo(x0), bc0[2 * j + 1] = bf16_hi(x0), bc0[2 * j + 8] = bf16_lo(x1), bc0[2 * j + 9] = bf16_hi(x1);
    bc1[2 * j] = bf16_lo(y0), bc1[2 * j + 1] = bf16_hi(y0), bc1[2 * j + 8] = bf16_lo(y1), bc1[2 * j + 9] = bf16_hi(y1);
  }
  float d0 = c[0], d1 = c[1], d2 = c[2], d3 = c[3];
  for (int k = 0; k < 16; k++) {
    d0 += ar0[k] * bc0[k];  // exact products, fp32 sums in k order
    d1 += ar0[k] * bc1[k];
    d2 += ar1[k] * bc0[k];
    d3 += ar1[k] * bc1[k];
  }
  d[0] = d0, d[1] = d1, d[2] = d2, d[3] = d3;
#else
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "mma.sync m16n8k16 bf16 needs sm_80 or later (CMAKE_CUDA_ARCHITECTURES)"
#endif
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
#endif
}

// ---- fragment loads from shared memory: ldmatrix, four 8x8 b16 matrices per instruction ----
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (PTX ISA, "Warp-level matrix load
// instruction: ldmatrix"; sm_75 and later): lane 8i + j supplies the address of row j of matrix
// i (8 contiguous bf16, 16-byte aligned); lane l = 4g + t receives in r[i] the pair
//   row g, columns 2t, 2t+1 of matrix i          (plain: exactly an A/B fragment register), or
//   rows 2t, 2t+1 of column g of matrix i        (.trans: the matrix read column-major).
// One instruction instead of 4 (A) or 8 (two B fragments of [k][n] data, 16-bit each) shared
// loads per lane. Under the emulation every lane gathers the row addresses it needs from the
// lanes that supplied them with __shfl_sync, as the hardware does, and each address is checked
// for 16-byte alignment (a GPU faults on a misaligned one).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const uint16_t* row) {
#ifdef SHARDGPT_CUDA_EMULATION
  cuda_emu::CheckVectorAccess(row, 16, "ldmatrix");
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint64_t mine = reinterpret_cast<uintptr_t>(row);
  auto row_of = [&](int src) { return reinterpret_cast<const uint16_t*>(__shfl_sync(kFullMask, mine, src)); };
  for (int i = 0; i < 4; i++) {
    if (kTrans) {
      const uint16_t *r0 = row_of(8 * i + 2 * t), *r1 = row_of(8 * i + 2 * t + 1);
      r[i] = pack_bf16(r0[g], r1[g]);
    } else {
      const uint16_t* rg = row_of(8 * i + g);
      r[i] = pack_bf16(rg[2 * t], rg[2 * t + 1]);
    }
  }
#else
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}

// s holds bf16 bits, row-major with leading dimension ld (a multiple of 8, so that every row of
// every 8x8 matrix starts 16-byte aligned; s itself 16-byte aligned). (r0, c0): the fragment's
// first row / column in s. Lane l = 8i + j addresses row j of matrix i.

// A[r][c] = s[(r0 + r) * ld + c0 + c]: matrices (rows, cols) 0: (r0, c0) 1: (r0+8, c0)
// 2: (r0, c0+8) 3: (r0+8, c0+8) are a0..a3.
__device__ __forceinline__ void load_a(uint32_t a[4], const uint16_t* s, int ld, int r0, int c0) {
  const int lane = threadIdx.x % 32, i = lane / 8, j = lane % 8;
  ldmatrix_x4<false>(a, s + (r0 + j + 8 * (i & 1)) * ld + c0 + 8 * (i >> 1));
}
// The B fragments of n-tiles n0 and n0 + 8 (b[0], b[1]) for the k-step at k0, where
// B[k][n] = s[(n + .) * ld + k0 + k] (B^T stored row-major, e.g. K for S = Q K^T): matrices
// (rows n, cols k) 0: (n0, k0) 1: (n0, k0+8) 2: (n0+8, k0) 3: (n0+8, k0+8).
__device__ __forceinline__ void load_b_nk_x2(uint32_t b[2][2], const uint16_t* s, int ld, int n0, int k0) {
  const int lane = threadIdx.x % 32, i = lane / 8, j = lane % 8;
  uint32_t r[4];
  ldmatrix_x4<false>(r, s + (n0 + j + 8 * (i >> 1)) * ld + k0 + 8 * (i & 1));
  b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}
// The same where B[k][n] = s[(k0 + k) * ld + n + .] (B stored row-major, e.g. V for O = P V):
// transposed loads of matrices (rows k, cols n) 0: (k0, n0) 1: (k0+8, n0) 2: (k0, n0+8)
// 3: (k0+8, n0+8).
__device__ __forceinline__ void load_b_kn_x2(uint32_t b[2][2], const uint16_t* s, int ld, int k0, int n0) {
  const int lane = threadIdx.x % 32, i = lane / 8, j = lane % 8;
  uint32_t r[4];
  ldmatrix_x4<true>(r, s + (k0 + j + 8 * (i & 1)) * ld + n0 + 8 * (i >> 1));
  b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}

// The A fragment of k-step j from the fp32 accumulators of n-tiles 2j and 2j+1 (rounded to bf16).
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float lo[4], const float hi[4]) {
  a[0] = pack_f32_as_bf16(lo[0], lo[1]);
  a[1] = pack_f32_as_bf16(lo[2], lo[3]);
  a[2] = pack_f32_as_bf16(hi[0], hi[1]);
  a[3] = pack_f32_as_bf16(hi[2], hi[3]);
}

}  // namespace cuda
}  // namespace shardgpt
