// CUDA kernels of the Llama block (--arch llama): RMSNorm, rotary embeddings, SwiGLU and the
// grouped-query key/value sharing, forward next to backward, each a template over the activation
// storage A (float, or uint16_t: bf16 bits; widened on load, rounded to nearest even once on
// store, as the CPU twins). CPU twins, maths and contracts: model/kernels_cpu_llama.h (same
// names); backward kernels accumulate (+=) except rope_backward, which rotates in place.
//
// Where a GPU result may differ from the twin's (the tests' tolerances, tests/gpu/llama_gpu_test.cc):
//   RMSNorm sums x^2 in fp32 (a warp butterfly; the twin sums in double) and 1/sqrt in fp32;
//   RoPE's cosf / sinf may differ from glibc's by an ulp (powf likewise); the angle and
//   inv_freq are the twin's fp32 expressions;
//   SwiGLU uses expf (the twin exp_fast, a 2-ulp polynomial).
// kv_repeat moves stored bits (forward) and sums a group's gradients in fp32 in head order, then
// adds once (backward): the twin's operations in the twin's order, so bitwise equal.
// Determinism: no atomics; the RMSNorm weight gradient goes through per-chunk partials added in
// chunk order (as LayerNorm's, kernels_cuda.cu).
#include <cmath>

#include "model/cuda/device_util.cuh"
#include "model/cuda/kernels_cuda.h"
#include "model/cuda/launch.cuh"

namespace shardgpt {

namespace {

constexpr int kThreads = 256;  // threads per block; row kernels: one warp per row, 8 rows a block
constexpr int kRowsPerBlock = kThreads / 32;
using cuda::GridFor;
using cuda::kRowsPerChunk;
using cuda::load_f32;
using cuda::store_f32;

// The grid-stride loop over [0, n).
#define SHARDGPT_GRID_STRIDE(i, n) \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// ----------------------------------------------------------------------------------------------
// RMSNorm. CPU twins: rmsnorm_forward / rmsnorm_backward.
//   rstd = 1 / sqrt(mean(x^2) + eps),  y = x rstd w
// One warp per row; the sums are warp butterflies in fp32 (the twin's sum of squares: double).
//
// A lane's part of a row: the groups of kVec = 8 columns starting at 8 lane, 8 lane + 256, ...,
// each column in order. With vec (C % 8 == 0 and every row 16-byte aligned, checked on the
// host) a group moves as one load8 / store8 (128-bit accesses), else column by column (the
// row's last group may be short). Each lane adds the same values in the same order either way,
// so the results do not depend on the alignment.

// v[0..m) = p[i0..i0+m), m = min(8, C - i0) (8 with vec); returns m.
template <typename A>
__device__ __forceinline__ int load_group(float v[cuda::kVec], const A* p, int i0, int C, bool vec) {
  if (vec) {
    cuda::load8(v, p + i0);
    return cuda::kVec;
  }
  const int m = min(cuda::kVec, C - i0);
  for (int j = 0; j < m; j++) v[j] = load_f32(p, i0 + j);
  return m;
}
template <typename A>
__device__ __forceinline__ void store_group(A* p, const float v[cuda::kVec], int i0, int m, bool vec) {
  if (vec) cuda::store8(p + i0, v);
  else
    for (int j = 0; j < m; j++) store_f32(p, i0 + j, v[j]);
}

template <typename A>
__global__ void rmsnorm_forward_kernel(A* out, float* rstd, const A* inp, const float* w, int N, int C, float eps,
                                       bool vec) {
  const int lane = threadIdx.x % 32;
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  if (n >= N) return;
  const A* x = inp + (size_t)n * C;
  A* y = out + (size_t)n * C;
  float v[cuda::kVec], ss = 0.0f;
  for (int i0 = lane * cuda::kVec; i0 < C; i0 += 32 * cuda::kVec) {
    const int m = load_group(v, x, i0, C, vec);
    for (int j = 0; j < m; j++) ss += v[j] * v[j];
  }
  const float r = 1.0f / sqrtf(cuda::warp_sum(ss) / C + eps);
  for (int i0 = lane * cuda::kVec; i0 < C; i0 += 32 * cuda::kVec) {
    const int m = load_group(v, x, i0, C, vec);
    for (int j = 0; j < m; j++) v[j] = v[j] * r * w[i0 + j];
    store_group(y, v, i0, m, vec);
  }
  if (lane == 0) rstd[n] = r;
}

// g = dout w:  dinp += rstd (g - x rstd^2 mean(g x))  (the row part; dw is the next kernel).
template <typename A>
__global__ void rmsnorm_backward_dinp_kernel(A* dinp, const A* dout, const A* inp, const float* w,
                                             const float* rstd, int N, int C, bool vec) {
  const int lane = threadIdx.x % 32;
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
  if (n >= N) return;
  const A* x = inp + (size_t)n * C;
  const A* d = dout + (size_t)n * C;
  A* dx = dinp + (size_t)n * C;
  const float r = rstd[n];
  float xv[cuda::kVec], dv[cuda::kVec], gv[cuda::kVec], gx = 0.0f;
  for (int i0 = lane * cuda::kVec; i0 < C; i0 += 32 * cuda::kVec) {
    const int m = load_group(xv, x, i0, C, vec);
    load_group(dv, d, i0, C, vec);
    for (int j = 0; j < m; j++) gx += w[i0 + j] * dv[j] * xv[j];
  }
  const float k = r * r * (cuda::warp_sum(gx) / C);
  for (int i0 = lane * cuda::kVec; i0 < C; i0 += 32 * cuda::kVec) {
    const int m = load_group(xv, x, i0, C, vec);
    load_group(dv, d, i0, C, vec);
    load_group(gv, dx, i0, C, vec);
    for (int j = 0; j < m; j++) gv[j] = gv[j] + r * (w[i0 + j] * dv[j] - xv[j] * k);
    store_group(dx, gv, i0, m, vec);
  }
}

// partial[chunk][c] = sum over the chunk's rows (kRowsPerChunk, blockIdx.y) of dout x rstd, for
// 32 columns (blockIdx.x). Block (32, 8): thread (x, y) sums rows y, y+8, ... in order, then
// row y = 0 adds the 8 sums in order. dw += the chunks in order (add_chunk_sums_kernel).
template <typename A>
__global__ void rmsnorm_backward_partial_kernel(float* partial, const A* dout, const A* inp, const float* rstd,
                                                int N, int C) {
  SHARDGPT_SHARED(float, sdw, [8][33]);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * 32 + tx;
  const int n0 = blockIdx.y * kRowsPerChunk, n1 = min(N, n0 + kRowsPerChunk);
  float dw = 0.0f;
  if (c < C)
    for (int n = n0 + ty; n < n1; n += 8) dw += load_f32(dout, (size_t)n * C + c) * load_f32(inp, (size_t)n * C + c) * rstd[n];
  sdw[ty][tx] = dw;
  __syncthreads();
  if (ty == 0 && c < C) {
    float s = 0.0f;
    for (int k = 0; k < 8; k++) s += sdw[k][tx];
    partial[(size_t)blockIdx.y * C + c] = s;
  }
}

// ----------------------------------------------------------------------------------------------
// RoPE (rotate-half), in place on the NH query and KV key heads of qkv[B*T, W], W = (NH+2KV) hs.
// CPU twins: rope_forward / rope_backward. For i < hs/2, a = float(t) inv_freq[i],
// inv_freq[i] = 1 / theta^(float(2i) / hs), all fp32 (as the twin and transformers):
//   x'[i] = x[i] cos a - x[i+hs/2] sin a;   x'[i+hs/2] = x[i+hs/2] cos a + x[i] sin a
// Backward (sign = -1) rotates by -a (the transpose), in place: writes, no accumulation.
// One thread per (row, i): cos and sin once, then every query and key head of the row.
template <typename A>
__global__ void rope_kernel(A* qkv, int T, int heads, int W, int hs, float theta, float sign, size_t total) {
  const int h2 = hs / 2;
  SHARDGPT_GRID_STRIDE(e, total) {
    const size_t n = e / h2;
    const int i = (int)(e - n * h2), t = (int)(n % T);
    const float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)hs);
    const float a = (float)t * inv_freq;
    const float c = cosf(a), s = sign * sinf(a);  // exact: sign is +-1
    A* row = qkv + n * W;
    for (int h = 0; h < heads; h++) {
      const size_t lo = (size_t)h * hs + i, hi = lo + h2;
      const float x0 = load_f32(row, lo), x1 = load_f32(row, hi);
      store_f32(row, lo, x0 * c - x1 * s);
      store_f32(row, hi, x1 * c + x0 * s);
    }
  }
}

// ----------------------------------------------------------------------------------------------
// SwiGLU on gate_up[N, 2F] (gate: columns [0, F), up: [F, 2F)). CPU twins: swiglu_forward /
// swiglu_backward.
//   out[n,j] = silu(g) u = g / (1 + exp(-g)) u   (writes out[N, F])
// With vec (F % 8 == 0 and every pointer 16-byte aligned, checked on the host) 8 columns move
// as one 128-bit group (cuda::elementwise); each element gets the same expression either way.
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

template <typename A>
__global__ void swiglu_forward_kernel(A* out, const A* gate_up, int F, size_t total, bool vec) {
  cuda::elementwise(
      total, vec,
      [&](size_t e) {
        const size_t n = e / F, gi = e + n * F;  // gate_up column e - nF of row n
        float g[cuda::kVec], u[cuda::kVec];
        cuda::load8(g, gate_up + gi);
        cuda::load8(u, gate_up + gi + F);
        for (int j = 0; j < cuda::kVec; j++) g[j] = silu_mul(g[j], u[j]);
        cuda::store8(out + e, g);
      },
      [&](size_t e) {
        const size_t gi = e + e / F * F;
        store_f32(out, e, silu_mul(load_f32(gate_up, gi), load_f32(gate_up, gi + F)));
      });
}

// s = sigmoid(g):  dgate += dout u s (1 + g (1 - s));  dup += dout g s
__device__ __forceinline__ void swiglu_grad(float& dg, float& du, float g, float u, float d) {
  const float s = 1.0f / (1.0f + expf(-g));
  dg = dg + d * u * s * (1.0f + g * (1.0f - s));
  du = du + d * g * s;
}

template <typename A>
__global__ void swiglu_backward_kernel(A* dgate_up, const A* gate_up, const A* dout, int F, size_t total, bool vec) {
  cuda::elementwise(
      total, vec,
      [&](size_t e) {
        const size_t gi = e + e / F * F;
        float g[cuda::kVec], u[cuda::kVec], d[cuda::kVec], dg[cuda::kVec], du[cuda::kVec];
        cuda::load8(g, gate_up + gi);
        cuda::load8(u, gate_up + gi + F);
        cuda::load8(d, dout + e);
        cuda::load8(dg, dgate_up + gi);
        cuda::load8(du, dgate_up + gi + F);
        for (int j = 0; j < cuda::kVec; j++) swiglu_grad(dg[j], du[j], g[j], u[j], d[j]);
        cuda::store8(dgate_up + gi, dg);
        cuda::store8(dgate_up + gi + F, du);
      },
      [&](size_t e) {
        const size_t gi = e + e / F * F;
        float dg = load_f32(dgate_up, gi), du = load_f32(dgate_up, gi + F);
        swiglu_grad(dg, du, load_f32(gate_up, gi), load_f32(gate_up, gi + F), load_f32(dout, e));
        store_f32(dgate_up, gi, dg);
        store_f32(dgate_up, gi + F, du);
      });
}

// ----------------------------------------------------------------------------------------------
// kv_repeat. CPU twins: kv_repeat_forward / kv_repeat_backward. C = NH hs, G = NH / KV.
//   out[n] = [q | k of kv head h/G for each query head h | v likewise]   (out[N, 3C]; writes)
// One thread per output element; a copy of the stored bits (exact at either dtype).
template <typename A>
__global__ void kv_repeat_forward_kernel(A* out, const A* qkv, int C, int KV, int G, int hs, size_t total) {
  const int W = C + 2 * KV * hs;
  SHARDGPT_GRID_STRIDE(e, total) {
    const size_t n = e / (3 * (size_t)C);
    const int c = (int)(e - n * 3 * C), part = c / C, in = c - part * C;  // part: 0 q, 1 k, 2 v
    const int src = part == 0 ? in : C + ((part - 1) * KV + in / hs / G) * hs + in % hs;
    out[e] = qkv[n * W + src];
  }
}

// dqkv[n, q] += dout[n, q];  dqkv[n, kv head j] += the sum of its group's query heads' dk / dv
// (fp32, in head order from the first, then added once). One thread per dqkv element.
template <typename A>
__global__ void kv_repeat_backward_kernel(A* dqkv, const A* dout, int C, int KV, int G, int hs, size_t total) {
  const int W = C + 2 * KV * hs;
  SHARDGPT_GRID_STRIDE(e, total) {
    const size_t n = e / W;
    const int c = (int)(e - n * W);
    const A* d = dout + n * 3 * C;
    if (c < C) {
      store_f32(dqkv, e, load_f32(dqkv, e) + load_f32(d, c));
      continue;
    }
    const int part = (c - C) / (KV * hs), r = (c - C) - part * KV * hs, j = r / hs, i = r % hs;
    const A* g0 = d + (size_t)(1 + part) * C + (size_t)j * G * hs + i;  // the group's first head
    float acc = load_f32(g0, 0);
    for (int g = 1; g < G; g++) acc += load_f32(g0, (size_t)g * hs);
    store_f32(dqkv, e, load_f32(dqkv, e) + acc);
  }
}

#undef SHARDGPT_GRID_STRIDE

}  // namespace

// ----------------------------------------------------------------------------------------------
// CudaKernels' Llama kernels (model/kernels.h): launches on the compute stream, never waiting.

void CudaKernels::rmsnorm_forward(void* out, float* rstd, const void* inp, const float* w, int N, int C,
                                  float eps) const {
  if (N == 0) return;
  Bind();
  const bool vec = C % cuda::kVec == 0 && cuda::Aligned16(out) && cuda::Aligned16(inp);
  WithAct([&](auto t) {
    using A = decltype(t);
    SHARDGPT_LAUNCH(rmsnorm_forward_kernel<A>, (N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, stream_)(
        static_cast<A*>(out), rstd, static_cast<const A*>(inp), w, N, C, eps, vec);
  });
  SHARDGPT_CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel");
}

// dinp: one warp per row. dw: per-chunk partials (fixed chunks of kRowsPerChunk rows), then one
// thread per column adds the chunks in order.
void CudaKernels::rmsnorm_backward(void* dinp, float* dw, const void* dout, const void* inp, const float* w,
                                   const float* rstd, int N, int C) const {
  if (N == 0 || C == 0) return;
  Bind();
  const int chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  float* partial = static_cast<float*>(Scratch(sizeof(float) * chunks * C));
  const bool vec = C % cuda::kVec == 0 && cuda::Aligned16(dinp) && cuda::Aligned16(dout) && cuda::Aligned16(inp);
  WithAct([&](auto t) {
    using A = decltype(t);
    const A *d = static_cast<const A*>(dout), *x = static_cast<const A*>(inp);
    SHARDGPT_LAUNCH(rmsnorm_backward_dinp_kernel<A>, (N + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, stream_)(
        static_cast<A*>(dinp), d, x, w, rstd, N, C, vec);
    SHARDGPT_CUDA_CHECK_LAUNCH("rmsnorm_backward_dinp_kernel");
    SHARDGPT_LAUNCH(rmsnorm_backward_partial_kernel<A>, dim3((C + 31) / 32, chunks), dim3(32, 8), 0, stream_)(
        partial, d, x, rstd, N, C);
    SHARDGPT_CUDA_CHECK_LAUNCH("rmsnorm_backward_partial_kernel");
  });
  SHARDGPT_LAUNCH(add_chunk_sums_kernel, (C + kThreads - 1) / kThreads, kThreads, 0, stream_)(dw, partial, chunks, C, C);
  SHARDGPT_CUDA_CHECK_LAUNCH("add_chunk_sums_kernel");
}

void CudaKernels::rope_forward(void* qkv, int B, int T, int NH, int KV, int hs, float theta) const {
  const size_t total = (size_t)B * T * (hs / 2);
  if (total == 0) return;
  Bind();
  WithAct([&](auto t) {
    using A = decltype(t);
    SHARDGPT_LAUNCH(rope_kernel<A>, GridFor(total, kThreads), kThreads, 0, stream_)(
        static_cast<A*>(qkv), T, NH + KV, (NH + 2 * KV) * hs, hs, theta, 1.0f, total);
  });
  SHARDGPT_CUDA_CHECK_LAUNCH("rope_kernel");
}

void CudaKernels::rope_backward(void* dqkv, int B, int T, int NH, int KV, int hs, float theta) const {
  const size_t total = (size_t)B * T * (hs / 2);
  if (total == 0) return;
  Bind();
  WithAct([&](auto t) {
    using A = decltype(t);
    SHARDGPT_LAUNCH(rope_kernel<A>, GridFor(total, kThreads), kThreads, 0, stream_)(
        static_cast<A*>(dqkv), T, NH + KV, (NH + 2 * KV) * hs, hs, theta, -1.0f, total);
  });
  SHARDGPT_CUDA_CHECK_LAUNCH("rope_kernel");
}

void CudaKernels::swiglu_forward(void* out, const void* gate_up, int N, int F) const {
  const size_t total = (size_t)N * F;
  if (total == 0) return;
  Bind();
  const bool vec = F % cuda::kVec == 0 && cuda::Aligned16(out) && cuda::Aligned16(gate_up);
  WithAct([&](auto t) {
    using A = decltype(t);
    SHARDGPT_LAUNCH(swiglu_forward_kernel<A>, cuda::VecGrid(total, vec, kThreads), kThreads, 0, stream_)(
        static_cast<A*>(out), static_cast<const A*>(gate_up), F, total, vec);
  });
  SHARDGPT_CUDA_CHECK_LAUNCH("swiglu_forward_kernel");
}

void CudaKernels::swiglu_backward(void* dgate_up, const void* gate_up, const void* dout, int N, int F) const {
  const size_t total = (size_t)N * F;
  if (total == 0) return;
  Bind();
  const bool vec = F % cuda::kVec == 0 && cuda::Aligned16(dgate_up) && cuda::Aligned16(gate_up) &&
                   cuda::Aligned16(dout);
  WithAct([&](auto t) {
    using A = decltype(t);
    SHARDGPT_LAUNCH(swiglu_backward_kernel<A>, cuda::VecGrid(total, vec, kThreads), kThreads, 0, stream_)(
        static_cast<A*>(dgate_up), static_cast<const A*>(gate_up), static_cast<const A*>(dout), F, total, vec);
  });
  SHARDGPT_CUDA_CHECK_LAUNCH("swiglu_backward_kernel");
}

void CudaKernels::kv_repeat_forward(void* out, const void* qkv, int N, int NH, int KV, int hs) const {
  const size_t total = (size_t)N * 3 * NH * hs;
  if (total == 0) return;
  Bind();
  WithAct([&](auto t) {
    using A = decltype(t);
    SHARDGPT_LAUNCH(kv_repeat_forward_kernel<A>, GridFor(total, kThreads), kThreads, 0, stream_)(
        static_cast<A*>(out), static_cast<const A*>(qkv), NH * hs, KV, NH / KV, hs, total);
  });
  SHARDGPT_CUDA_CHECK_LAUNCH("kv_repeat_forward_kernel");
}

void CudaKernels::kv_repeat_backward(void* dqkv, const void* dout, int N, int NH, int KV, int hs) const {
  const size_t total = (size_t)N * (NH + 2 * KV) * hs;
  if (total == 0) return;
  Bind();
  WithAct([&](auto t) {
    using A = decltype(t);
    SHARDGPT_LAUNCH(kv_repeat_backward_kernel<A>, GridFor(total, kThreads), kThreads, 0, stream_)(
        static_cast<A*>(dqkv), static_cast<const A*>(dout), NH * hs, KV, NH / KV, hs, total);
  });
  SHARDGPT_CUDA_CHECK_LAUNCH("kv_repeat_backward_kernel");
}

}  // namespace shardgpt
