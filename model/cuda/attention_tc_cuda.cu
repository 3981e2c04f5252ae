// Causal multi-head self-attention on bf16 tensor cores, flash-attention-2 style: no [T,T]
// tensor, fp32 softmax statistics in registers, bf16 operands to mma.sync m16n8k16 (mma.cuh).
// CPU twins: attention_forward_bf16 / attention_backward_bf16 (model/kernels_cpu_bf16.h).
//
// Per (b, h), q, k, v, o, dO the [T,hs] slices of that head, scale = 1/sqrt(hs):
//   forward:  for each key tile j (causal: up to the diagonal tile), per query row:
//               S = (bf16(q) bf16(k_j)^T) * scale, masked to key <= query and key < T;
//               m' = max(m, rowmax S);  p = exp(S - m');  l = l e^(m-m') + rowsum p;
//               o = o e^(m-m') + bf16(p) bf16(v_j)
//             then o /= l, lse = m + log l.
//   backward: D_t = dO_t . o_t (fp32, attention_cuda.cu);  P = exp(S - lse);  dP = bf16(dO) bf16(v)^T;
//             dS = P (dP - D);  dq += bf16(dS) bf16(k) * scale;
//             dv += bf16(P)^T bf16(dO);  dk += bf16(dS)^T bf16(q) * scale.
//   Each exp(x) is computed as exp2f(x log2 e), on S, m and lse held in log2 units (kLog2e).
//
// Blocks of kWarps = 4 warps, tiles of kTile = 64 rows (queries or keys): warp w owns the 16
// rows 16w..16w+15 of its block's tile, as the rows of its m16n8k16 A fragments, and meets the
// other side's 64 columns as 8 n-tiles of 8. Kernels:
//   forward   a block per (query tile, b*NH + h), looping over key tiles 0..diagonal;
//   dq        a block per (query tile, bh), looping over key tiles 0..diagonal;
//   dk, dv    a block per (key tile, bh), looping over query tiles diagonal..end.
// Every output element is summed by one thread in a fixed order: no atomics, bitwise
// reproducible. Tiles are loaded to shared memory as bf16 (rows past T as zeros, masked), 8
// elements per thread step (bf16: cp.async; fp32: 128-bit loads, rounded), and the tiles a
// block loops over are double-buffered: the next one loads while this one is used. Rows are
// padded by 8 elements (16 bytes), so that the 8 rows of each ldmatrix (mma.cuh) fall in
// distinct banks. The kernels read and write the activation dtype Act (fp32, or bf16 as raw
// bits) as it is: out and the dqkv sums are rounded to it once, from fp32 (dqkv =
// Act(fp32(dqkv) + gradient)), so bf16 activations need no fp32 scratch and no conversion pass
// (bitwise the fp32 kernels' results rounded, as the CPU twins are).
#include <cmath>
#include <type_traits>

#include "model/cuda/attention_tc.h"
#include "model/cuda/device_util.cuh"
#include "model/cuda/kernels_cuda.h"
#include "model/cuda/launch.cuh"
#include "model/cuda/mma.cuh"

namespace shardgpt {
namespace cuda {

namespace {

constexpr int kTile = 64;
constexpr int kWarps = kTile / 16;
constexpr int kThreads = kWarps * 32;
constexpr int kNT = kTile / 8;  // n-tiles of 8 columns per tile of 64

template <int HS>
constexpr int kLd = HS + 8;  // shared-memory row stride (bf16 elements)

// exp(x) = exp2(x log2 e): the kernels keep scores and lse in log2 units (the scale folded into
// one multiplication by scale log2 e), so that each exponential is one exp2f (the SFU's ex2 and
// a denormal fix-up) instead of expf's range reduction. lse is stored in natural log units.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Starts filling dst (bf16, row stride kLd) with src[(row0 + r) * stride + d] for r < kTile,
// d < HS; rows >= T are 0. Where src and stride keep every row 16-byte aligned (the model's qkv
// and dout do) a thread moves 8 elements per step: bf16 by cp.async, landing at the caller's
// cp_async_wait (device_util.cuh), fp32 by two 128-bit loads, rounded; else one element per
// step. Every thread sees the whole tile after its cp_async_wait and a __syncthreads.
template <int HS, typename Act>
__device__ __forceinline__ void start_tile(uint16_t* dst, const Act* src, int row0, int T, int64_t stride) {
  constexpr int kChunks = HS / kVec;  // 8-element chunks per row
  if (reinterpret_cast<uintptr_t>(src) % 16 == 0 && stride % kVec == 0) {
    for (int i = threadIdx.x; i < kTile * kChunks; i += blockDim.x) {
      const int r = i / kChunks, d = (i - r * kChunks) * kVec, t = row0 + r;
      uint16_t* to = dst + r * kLd<HS> + d;
      if (t >= T) store128(to, bf16x8{});
      else if constexpr (std::is_same_v<Act, uint16_t>) cp_async16(to, src + (int64_t)t * stride + d);
      else {
        float x[kVec];
        load8(x, src + (int64_t)t * stride + d);
        store8(to, x);  // rounded to bf16
      }
    }
    return;
  }
  for (int i = threadIdx.x; i < kTile * HS; i += blockDim.x) {
    const int r = i / HS, d = i - r * HS, t = row0 + r;
    dst[r * kLd<HS> + d] = t < T ? f32_to_bf16(load_f32(src, (size_t)((int64_t)t * stride + d))) : uint16_t{0};
  }
}

// s[8][4] = A (16 rows, HS) x B^T where B's rows are the 64 rows of `tile` (bf16, Ld):
// the 16 x 64 scores of this warp's rows against the tile's rows.
template <int HS>
__device__ __forceinline__ void scores(float s[kNT][4], const uint32_t a[HS / 16][4], const uint16_t* tile) {
  #pragma unroll
  for (int j = 0; j < kNT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
  #pragma unroll
  for (int kk = 0; kk < HS / 16; kk++) {
    #pragma unroll
    for (int j = 0; j < kNT; j += 2) {
      uint32_t b[2][2];
      load_b_nk_x2(b, tile, kLd<HS>, 8 * j, 16 * kk);
      mma_bf16_16816(s[j], a[kk], b[0], s[j]);
      mma_bf16_16816(s[j + 1], a[kk], b[1], s[j + 1]);
    }
  }
}

// acc[HS/8][4] += bf16(p) (16 x 64, accumulator layout) x tile (64 rows x HS, bf16, Ld).
template <int HS>
__device__ __forceinline__ void accumulate_pv(float acc[HS / 8][4], const float p[kNT][4], const uint16_t* tile) {
  #pragma unroll
  for (int kk = 0; kk < kTile / 16; kk++) {
    uint32_t a[4];
    acc_to_a(a, p[2 * kk], p[2 * kk + 1]);
    #pragma unroll
    for (int n = 0; n < HS / 8; n += 2) {
      uint32_t b[2][2];
      load_b_kn_x2(b, tile, kLd<HS>, 16 * kk, 8 * n);
      mma_bf16_16816(acc[n], a, b[0], acc[n]);
      mma_bf16_16816(acc[n + 1], a, b[1], acc[n + 1]);
    }
  }
}

// The A fragments of rows 16*warp.. of `tile` for every k-step of HS.
template <int HS>
__device__ __forceinline__ void load_rows(uint32_t a[HS / 16][4], const uint16_t* tile, int warp) {
  #pragma unroll
  for (int kk = 0; kk < HS / 16; kk++) load_a(a[kk], tile, kLd<HS>, 16 * warp, 16 * kk);
}

// Sum over the 4 lanes of a quad (the lanes holding one accumulator row); all end with the same bits.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(kFullMask, v, 1);
  return v + __shfl_xor_sync(kFullMask, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}

// Tiles in reverse order: the longest (last) query tiles start first, the short ones fill the tail.
__device__ __forceinline__ int tile_index() { return (int)(gridDim.x - 1 - blockIdx.x); }

// ---- forward: a block per (query tile, bh) ----
template <int HS, typename Act>
__global__ void __launch_bounds__(kThreads)
    attention_tc_forward_kernel(Act* out, float* lse, const Act* qkv, int T, int C, int NH, float scale) {
  SHARDGPT_DYNAMIC_SHARED(uint16_t, smem);
  constexpr int kTileElems = kTile * kLd<HS>;
  uint16_t* Qs = smem;
  // double-buffered K, V (addresses computed from buf: an array of two pointers indexed by buf
  // would live in local memory)
  auto Ks = [&](int buf) { return smem + (1 + buf) * kTileElems; };
  auto Vs = [&](int buf) { return smem + (3 + buf) * kTileElems; };
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int q0 = tile_index() * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int64_t C3 = 3 * (int64_t)C;
  const Act* q = qkv + (int64_t)b * T * C3 + h * HS;
  start_tile<HS>(Qs, q, q0, T, C3);
  cp_async_commit();
  start_tile<HS>(Ks(0), q + C, 0, T, C3);
  start_tile<HS>(Vs(0), q + 2 * C, 0, T, C3);
  cp_async_commit();
  cp_async_wait<1>();  // Q
  __syncthreads();
  uint32_t qa[HS / 16][4];
  load_rows<HS>(qa, Qs, warp);

  const int row[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};  // this lane's two rows
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // m in log2 units; l: this lane's partial sums
  const float scale2 = scale * kLog2e;
  float o[HS / 8][4];
  #pragma unroll
  for (int n = 0; n < HS / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  const int q_last = min(q0 + kTile, T) - 1;
  for (int k0 = 0, buf = 0; k0 <= q_last; k0 += kTile, buf ^= 1) {
    if (k0 + kTile <= q_last) {  // the next K, V tiles load while these are used
      start_tile<HS>(Ks(buf ^ 1), q + C, k0 + kTile, T, C3);
      start_tile<HS>(Vs(buf ^ 1), q + 2 * C, k0 + kTile, T, C3);
    }
    cp_async_commit();
    cp_async_wait<1>();  // this tile's K, V (the next ones may still be in flight)
    __syncthreads();
    float s[kNT][4];
    scores<HS>(s, qa, Ks(buf));
    float mx[2] = {-INFINITY, -INFINITY};
    #pragma unroll
    for (int j = 0; j < kNT; j++)
      #pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = k0 + 8 * j + 2 * tq + (e & 1), r = e >> 1;
        s[j][e] = key <= row[r] && key < T ? s[j][e] * scale2 : -INFINITY;
        mx[r] = fmaxf(mx[r], s[j][e]);
      }
    float alpha[2], base[2];
    #pragma unroll
    for (int r = 0; r < 2; r++) {
      const float m_new = fmaxf(m[r], quad_max(mx[r]));
      base[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet: p = 0, no NaN
      alpha[r] = exp2f(m[r] - base[r]);
      m[r] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
    #pragma unroll
    for (int j = 0; j < kNT; j++)
      #pragma unroll
      for (int e = 0; e < 4; e++) {
        s[j][e] = exp2f(s[j][e] - base[e >> 1]);
        sum[e >> 1] += s[j][e];
      }
    #pragma unroll
    for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + sum[r];
    #pragma unroll
    for (int n = 0; n < HS / 8; n++)
      #pragma unroll
      for (int e = 0; e < 4; e++) o[n][e] *= alpha[e >> 1];
    accumulate_pv<HS>(o, s, Vs(buf));
    __syncthreads();  // every warp is done with buf before the next iteration refills it
  }
  #pragma unroll
  for (int r = 0; r < 2; r++) {
    const float lr = quad_sum(l[r]);
    if (row[r] >= T) continue;
    Act* orow = out + ((int64_t)b * T + row[r]) * C + h * HS;
    #pragma unroll
    for (int n = 0; n < HS / 8; n++) {
      store_f32(orow, 8 * n + 2 * tq, o[n][2 * r] / lr);
      store_f32(orow, 8 * n + 2 * tq + 1, o[n][2 * r + 1] / lr);
    }
    if (tq == 0) lse[(int64_t)bh * T + row[r]] = m[r] * kLn2 + logf(lr);
  }
}

// ---- backward, dq: a block per (query tile, bh), looping over key tiles 0..diagonal ----
template <int HS, typename Act>
__global__ void __launch_bounds__(kThreads)
    attention_tc_backward_dq_kernel(Act* dqkv, const Act* dout, const Act* qkv, const float* lse, const float* Dg,
                                    int T, int C, int NH, float scale) {
  SHARDGPT_DYNAMIC_SHARED(uint16_t, smem);
  constexpr int kTileElems = kTile * kLd<HS>;
  uint16_t* Qs = smem;
  uint16_t* dOs = smem + kTileElems;
  auto Ks = [&](int buf) { return smem + (2 + buf) * kTileElems; };  // double-buffered
  auto Vs = [&](int buf) { return smem + (4 + buf) * kTileElems; };
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int q0 = tile_index() * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int64_t C3 = 3 * (int64_t)C;
  const float scale2 = scale * kLog2e;
  const Act* q = qkv + (int64_t)b * T * C3 + h * HS;
  start_tile<HS>(Qs, q, q0, T, C3);
  start_tile<HS>(dOs, dout + (int64_t)b * T * C + h * HS, q0, T, C);
  cp_async_commit();
  start_tile<HS>(Ks(0), q + C, 0, T, C3);
  start_tile<HS>(Vs(0), q + 2 * C, 0, T, C3);
  cp_async_commit();
  cp_async_wait<1>();  // Q, dO
  __syncthreads();
  uint32_t qa[HS / 16][4], da[HS / 16][4];
  load_rows<HS>(qa, Qs, warp);
  load_rows<HS>(da, dOs, warp);
  const int row[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};
  float lse2[2], D_r[2];  // this lane's rows' lse (log2 units) and D
  #pragma unroll
  for (int r = 0; r < 2; r++) {
    lse2[r] = row[r] < T ? lse[(int64_t)bh * T + row[r]] * kLog2e : 0.0f;
    D_r[r] = row[r] < T ? Dg[(int64_t)bh * T + row[r]] : 0.0f;
  }
  float dq[HS / 8][4];
  #pragma unroll
  for (int n = 0; n < HS / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

  const int q_last = min(q0 + kTile, T) - 1;
  for (int k0 = 0, buf = 0; k0 <= q_last; k0 += kTile, buf ^= 1) {
    if (k0 + kTile <= q_last) {  // the next K, V tiles load while these are used
      start_tile<HS>(Ks(buf ^ 1), q + C, k0 + kTile, T, C3);
      start_tile<HS>(Vs(buf ^ 1), q + 2 * C, k0 + kTile, T, C3);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    float s[kNT][4], dp[kNT][4];
    scores<HS>(s, qa, Ks(buf));   // q k^T
    scores<HS>(dp, da, Vs(buf));  // dO v^T
    #pragma unroll
    for (int j = 0; j < kNT; j++)
      #pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = k0 + 8 * j + 2 * tq + (e & 1), r = e >> 1;
        const float p = key <= row[r] && key < T && row[r] < T ? exp2f(s[j][e] * scale2 - lse2[r]) : 0.0f;
        s[j][e] = p * (dp[j][e] - D_r[r]);  // dS
      }
    accumulate_pv<HS>(dq, s, Ks(buf));  // dq += dS k
    __syncthreads();  // every warp is done with buf before the next iteration refills it
  }
  #pragma unroll
  for (int r = 0; r < 2; r++) {
    if (row[r] >= T) continue;
    Act* dqrow = dqkv + ((int64_t)b * T + row[r]) * C3 + h * HS;
    #pragma unroll
    for (int n = 0; n < HS / 8; n++)
      #pragma unroll
      for (int e = 0; e < 2; e++) add_f32(dqrow, 8 * n + 2 * tq + e, dq[n][2 * r + e] * scale);
  }
}

// ---- backward, dk and dv: a block per (key tile, bh), looping over query tiles diagonal..end.
// The warp's rows are keys: S^T = k q^T, dP^T = v dO^T, so P^T and dS^T are A fragments. ----
template <int HS, typename Act>
__global__ void __launch_bounds__(kThreads)
    attention_tc_backward_dkv_kernel(Act* dqkv, const Act* dout, const Act* qkv, const float* lse, const float* Dg,
                                     int T, int C, int NH, float scale) {
  SHARDGPT_DYNAMIC_SHARED(uint16_t, smem);
  constexpr int kTileElems = kTile * kLd<HS>;
  uint16_t* Ks = smem;
  uint16_t* Vs = smem + kTileElems;
  auto Qs = [&](int buf) { return smem + (2 + buf) * kTileElems; };  // double-buffered
  auto dOs = [&](int buf) { return smem + (4 + buf) * kTileElems; };
  float* const stats = reinterpret_cast<float*>(smem + 6 * kTileElems);
  auto ls = [&](int buf) { return stats + buf * kTile; };        // lse of the query tile (log2 units)
  auto Ds = [&](int buf) { return stats + (2 + buf) * kTile; };  // D of the query tile
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int k0 = (int)blockIdx.x * kTile;  // the first key tiles have the most query tiles: first
  const float scale2 = scale * kLog2e;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int64_t C3 = 3 * (int64_t)C;
  const Act* q = qkv + (int64_t)b * T * C3 + h * HS;
  const Act* dO = dout + (int64_t)b * T * C + h * HS;
  // The query tile q0's Q, dO (by cp.async where they can) and lse, D (stored) into buffer buf.
  auto start_query_tile = [&](int q0, int buf) {
    start_tile<HS>(Qs(buf), q, q0, T, C3);
    start_tile<HS>(dOs(buf), dO, q0, T, C);
    for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
      const int t = q0 + i;
      ls(buf)[i] = t < T ? lse[(int64_t)bh * T + t] * kLog2e : 0.0f;
      Ds(buf)[i] = t < T ? Dg[(int64_t)bh * T + t] : 0.0f;
    }
  };
  start_tile<HS>(Ks, q + C, k0, T, C3);
  start_tile<HS>(Vs, q + 2 * C, k0, T, C3);
  cp_async_commit();
  start_query_tile(k0, 0);
  cp_async_commit();
  cp_async_wait<1>();  // K, V
  __syncthreads();
  uint32_t ka[HS / 16][4], va[HS / 16][4];
  load_rows<HS>(ka, Ks, warp);
  load_rows<HS>(va, Vs, warp);
  const int key[2] = {k0 + 16 * warp + g, k0 + 16 * warp + g + 8};
  float dk[HS / 8][4], dv[HS / 8][4];
  #pragma unroll
  for (int n = 0; n < HS / 8; n++)
    #pragma unroll
    for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;

  for (int q0 = k0, buf = 0; q0 < T; q0 += kTile, buf ^= 1) {
    if (q0 + kTile < T) start_query_tile(q0 + kTile, buf ^ 1);  // loads while this one is used
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    float p[kNT][4], ds[kNT][4];
    scores<HS>(p, ka, Qs(buf));    // k q^T
    scores<HS>(ds, va, dOs(buf));  // v dO^T
    #pragma unroll
    for (int j = 0; j < kNT; j++)
      #pragma unroll
      for (int e = 0; e < 4; e++) {
        const int c = 8 * j + 2 * tq + (e & 1), t = q0 + c, s = key[e >> 1];
        const float pv = s <= t && t < T && s < T ? exp2f(p[j][e] * scale2 - ls(buf)[c]) : 0.0f;
        p[j][e] = pv;
        ds[j][e] = pv * (ds[j][e] - Ds(buf)[c]);
      }
    accumulate_pv<HS>(dv, p, dOs(buf));  // dv += P^T dO
    accumulate_pv<HS>(dk, ds, Qs(buf));  // dk += dS^T q
    __syncthreads();  // every warp is done with buf before the next iteration refills it
  }
  #pragma unroll
  for (int r = 0; r < 2; r++) {
    if (key[r] >= T) continue;
    Act* dkrow = dqkv + ((int64_t)b * T + key[r]) * C3 + C + h * HS;
    Act* dvrow = dkrow + C;
    #pragma unroll
    for (int n = 0; n < HS / 8; n++)
      #pragma unroll
      for (int e = 0; e < 2; e++) {
        add_f32(dkrow, 8 * n + 2 * tq + e, dk[n][2 * r + e] * scale);
        add_f32(dvrow, 8 * n + 2 * tq + e, dv[n][2 * r + e]);
      }
  }
}

template <typename Kernel>
void AllowSharedMemory(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    SHARDGPT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <int HS>
constexpr size_t TileBytes() { return sizeof(uint16_t) * kTile * kLd<HS>; }

template <int HS, typename Act>
void Forward(Act* out, float* lse, const Act* qkv, int B, int T, int C, int NH, float scale, cudaStream_t stream) {
  const dim3 grid((T + kTile - 1) / kTile, B * NH);
  const size_t smem = 5 * TileBytes<HS>();  // Q, two K, two V
  auto* attention_tc_forward = &attention_tc_forward_kernel<HS, Act>;  // (a template-id has commas)
  AllowSharedMemory(attention_tc_forward, smem);
  SHARDGPT_LAUNCH(attention_tc_forward, grid, kThreads, smem, stream)(out, lse, qkv, T, C, NH, scale);
  SHARDGPT_CUDA_CHECK_LAUNCH("attention_tc_forward_kernel");
}

template <int HS, typename Act>
void Backward(Act* dqkv, const Act* dout, const Act* qkv, const float* lse, const float* D, int B, int T, int C,
              int NH, float scale, cudaStream_t stream) {
  const dim3 grid((T + kTile - 1) / kTile, B * NH);
  const size_t smem_dq = 6 * TileBytes<HS>();  // Q, dO, two K, two V (dkv: K, V, two Q, two dO)
  auto* attention_tc_backward_dq = &attention_tc_backward_dq_kernel<HS, Act>;
  AllowSharedMemory(attention_tc_backward_dq, smem_dq);
  SHARDGPT_LAUNCH(attention_tc_backward_dq, grid, kThreads, smem_dq, stream)(dqkv, dout, qkv, lse, D, T, C, NH, scale);
  SHARDGPT_CUDA_CHECK_LAUNCH("attention_tc_backward_dq_kernel");
  const size_t smem_dkv = smem_dq + 4 * sizeof(float) * kTile;  // + two lse, two D
  auto* attention_tc_backward_dkv = &attention_tc_backward_dkv_kernel<HS, Act>;
  AllowSharedMemory(attention_tc_backward_dkv, smem_dkv);
  SHARDGPT_LAUNCH(attention_tc_backward_dkv, grid, kThreads, smem_dkv, stream)(dqkv, dout, qkv, lse, D, T, C, NH,
                                                                                scale);
  SHARDGPT_CUDA_CHECK_LAUNCH("attention_tc_backward_dkv_kernel");
}

}  // namespace

void AttentionForwardTc(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, float scale,
                        cudaStream_t stream) {
  if (C / NH == 64) Forward<64>(out, lse, qkv, B, T, C, NH, scale, stream);
  else Forward<128>(out, lse, qkv, B, T, C, NH, scale, stream);
}
void AttentionForwardTc(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T, int C, int NH, float scale,
                        cudaStream_t stream) {
  if (C / NH == 64) Forward<64>(out, lse, qkv, B, T, C, NH, scale, stream);
  else Forward<128>(out, lse, qkv, B, T, C, NH, scale, stream);
}

void AttentionBackwardTc(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* D, int B,
                         int T, int C, int NH, float scale, cudaStream_t stream) {
  if (C / NH == 64) Backward<64>(dqkv, dout, qkv, lse, D, B, T, C, NH, scale, stream);
  else Backward<128>(dqkv, dout, qkv, lse, D, B, T, C, NH, scale, stream);
}
void AttentionBackwardTc(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const float* lse, const float* D,
                         int B, int T, int C, int NH, float scale, cudaStream_t stream) {
  if (C / NH == 64) Backward<64>(dqkv, dout, qkv, lse, D, B, T, C, NH, scale, stream);
  else Backward<128>(dqkv, dout, qkv, lse, D, B, T, C, NH, scale, stream);
}

}  // namespace cuda
}  // namespace shardgpt
