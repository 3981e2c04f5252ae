// CUDA kernels of the GPT forward and backward pass and of the engine (fp32 maths, bf16 storage
// where asked), in the style of llm.c's train_gpt2.cu: forward next to backward, one small
// kernel per step. The matmuls are in matmul_cuda.cu, attention in attention_cuda.cu.
// The twins and the maths of every kernel: model/kernels_cpu.h; determinism: kernels_cuda.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "model/cuda/device_util.cuh"
#include "model/cuda/launch.cuh"
#include "model/cuda/kernels_cuda.h"
#include "model/device.h"

namespace shardgpt {

// ----------------------------------------------------------------------------------------------
// errors

namespace cuda {

namespace {
std::string CallName(const char* call) {
  std::string s(call);
  const size_t paren = s.find('(');
  if (paren != std::string::npos) s.resize(paren);
  const size_t colon = s.rfind("::");  // "::shardgpt::..." and "cuda::" prefixes
  if (colon != std::string::npos) s.erase(0, colon + 2);
  return s;
}
}  // namespace

std::string ErrorText(cudaError_t e) {
  return std::string(cudaGetErrorString(e)) + " (" + cudaGetErrorName(e) + ", " + std::to_string((int)e) + ")";
}

void ThrowCudaError(const char* call, cudaError_t e) {
  throw std::runtime_error("CUDA: " + CallName(call) + ": " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) +
                           ")");
}

std::string CublasText(cublasStatus_t s) {
  return std::string(cublasLtGetStatusString(s)) + " (" + cublasLtGetStatusName(s) + ")";
}

void ThrowCublasError(const char* call, cublasStatus_t s) {
  throw std::runtime_error("CUDA: " + CallName(call) + ": " + CublasText(s));
}

}  // namespace cuda

using cuda::GridFor;

namespace {

constexpr int kThreads = 256;  // threads per block of the element-wise and row kernels
using cuda::kRowsPerChunk;
// The model kernels are templates over the activation storage A (float, or uint16_t: bf16
// bits): ld widens (exact), st rounds to nearest even (cuda::f32_to_bf16, bitwise the CPU's
// FloatToBf16); all maths between them is fp32, as in the CPU twins' bf16 overloads.
using cuda::load_f32;
using cuda::store_f32;

// ----------------------------------------------------------------------------------------------
// encoder. CPU twins: encoder_forward / encoder_backward.

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
template <typename A>
__global__ void encoder_forward_kernel(A* out, const int32_t* tokens, const float* wte, const float* wpe,
                                       int T, int C, size_t total) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    const size_t n = i / C;
    const int c = (int)(i - n * C), t = (int)(n % T);
    store_f32(out, i, wte[(size_t)tokens[n] * C + c] + wpe[(size_t)t * C + c]);
  }
}

// The embedding backward without the host: positions sorted by token on the device, stably
// (increasing n within a token), then one block row per run of equal tokens adds the run's
// rows in that order. No atomics; the same additions in the same order as the CPU twin (which
// adds rows in increasing n), so dwte is bitwise equal.
//
// sorted[r] = n, r = #{m : (tokens[m], m) < (tokens[n], n)}: n's rank in the stable sort. One
// thread per n compares against every m (tiles of the tokens in shared memory): O(N^2) integer
// compares, ~2.7e8 for N = 16k, well under a millisecond on a GPU, and no scan or atomics.
__global__ void encoder_sort_kernel(int32_t* sorted, const int32_t* tokens, int N) {
  SHARDGPT_SHARED(int32_t, tile, [256]);
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  const int32_t tn = n < N ? tokens[n] : 0;
  int r = 0;
  for (int m0 = 0; m0 < N; m0 += blockDim.x) {
    __syncthreads();  // the previous tile is read by every thread
    if (m0 + (int)threadIdx.x < N) tile[threadIdx.x] = tokens[m0 + threadIdx.x];
    __syncthreads();
    const int cnt = min((int)blockDim.x, N - m0);
    for (int j = 0; j < cnt; j++) {
      const int32_t tm = tile[j];
      r += (tm < tn) || (tm == tn && m0 + j < n);
    }
  }
  if (n < N) sorted[r] = n;
}

// dwte[tok,:] += dout[n,:] over the run of sorted positions with token tok, in sorted (= n)
// order: block x = a sorted index, the run's head does the run, the others return.
template <typename A>
__global__ void encoder_backward_wte_kernel(float* dwte, const A* dout, const int32_t* tokens,
                                            const int32_t* sorted, int N, int C) {
  const int i = blockIdx.x;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int32_t tok = tokens[sorted[i]];
  if (i > 0 && tokens[sorted[i - 1]] == tok) return;  // not the head of its run
  float* dw = dwte + (size_t)tok * C + c;
  float acc = *dw;
  for (int j = i; j < N && tokens[sorted[j]] == tok; j++) acc += load_f32(dout, (size_t)sorted[j] * C + c);
  *dw = acc;
}

// dwpe[t,:] += sum_b dout[b,t,:], b in increasing order (one thread per (t, c)).
template <typename A>
__global__ void encoder_backward_wpe_kernel(float* dwpe, const A* dout, int B, int T, int C) {
  const size_t total = (size_t)T * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    float acc = dwpe[i];
    for (int b = 0; b < B; b++) acc += load_f32(dout, (size_t)b * total + i);
    dwpe[i] = acc;
  }
}

// ----------------------------------------------------------------------------------------------
// layernorm. CPU twins: layernorm_forward / layernorm_backward.
//   m = mean(x), v = mean((x-m)^2), rstd = 1/sqrt(v + 1e-5), y = (x-m)*rstd*w + b
// One warp per row.

// One row by one warp: lane l takes columns l, l+32, ...; the statistics are warp butterflies.
// The fused residual kernel runs the same code, so its LayerNorm is bitwise this one's.
template <typename A>
__device__ __forceinline__ void layernorm_row_warp(A* y, float* mean, float* rstd, const A* x, const float* w,
                                                   const float* b, int C, int lane) {
  float s = 0.0f;
  for (int i = lane; i < C; i += 32) s += load_f32(x, i);
  const float m = cuda::warp_sum(s) / C;
  float v = 0.0f;
  for (int i = lane; i < C; i += 32) v += (load_f32(x, i) - m) * (load_f32(x, i) - m);
  const float r = 1.0f / sqrtf(cuda::warp_sum(v) / C + 1e-5f);
  for (int i = lane; i < C; i += 32) store_f32(y, i, (load_f32(x, i) - m) * r * w[i] + b[i]);
  if (lane == 0) {
    *mean = m;
    *rstd = r;
  }
}

template <typename A>
__global__ void layernorm_forward_kernel(A* out, float* mean, float* rstd, const A* inp, const float* w,
                                         const float* b, int N, int C) {
  const int lane = threadIdx.x % 32;
  const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (n >= N) return;
  layernorm_row_warp(out + (size_t)n * C, mean + n, rstd + n, inp + (size_t)n * C, w, b, C, lane);
}

// residual + layernorm fused. CPU twin: residual_layernorm_forward.
//   res = a + b;  ln = layernorm(res)
// One warp per row. Each lane writes its own columns of res (l, l+32, ...) and the LayerNorm
// reads back only those same columns before its first butterfly, so no lane reads another's
// write: no barrier needed, and the re-read comes from L1. Saves the residual's separate
// pass over the row (llm.c's fused_residual_forward).
template <typename A>
__global__ void residual_layernorm_forward_kernel(A* res, A* ln, float* mean, float* rstd, const A* a,
                                                  const A* b, const float* w, const float* bias, int N, int C) {
  const int lane = threadIdx.x % 32;
  const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (n >= N) return;
  const size_t o = (size_t)n * C;
  for (int i = lane; i < C; i += 32) store_f32(res, o + i, load_f32(a, o + i) + load_f32(b, o + i));
  layernorm_row_warp(ln + o, mean + n, rstd + n, res + o, w, bias, C, lane);
}

// norm = (x-m)*rstd, g = w*dout:  dinp += (g - mean(g) - norm * mean(g*norm)) * rstd
// (the row part; dw and db, sums over rows, are the next two kernels). One warp per row.
template <typename A>
__global__ void layernorm_backward_dinp_kernel(A* dinp, const A* dout, const A* inp, const float* w,
                                               const float* mean, const float* rstd, int N, int C) {
  const int lane = threadIdx.x % 32;
  const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (n >= N) return;
  const A* x = inp + (size_t)n * C;
  const A* d = dout + (size_t)n * C;
  A* dx = dinp + (size_t)n * C;
  const float m = mean[n], r = rstd[n];
  float g_mean = 0.0f, gn_mean = 0.0f;
  for (int i = lane; i < C; i += 32) {
    const float g = w[i] * load_f32(d, i);
    g_mean += g;
    gn_mean += g * (load_f32(x, i) - m) * r;
  }
  g_mean = cuda::warp_sum(g_mean) / C;
  gn_mean = cuda::warp_sum(gn_mean) / C;
  for (int i = lane; i < C; i += 32) {
    const float norm = (load_f32(x, i) - m) * r;
    store_f32(dx, i, load_f32(dx, i) + (w[i] * load_f32(d, i) - g_mean - norm * gn_mean) * r);
  }
}

// ---- LayerNorm with the row in registers (rows of C % 8 == 0, C <= 256 * G) ----
// Lane l owns the 8-column groups l, l+32, ... of its row: columns 8 (32 g + l) .. + 8 for
// g < G. Each kernel reads its inputs once and writes its outputs once, 128 bits at a time when
// `vec` (every pointer 16-byte aligned, checked on the host; C % 8 == 0 keeps every row
// aligned), else with scalar loads of the same columns: the sums run in the same order either
// way, so the result does not depend on the alignment. Rows of other C take the kernels above.
constexpr int kLnGroupCols = 32 * cuda::kVec;  // columns of one group step of the warp

template <typename T>
__device__ __forceinline__ void ln_load8(float x[cuda::kVec], const T* p, bool vec) {
  if (vec) {
    cuda::load8(x, p);
  } else {
    for (int j = 0; j < cuda::kVec; j++) x[j] = load_f32(p, j);
  }
}
template <typename T>
__device__ __forceinline__ void ln_store8(T* p, const float x[cuda::kVec], bool vec) {
  if (vec) {
    cuda::store8(p, x);
  } else {
    for (int j = 0; j < cuda::kVec; j++) store_f32(p, j, x[j]);
  }
}

// The value p's dtype stores for v: v itself (fp32), v rounded to bf16 and widened (bf16).
__device__ __forceinline__ float stored_value(const float*, float v) { return v; }
__device__ __forceinline__ float stored_value(const uint16_t*, float v) {
  return cuda::bf16_to_f32(cuda::f32_to_bf16(v));
}

// y = layernorm(x) for the row x held by the warp in registers (the layout above); the maths
// of layernorm_row_warp. The residual kernel runs this code on its rounded sums, so its
// LayerNorm is bitwise layernorm_forward's on the stored residual.
template <int G, typename A>
__device__ __forceinline__ void layernorm_row_regs(A* y, float* mean, float* rstd, const float (&x)[G][cuda::kVec],
                                                   const float* w, const float* b, int C, int lane, bool vec) {
  float s = 0.0f;
#pragma unroll
  for (int g = 0; g < G; g++)
    if ((g * 32 + lane) * cuda::kVec < C)
      for (int j = 0; j < cuda::kVec; j++) s += x[g][j];
  const float m = cuda::warp_sum(s) / C;
  float v = 0.0f;
#pragma unroll
  for (int g = 0; g < G; g++)
    if ((g * 32 + lane) * cuda::kVec < C)
      for (int j = 0; j < cuda::kVec; j++) v += (x[g][j] - m) * (x[g][j] - m);
  const float r = 1.0f / sqrtf(cuda::warp_sum(v) / C + 1e-5f);
#pragma unroll
  for (int g = 0; g < G; g++) {
    const int c = (g * 32 + lane) * cuda::kVec;
    if (c >= C) continue;
    float wv[cuda::kVec], bv[cuda::kVec], o[cuda::kVec];
    ln_load8(wv, w + c, vec);
    ln_load8(bv, b + c, vec);
    for (int j = 0; j < cuda::kVec; j++) o[j] = (x[g][j] - m) * r * wv[j] + bv[j];
    ln_store8(y + c, o, vec);
  }
  if (lane == 0) {
    *mean = m;
    *rstd = r;
  }
}

template <int G, typename A>
__global__ void layernorm_forward_regs_kernel(A* out, float* mean, float* rstd, const A* inp, const float* w,
                                              const float* b, int N, int C, bool vec) {
  const int lane = threadIdx.x % 32;
  const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (n >= N) return;
  const A* x = inp + (size_t)n * C;
  float xr[G][cuda::kVec] = {};
#pragma unroll
  for (int g = 0; g < G; g++) {
    const int c = (g * 32 + lane) * cuda::kVec;
    if (c < C) ln_load8(xr[g], x + c, vec);
  }
  layernorm_row_regs<G>(out + (size_t)n * C, mean + n, rstd + n, xr, w, b, C, lane, vec);
}

// res = a + b (stored in A), ln = layernorm(res as stored): a and b read once, res written
// once and never read back.
template <int G, typename A>
__global__ void residual_layernorm_forward_regs_kernel(A* res, A* ln, float* mean, float* rstd, const A* a,
                                                       const A* b, const float* w, const float* bias, int N, int C,
                                                       bool vec) {
  const int lane = threadIdx.x % 32;
  const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (n >= N) return;
  const size_t o = (size_t)n * C;
  float xr[G][cuda::kVec] = {};
#pragma unroll
  for (int g = 0; g < G; g++) {
    const int c = (g * 32 + lane) * cuda::kVec;
    if (c >= C) continue;
    float av[cuda::kVec], bv[cuda::kVec];
    ln_load8(av, a + o + c, vec);
    ln_load8(bv, b + o + c, vec);
    for (int j = 0; j < cuda::kVec; j++) xr[g][j] = stored_value(res, av[j] + bv[j]);
    ln_store8(res + o + c, xr[g], vec);  // xr holds stored values: storing them is exact
  }
  layernorm_row_regs<G>(ln + o, mean + n, rstd + n, xr, w, bias, C, lane, vec);
}

// dinp += (g - mean(g) - norm * mean(g*norm)) * rstd, the maths of layernorm_backward_dinp_kernel;
// dout and inp read once (kept in registers), dinp read once and written once.
template <int G, typename A>
__global__ void layernorm_backward_dinp_regs_kernel(A* dinp, const A* dout, const A* inp, const float* w,
                                                    const float* mean, const float* rstd, int N, int C, bool vec) {
  const int lane = threadIdx.x % 32;
  const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (n >= N) return;
  const size_t o = (size_t)n * C;
  const float m = mean[n], r = rstd[n];
  float xr[G][cuda::kVec] = {}, dr[G][cuda::kVec] = {};
  float g_mean = 0.0f, gn_mean = 0.0f;
#pragma unroll
  for (int g = 0; g < G; g++) {
    const int c = (g * 32 + lane) * cuda::kVec;
    if (c >= C) continue;
    float wv[cuda::kVec];
    ln_load8(xr[g], inp + o + c, vec);
    ln_load8(dr[g], dout + o + c, vec);
    ln_load8(wv, w + c, vec);
    for (int j = 0; j < cuda::kVec; j++) {
      const float gj = wv[j] * dr[g][j];
      g_mean += gj;
      gn_mean += gj * (xr[g][j] - m) * r;
    }
  }
  g_mean = cuda::warp_sum(g_mean) / C;
  gn_mean = cuda::warp_sum(gn_mean) / C;
#pragma unroll
  for (int g = 0; g < G; g++) {
    const int c = (g * 32 + lane) * cuda::kVec;
    if (c >= C) continue;
    float wv[cuda::kVec], dx[cuda::kVec];
    ln_load8(wv, w + c, vec);  // w is shared by every row: an L1 / L2 hit
    ln_load8(dx, dinp + o + c, vec);
    for (int j = 0; j < cuda::kVec; j++) {
      const float norm = (xr[g][j] - m) * r;
      dx[j] = dx[j] + (wv[j] * dr[g][j] - g_mean - norm * gn_mean) * r;
    }
    ln_store8(dinp + o + c, dx, vec);
  }
}

// Groups a lane holds for a row of C columns: 4 (C <= 1024) or 8 (C <= 2048), or 0 where the
// row does not fit the register layout (C % 8 != 0 or C > 2048: the kernels above).
inline int LnGroups(int C) {
  if (C % cuda::kVec != 0) return 0;
  if (C <= 4 * kLnGroupCols) return 4;
  if (C <= 8 * kLnGroupCols) return 8;
  return 0;
}

// Partial sums of dw = sum_n dout*norm and db = sum_n dout over the rows of one chunk
// (kRowsPerChunk rows, blockIdx.y) for 32 columns (blockIdx.x). Block (32, 8): thread (x, y)
// sums rows y, y+8, ... of the chunk in order; then row y = 0 adds the 8 sums in order.
// partial[chunk][0:C] = dw part, partial[chunk][C:2C] = db part.
template <typename A>
__global__ void layernorm_backward_partial_kernel(float* partial, const A* dout, const A* inp,
                                                  const float* mean, const float* rstd, int N, int C) {
  SHARDGPT_SHARED(float, sdw, [8][33]);
  SHARDGPT_SHARED(float, sdb, [8][33]);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * 32 + tx;
  const int n0 = blockIdx.y * kRowsPerChunk, n1 = min(N, n0 + kRowsPerChunk);
  float dw = 0.0f, db = 0.0f;
  if (c < C) {
    for (int n = n0 + ty; n < n1; n += 8) {
      const float d = load_f32(dout, (size_t)n * C + c);
      const float norm = (load_f32(inp, (size_t)n * C + c) - mean[n]) * rstd[n];
      dw = fmaf(norm, d, dw);  // a written fma: the 128-bit kernel's sums are bitwise these
      db += d;
    }
  }
  sdw[ty][tx] = dw;
  sdb[ty][tx] = db;
  __syncthreads();
  if (ty == 0 && c < C) {
    float a = 0.0f, b = 0.0f;
    for (int k = 0; k < 8; k++) a += sdw[k][tx], b += sdb[k][tx];
    partial[(size_t)blockIdx.y * 2 * C + c] = a;
    partial[(size_t)blockIdx.y * 2 * C + C + c] = b;
  }
}


// layernorm_backward_partial_kernel's sums for 256 columns a block (blockIdx.x): lane tx owns
// columns 8 tx .. + 8 of them, read 128 bits at a time (C % 8 == 0, dout and inp 16-byte
// aligned). Each column's sums run in the same order as there, so the result is bitwise its.
template <typename A>
__global__ void layernorm_backward_partial_vec_kernel(float* partial, const A* dout, const A* inp,
                                                      const float* mean, const float* rstd, int N, int C) {
  SHARDGPT_SHARED(float, sdw, [8][kLnGroupCols]);
  SHARDGPT_SHARED(float, sdb, [8][kLnGroupCols]);
  const int tx = threadIdx.x, ty = threadIdx.y, k0 = tx * cuda::kVec;
  const int c = blockIdx.x * kLnGroupCols + k0;
  const int n0 = blockIdx.y * kRowsPerChunk, n1 = min(N, n0 + kRowsPerChunk);
  float dw[cuda::kVec] = {}, db[cuda::kVec] = {};
  if (c < C) {
    for (int n = n0 + ty; n < n1; n += 8) {
      float d[cuda::kVec], x[cuda::kVec];
      cuda::load8(d, dout + (size_t)n * C + c);
      cuda::load8(x, inp + (size_t)n * C + c);
      for (int j = 0; j < cuda::kVec; j++) {
        const float norm = (x[j] - mean[n]) * rstd[n];
        dw[j] = fmaf(norm, d[j], dw[j]);
        db[j] += d[j];
      }
    }
  }
  for (int j = 0; j < cuda::kVec; j++) sdw[ty][k0 + j] = dw[j], sdb[ty][k0 + j] = db[j];
  __syncthreads();
  if (ty == 0 && c < C) {
    for (int j = 0; j < cuda::kVec; j++) {
      float a = 0.0f, b = 0.0f;
      for (int k = 0; k < 8; k++) a += sdw[k][k0 + j], b += sdb[k][k0 + j];
      partial[(size_t)blockIdx.y * 2 * C + c + j] = a;
      partial[(size_t)blockIdx.y * 2 * C + C + c + j] = b;
    }
  }
}

}  // namespace

// dst[i] += sum_k partial[k*stride + i] for k = 0..chunks-1 in order (declared in device_util.cuh).
__global__ void add_chunk_sums_kernel(float* dst, const float* partial, int chunks, int stride, int width) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= width) return;
  float s = 0.0f;
  for (int k = 0; k < chunks; k++) s += partial[(size_t)k * stride + i];
  dst[i] += s;
}

namespace {

// ----------------------------------------------------------------------------------------------
// gelu (tanh approximation). CPU twins: gelu_forward / gelu_backward.
//   y = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   dy/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)

// The element-wise kernels below move their data in 128-bit accesses (cuda::elementwise, with
// `vec` when every pointer is 16-byte aligned; the same expression per element either way).

__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + tanhf(kGeluS * (x + 0.044715f * x * x * x))); }
__device__ __forceinline__ float gelu_grad(float x) {
  const float th = tanhf(kGeluS * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluS * (1.0f + 3.0f * 0.044715f * x * x);
}

template <typename A>
__global__ void gelu_forward_kernel(A* out, const A* inp, size_t n, bool vec) {
  cuda::elementwise(
      n, vec,
      [&](size_t i) {
        float x[cuda::kVec];
        cuda::load8(x, inp + i);
        for (int j = 0; j < cuda::kVec; j++) x[j] = gelu(x[j]);
        cuda::store8(out + i, x);
      },
      [&](size_t i) { store_f32(out, i, gelu(load_f32(inp, i))); });
}

// dinp += dout * gelu'(inp)
template <typename A>
__global__ void gelu_backward_kernel(A* dinp, const A* inp, const A* dout, size_t n, bool vec) {
  cuda::elementwise(
      n, vec,
      [&](size_t i) {
        float x[cuda::kVec], d[cuda::kVec], g[cuda::kVec];
        cuda::load8(x, inp + i);
        cuda::load8(d, dout + i);
        cuda::load8(g, dinp + i);
        for (int j = 0; j < cuda::kVec; j++) g[j] += gelu_grad(x[j]) * d[j];
        cuda::store8(dinp + i, g);
      },
      [&](size_t i) { store_f32(dinp, i, load_f32(dinp, i) + gelu_grad(load_f32(inp, i)) * load_f32(dout, i)); });
}

// The GELU epilogues' element-wise halves on an fp32 matmul result x (CPU twins:
// gelu_epilogue_forward / gelu_epilogue_backward): pre = x, out = gelu(x); dinp = x * gelu'(pre).
template <typename A>
__global__ void gelu_epilogue_forward_kernel(A* out, A* pre, const float* x, size_t n, bool vec) {
  cuda::elementwise(
      n, vec,
      [&](size_t i) {
        float v[cuda::kVec];
        cuda::load8(v, x + i);
        cuda::store8(pre + i, v);
        for (int j = 0; j < cuda::kVec; j++) v[j] = gelu(v[j]);
        cuda::store8(out + i, v);
      },
      [&](size_t i) {
        store_f32(pre, i, x[i]);
        store_f32(out, i, gelu(x[i]));
      });
}

template <typename A>
__global__ void gelu_epilogue_backward_kernel(A* dinp, const A* pre, const float* x, size_t n, bool vec) {
  cuda::elementwise(
      n, vec,
      [&](size_t i) {
        float p[cuda::kVec], d[cuda::kVec];
        cuda::load8(p, pre + i);
        cuda::load8(d, x + i);
        for (int j = 0; j < cuda::kVec; j++) d[j] *= gelu_grad(p[j]);
        cuda::store8(dinp + i, d);
      },
      [&](size_t i) { store_f32(dinp, i, x[i] * gelu_grad(load_f32(pre, i))); });
}

// ----------------------------------------------------------------------------------------------
// residual. CPU twin: residual_forward.  out = a + b

template <typename A>
__global__ void residual_forward_kernel(A* out, const A* a, const A* b, size_t n, bool vec) {
  cuda::elementwise(
      n, vec,
      [&](size_t i) {
        float x[cuda::kVec], y[cuda::kVec];
        cuda::load8(x, a + i);
        cuda::load8(y, b + i);
        for (int j = 0; j < cuda::kVec; j++) x[j] += y[j];
        cuda::store8(out + i, x);
      },
      [&](size_t i) { store_f32(out, i, load_f32(a, i) + load_f32(b, i)); });
}

// ----------------------------------------------------------------------------------------------
// crossentropy over the real columns [0,V) of logits[N,Vp]. CPU twin: crossentropy_softmax.
//   mx = max_v x_v;  sum = sum_v exp(x_v - mx);  loss = mx + log(sum) - x[target]
//   if dloss_scale != 0:  x_v = exp(x_v - mx) * (dloss_scale / sum) - [v == target] * dloss_scale
//                         (in place: the backward seed), padded columns [V,Vp) = 0
// One block per row. The row is read once for (mx, sum) with the online softmax (each thread
// keeps its running max m and sum s of exp(x - m), rescaling s when m grows), the pairs
// combined by a fixed tree (warp butterflies, then warps in order), and once more to write the
// gradient: two passes over the row instead of three. An out-of-range target gives a NaN loss.

// (m, s) of two partial softmax sums combined: max, and both sums rescaled to it.
__device__ __forceinline__ void softmax_combine(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;  // both empty
  s = s * expf(m - mx) + s2 * expf(m2 - mx);
  m = mx;
}

template <typename A>
__global__ void crossentropy_softmax_kernel(A* logits, float* losses, const int32_t* targets, int V, int Vp,
                                            float dloss_scale) {
  SHARDGPT_SHARED(float, shm_m, [32]);
  SHARDGPT_SHARED(float, shm_s, [32]);
  const size_t n = blockIdx.x;
  A* x = logits + n * Vp;
  const int tgt = targets[n];
  const bool valid = tgt >= 0 && tgt < V;
  const float xt = valid ? load_f32(x, tgt) : NAN;  // read before any thread overwrites x (the reduction synchronises)
  float m = -INFINITY, s = 0.0f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = load_f32(x, i);
    if (v > m) {
      s = s * expf(m - v) + 1.0f;
      m = v;
    } else {
      s += expf(v - m);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(cuda::kFullMask, m, o), s2 = __shfl_xor_sync(cuda::kFullMask, s, o);
    softmax_combine(m, s, m2, s2);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
  if (lane == 0) shm_m[warp] = m, shm_s[warp] = s;
  __syncthreads();
  float mx = shm_m[0], sum = shm_s[0];
  for (int w = 1; w < nwarps; w++) softmax_combine(mx, sum, shm_m[w], shm_s[w]);
  if (dloss_scale != 0.0f) {
    const float mul = dloss_scale / sum;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      float g = expf(load_f32(x, i) - mx) * mul;
      if (i == tgt) g -= dloss_scale;
      store_f32(x, i, g);  // each dlogit rounded once (bf16 logits: written in place in bf16)
    }
    for (int i = V + threadIdx.x; i < Vp; i += blockDim.x) store_f32(x, i, 0.0f);
  }
  if (threadIdx.x == 0) losses[n] = mx + logf(sum) - xt;
}

// *acc += float(sum_n losses[n] / N): one block; each thread sums its stride in double, then a
// fixed block tree (the CPU twin add_mean_loss sums serially: equal to rounding).
__global__ void add_mean_loss_kernel(double* acc, const float* losses, int N) {
  SHARDGPT_SHARED(double, shm, [32]);
  double s = 0.0;
  for (int i = threadIdx.x; i < N; i += blockDim.x) s += losses[i];
  s = cuda::block_sum(s, shm);
  if (threadIdx.x == 0) *acc += (double)(float)(s / N);
}

// ----------------------------------------------------------------------------------------------
// engine kernels. CPU twins: convert, accumulate, sum_squares, adamw_mixed (kernels_cpu.h; its
// per-element step is adamw_update's, model/optimizer.h).

// dst = src, f32 <-> bf16 (RNE narrowing, bit-identical to base/bf16.h)
template <typename Dst, typename Src>
__global__ void convert_kernel(Dst* dst, const Src* src, size_t n, bool vec) {
  cuda::elementwise(
      n, vec,
      [&](size_t i) {
        float x[cuda::kVec];
        cuda::load8(x, src + i);
        cuda::store8(dst + i, x);
      },
      [&](size_t i) { cuda::store_f32(dst, i, cuda::load_f32(src, i)); });
}

// dst += src in fp32; a bf16 dst is rounded once: dst = bf16(f32(dst) + f32(src))
template <typename Dst, typename Src>
__global__ void accumulate_kernel(Dst* dst, const Src* src, size_t n, bool vec) {
  cuda::elementwise(
      n, vec,
      [&](size_t i) {
        float x[cuda::kVec], y[cuda::kVec];
        cuda::load8(x, dst + i);
        cuda::load8(y, src + i);
        for (int j = 0; j < cuda::kVec; j++) x[j] += y[j];
        cuda::store8(dst + i, x);
      },
      [&](size_t i) { cuda::store_f32(dst, i, cuda::load_f32(dst, i) + cuda::load_f32(src, i)); });
}

// partial[block] = sum of x[i]^2 (in double) over the block's grid-stride elements, fixed order.
template <typename T>
__global__ void sum_squares_kernel(double* partial, const T* x, size_t n) {
  SHARDGPT_SHARED(double, shm, [32]);
  double s = 0.0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const double v = cuda::load_f32(x, i);
    s += v * v;
  }
  s = cuda::block_sum(s, shm);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// AdamW, the float operations of adamw_element (model/optimizer.h) in the same order, its
// multiply-adds explicit fmas (c1, c2 from the host, computed there with the same expression):
//   g = grad * grad_scale;  m = fma(b1, m, (1-b1) g);  v = fma(b2, v, ((1-b2) g) g)
//   p = fma(-lr, fma(wd, p, (m c1) / (sqrt(v c2) + eps)), p),  c1 = 1/(1-b1^t), c2 = 1/(1-b2^t)
// No other add has a product operand, so nvcc cannot contract the vector and the scalar paths
// differently: the bits do not depend on the alignment, and equal the CPU twin's.
__device__ __forceinline__ void adamw_value(float& p, float grad, float& m, float& v, float lr, float wd, float b1,
                                            float b2, float eps, float c1, float c2, float grad_scale) {
  const float g = grad * grad_scale;
  m = fmaf(b1, m, (1.0f - b1) * g);
  v = fmaf(b2, v, ((1.0f - b2) * g) * g);
  p = fmaf(-lr, fmaf(wd, p, (m * c1) / (sqrtf(v * c2) + eps)), p);
}

// The scalars of one adamw_mixed call.
struct AdamWArgs {
  float lr, wd, b1, b2, eps, c1, c2;
  const float* grad_scale_dev;  // where not null, the scale is read here (device memory)
  float grad_scale;
};

// The optimizer's one pass (CPU twin: adamw_mixed, model/kernels_cpu.h): the gradient read in
// its dtype G and widened here, adamw_value, then the stored parameters (S: bf16 RNE or fp32;
// stored null when it is the master itself). The scale: *grad_scale_dev where not null (the
// clip factor on the device), else grad_scale. With `vec` (every pointer 16-byte aligned) 8
// elements per step: fp32 master, m, v in two 128-bit accesses each, a bf16 gradient or stored
// copy in one; the scalar path otherwise and for the tail. Both paths apply adamw_value to each
// element alone, so the bits do not depend on the alignment.
template <typename G, typename S>
__global__ void adamw_mixed_kernel(float* master, S* stored, const G* grad, float* m, float* v, size_t n, bool vec,
                                   AdamWArgs a) {
  const float scale = a.grad_scale_dev ? *a.grad_scale_dev : a.grad_scale;
  cuda::elementwise(
      n, vec,
      [&](size_t i) {
        float p[cuda::kVec], g[cuda::kVec], mi[cuda::kVec], vi[cuda::kVec];
        cuda::load8(p, master + i);
        cuda::load8(g, grad + i);
        cuda::load8(mi, m + i);
        cuda::load8(vi, v + i);
        for (int j = 0; j < cuda::kVec; j++)
          adamw_value(p[j], g[j], mi[j], vi[j], a.lr, a.wd, a.b1, a.b2, a.eps, a.c1, a.c2, scale);
        cuda::store8(m + i, mi);
        cuda::store8(v + i, vi);
        cuda::store8(master + i, p);
        if (stored) cuda::store8(stored + i, p);
      },
      [&](size_t i) {
        float p = master[i], mi = m[i], vi = v[i];
        adamw_value(p, cuda::load_f32(grad, i), mi, vi, a.lr, a.wd, a.b1, a.b2, a.eps, a.c1, a.c2, scale);
        m[i] = mi;
        v[i] = vi;
        master[i] = p;
        if (stored) cuda::store_f32(stored, i, p);
      });
}

template <typename G, typename S>
void LaunchAdamWMixed(cudaStream_t stream, float* master, S* stored, const void* grad, float* m, float* v, size_t n,
                      const AdamWArgs& a) {
  const bool vec = cuda::Aligned16(master) && cuda::Aligned16(grad) && cuda::Aligned16(m) && cuda::Aligned16(v) &&
                   (stored == nullptr || cuda::Aligned16(stored));
  auto* const adamw_mixed = &adamw_mixed_kernel<G, S>;
  SHARDGPT_LAUNCH(adamw_mixed, cuda::VecGrid(n, vec, kThreads), kThreads, 0, stream)(
      master, stored, static_cast<const G*>(grad), m, v, n, vec, a);
  SHARDGPT_CUDA_CHECK_LAUNCH("adamw_mixed_kernel");
}

// *dst = (sum_i src[i]) / divisor, one thread, index order (a handful of values: a step's
// sum-of-squares partials, pieces, ranks). CPU twin: sum_f64.
__global__ void sum_f64_kernel(double* dst, const double* src, size_t n, double divisor) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += src[i];
  *dst = s / divisor;
}

// norm = float(sqrt(ss)); scale = clip / (norm + 1e-6) if clip > 0 and norm > clip, else 1.
// CPU twin: clip_factor.
__global__ void clip_factor_kernel(float* out, const double* ss, float grad_clip) {
  const float norm = (float)sqrt(*ss);
  out[0] = norm;
  out[1] = (grad_clip > 0 && norm > grad_clip) ? grad_clip / (norm + 1e-6f) : 1.0f;
}

}  // namespace

// ==============================================================================================
// CudaKernels: set-up, scratch

CudaKernels::~CudaKernels() {
  // Destructors must not throw: errors here are ignored (the context may already be gone).
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
  for (auto& kv : plans_) {
    if (kv.second.desc) cublasLtMatmulDescDestroy(kv.second.desc);
    if (kv.second.a) cublasLtMatrixLayoutDestroy(kv.second.a);
    if (kv.second.b) cublasLtMatrixLayoutDestroy(kv.second.b);
    if (kv.second.d) cublasLtMatrixLayoutDestroy(kv.second.d);
  }
  if (lt_) cublasLtDestroy(lt_);
  if (workspace_) cudaFree(workspace_);
  for (void* p : scratch_)
    if (p) cudaFree(p);
}

Status CudaKernels::Init() {
  cudaSetDevice(device_);
  const cublasStatus_t s = cublasLtCreate(&lt_);
  if (s != CUBLAS_STATUS_SUCCESS) {
    lt_ = nullptr;
    return Status::Internal(std::string("--device cuda: cuBLASLt failed to start: ") + cublasLtGetStatusString(s) +
                            " (" + cublasLtGetStatusName(s) + ")");
  }
  const cudaError_t e = cudaMalloc(&workspace_, kWorkspaceBytes);
  if (e != cudaSuccess) {
    workspace_ = nullptr;
    cudaGetLastError();
    return Status::Internal("--device cuda: cannot allocate the " + std::to_string(kWorkspaceBytes >> 20) +
                            " MiB cuBLASLt workspace: " + cuda::ErrorText(e));
  }
  return Status::OK();
}

void CudaKernels::Bind() const { SHARDGPT_CUDA_CHECK(cudaSetDevice(device_)); }

void* CudaKernels::Scratch(size_t bytes, ScratchSlot slot) const {
  if (bytes <= scratch_bytes_[slot]) return scratch_[slot];
  const size_t want = std::max(bytes, scratch_bytes_[slot] + scratch_bytes_[slot] / 2);  // grow by >= 1.5x
  if (scratch_[slot]) {
    SHARDGPT_CUDA_CHECK(cudaStreamSynchronize(stream_));  // kernels may still read the old one
    SHARDGPT_CUDA_CHECK(cudaFree(scratch_[slot]));
    scratch_[slot] = nullptr, scratch_bytes_[slot] = 0;
  }
  const cudaError_t e = cudaMalloc(&scratch_[slot], want);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    scratch_[slot] = nullptr;
    throw DeviceOutOfMemory("out of GPU memory on cuda:" + std::to_string(device_) +
                            " allocating kernel scratch (" + std::to_string(want) + " bytes asked, " +
                            std::to_string(free_b) +
                            " bytes free); try a higher --zero-stage or a smaller --micro-batch");
  }
  SHARDGPT_CUDA_CHECK(e);
  scratch_bytes_[slot] = want;
  return scratch_[slot];
}

// The whole stored span of X (the last column ends at (cols-1)*ld + rows) is converted, so the
// copy keeps X's leading dimension.
const uint16_t* CudaKernels::Bf16Copy(const float* X, int rows, int cols, int ld, ScratchSlot slot) const {
  const size_t n = (size_t)(cols - 1) * ld + rows;
  // the same layout, already bf16; 16-byte aligned, as cuBLASLt's bf16 tensor-core algorithms
  // want (else the copy, 256-byte aligned)
  const uint16_t* stored = sources_.Find(X, n);
  if (stored && reinterpret_cast<uintptr_t>(stored) % 16 == 0) {
    operands_from_stored_++;
    return stored;
  }
  uint16_t* dst = static_cast<uint16_t*>(Scratch(n * sizeof(uint16_t), slot));
  convert(X, DType::kF32, dst, DType::kBF16, n);
  return dst;
}

void CudaKernels::begin_weight_reuse() { sources_.Reset(true); }

void CudaKernels::end_weight_reuse() { sources_.Reset(false); }

void CudaKernels::note_bf16_source(const float* widened, const void* bf16, size_t n) {
  sources_.Note(widened, static_cast<const uint16_t*>(bf16), n);
}

void CudaKernels::ForgetMemory(const void* p, size_t bytes) { sources_.Forget(p, bytes); }

const float* CudaKernels::F32Copy(const uint16_t* X, int rows, int cols, int ld, ScratchSlot slot) const {
  const size_t n = (size_t)(cols - 1) * ld + rows;
  float* dst = static_cast<float*>(Scratch(n * sizeof(float), slot));
  convert(X, DType::kBF16, dst, DType::kF32, n);
  return dst;
}

// ==============================================================================================
// model kernels

void CudaKernels::encoder_forward(void* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                                  int C) const {
  const size_t total = (size_t)B * T * C;
  if (total == 0) return;
  Bind();
  WithAct([&](auto a) {
    using A = decltype(a);
    SHARDGPT_LAUNCH(encoder_forward_kernel<A>, GridFor(total, kThreads), kThreads, 0, stream_)(
        static_cast<A*>(out), tokens, wte, wpe, T, C, total);
  });
  SHARDGPT_CUDA_CHECK_LAUNCH("encoder_forward_kernel");
}

// On the device (no host round trip): the positions sorted by token, then one block row per
// run (see encoder_sort_kernel). The sorted positions live in the general scratch.
void CudaKernels::encoder_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                                   int C) const {
  const int N = B * T;
  if (N == 0 || C == 0) return;
  Bind();
  int32_t* sorted = static_cast<int32_t*>(Scratch(sizeof(int32_t) * N));
  SHARDGPT_LAUNCH(encoder_sort_kernel, (N + 255) / 256, 256, 0, stream_)(sorted, tokens, N);
  SHARDGPT_CUDA_CHECK_LAUNCH("encoder_sort_kernel");
  WithAct([&](auto a) {
    using A = decltype(a);
    const A* d = static_cast<const A*>(dout);
    const dim3 grid(N, (C + 127) / 128);
    SHARDGPT_LAUNCH(encoder_backward_wte_kernel<A>, grid, 128, 0, stream_)(dwte, d, tokens, sorted, N, C);
    SHARDGPT_CUDA_CHECK_LAUNCH("encoder_backward_wte_kernel");
    SHARDGPT_LAUNCH(encoder_backward_wpe_kernel<A>, GridFor((size_t)T * C, kThreads), kThreads, 0, stream_)(dwpe, d, B,
                                                                                                          T, C);
    SHARDGPT_CUDA_CHECK_LAUNCH("encoder_backward_wpe_kernel");
  });
}

void CudaKernels::residual_layernorm_forward(void* res_out, void* ln_out, float* mean, float* rstd, const void* a,
                                             const void* b, const float* w, const float* bias, int N, int C) const {
  if (N == 0) return;
  Bind();
  const int rows_per_block = kThreads / 32, blocks = (N + rows_per_block - 1) / rows_per_block;
  const int groups = LnGroups(C);
  const bool vec = cuda::Aligned16(res_out) && cuda::Aligned16(ln_out) && cuda::Aligned16(a) && cuda::Aligned16(b) &&
                   cuda::Aligned16(w) && cuda::Aligned16(bias);
  WithAct([&](auto t) {
    using A = decltype(t);
    A *r = static_cast<A*>(res_out), *l = static_cast<A*>(ln_out);
    const A *pa = static_cast<const A*>(a), *pb = static_cast<const A*>(b);
    // (a template-id has commas: the macro takes a pointer)
    auto* residual_layernorm_forward_regs =
        groups == 4 ? &residual_layernorm_forward_regs_kernel<4, A> : &residual_layernorm_forward_regs_kernel<8, A>;
    if (groups != 0)
      SHARDGPT_LAUNCH(residual_layernorm_forward_regs, blocks, kThreads, 0, stream_)(r, l, mean, rstd, pa, pb, w, bias,
                                                                                     N, C, vec);
    else
      SHARDGPT_LAUNCH(residual_layernorm_forward_kernel<A>, blocks, kThreads, 0, stream_)(r, l, mean, rstd, pa, pb, w,
                                                                                         bias, N, C);
  });
  SHARDGPT_CUDA_CHECK_LAUNCH("residual_layernorm_forward_kernel");
}

// LayerNorm rows: in registers where they fit (LnGroups), else the one-warp-per-row kernels
// that read the row from memory per pass. Both give bitwise the same result for a given C
// whatever the pointers' alignment (the fused residual kernel follows the same choice).
void CudaKernels::layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const float* w,
                                    const float* b, int N, int C) const {
  if (N == 0) return;
  Bind();
  const int rows_per_block = kThreads / 32, blocks = (N + rows_per_block - 1) / rows_per_block;
  const int groups = LnGroups(C);
  const bool vec = cuda::Aligned16(out) && cuda::Aligned16(inp) && cuda::Aligned16(w) && cuda::Aligned16(b);
  WithAct([&](auto t) {
    using A = decltype(t);
    A* o = static_cast<A*>(out);
    const A* x = static_cast<const A*>(inp);
    auto* layernorm_forward_regs =
        groups == 4 ? &layernorm_forward_regs_kernel<4, A> : &layernorm_forward_regs_kernel<8, A>;
    if (groups != 0)
      SHARDGPT_LAUNCH(layernorm_forward_regs, blocks, kThreads, 0, stream_)(o, mean, rstd, x, w, b, N, C, vec);
    else
      SHARDGPT_LAUNCH(layernorm_forward_kernel<A>, blocks, kThreads, 0, stream_)(o, mean, rstd, x, w, b, N, C);
  });
  SHARDGPT_CUDA_CHECK_LAUNCH("layernorm_forward_kernel");
}

// dinp: one warp per row (in registers where LnGroups(C) allows). dw, db: per-chunk partials
// (fixed chunks of kRowsPerChunk rows; 128-bit loads where C % 8 == 0 and dout, inp are
// aligned), then one thread per column adds the chunks in order.
void CudaKernels::layernorm_backward(void* dinp, float* dw, float* db, const void* dout, const void* inp,
                                     const float* w, const float* mean, const float* rstd, int N, int C) const {
  if (N == 0 || C == 0) return;
  Bind();
  const int rows_per_block = kThreads / 32;
  const int chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  float* partial = static_cast<float*>(Scratch(sizeof(float) * chunks * 2 * C));
  const int groups = LnGroups(C);
  const bool vec = cuda::Aligned16(dinp) && cuda::Aligned16(dout) && cuda::Aligned16(inp) && cuda::Aligned16(w);
  WithAct([&](auto t) {
    using A = decltype(t);
    const A *d = static_cast<const A*>(dout), *x = static_cast<const A*>(inp);
    const int blocks = (N + rows_per_block - 1) / rows_per_block;
    A* dx = static_cast<A*>(dinp);
    auto* layernorm_backward_dinp_regs =
        groups == 4 ? &layernorm_backward_dinp_regs_kernel<4, A> : &layernorm_backward_dinp_regs_kernel<8, A>;
    if (groups != 0)
      SHARDGPT_LAUNCH(layernorm_backward_dinp_regs, blocks, kThreads, 0, stream_)(dx, d, x, w, mean, rstd, N, C, vec);
    else
      SHARDGPT_LAUNCH(layernorm_backward_dinp_kernel<A>, blocks, kThreads, 0, stream_)(dx, d, x, w, mean, rstd, N, C);
    SHARDGPT_CUDA_CHECK_LAUNCH("layernorm_backward_dinp_kernel");
    if (C % cuda::kVec == 0 && cuda::Aligned16(dout) && cuda::Aligned16(inp))
      SHARDGPT_LAUNCH(layernorm_backward_partial_vec_kernel<A>, dim3((C + kLnGroupCols - 1) / kLnGroupCols, chunks),
                      dim3(32, 8), 0, stream_)(partial, d, x, mean, rstd, N, C);
    else
      SHARDGPT_LAUNCH(layernorm_backward_partial_kernel<A>, dim3((C + 31) / 32, chunks), dim3(32, 8), 0, stream_)(
          partial, d, x, mean, rstd, N, C);
    SHARDGPT_CUDA_CHECK_LAUNCH("layernorm_backward_partial_kernel");
  });
  SHARDGPT_LAUNCH(add_chunk_sums_kernel, (C + kThreads - 1) / kThreads, kThreads, 0, stream_)(dw, partial, chunks, 2 * C, C);
  SHARDGPT_CUDA_CHECK_LAUNCH("add_chunk_sums_kernel");
  SHARDGPT_LAUNCH(add_chunk_sums_kernel, (C + kThreads - 1) / kThreads, kThreads, 0, stream_)(db, partial + C, chunks, 2 * C, C);
  SHARDGPT_CUDA_CHECK_LAUNCH("add_chunk_sums_kernel");
}

void CudaKernels::gelu_forward(void* out, const void* inp, size_t n) const {
  if (n == 0) return;
  Bind();
  const bool vec = cuda::Aligned16(out) && cuda::Aligned16(inp);
  WithAct([&](auto t) {
    using A = decltype(t);
    SHARDGPT_LAUNCH(gelu_forward_kernel<A>, cuda::VecGrid(n, vec, kThreads), kThreads, 0, stream_)(
        static_cast<A*>(out), static_cast<const A*>(inp), n, vec);
  });
  SHARDGPT_CUDA_CHECK_LAUNCH("gelu_forward_kernel");
}

void CudaKernels::gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) const {
  if (n == 0) return;
  Bind();
  const bool vec = cuda::Aligned16(dinp) && cuda::Aligned16(inp) && cuda::Aligned16(dout);
  WithAct([&](auto t) {
    using A = decltype(t);
    SHARDGPT_LAUNCH(gelu_backward_kernel<A>, cuda::VecGrid(n, vec, kThreads), kThreads, 0, stream_)(
        static_cast<A*>(dinp), static_cast<const A*>(inp), static_cast<const A*>(dout), n, vec);
  });
  SHARDGPT_CUDA_CHECK_LAUNCH("gelu_backward_kernel");
}

void CudaKernels::GeluEpilogueForward(void* out, void* pre, const float* x, size_t n) const {
  if (n == 0) return;
  const bool vec = cuda::Aligned16(out) && cuda::Aligned16(pre) && cuda::Aligned16(x);
  WithAct([&](auto t) {
    using A = decltype(t);
    SHARDGPT_LAUNCH(gelu_epilogue_forward_kernel<A>, cuda::VecGrid(n, vec, kThreads), kThreads, 0, stream_)(
        static_cast<A*>(out), static_cast<A*>(pre), x, n, vec);
  });
  SHARDGPT_CUDA_CHECK_LAUNCH("gelu_epilogue_forward_kernel");
}

void CudaKernels::GeluEpilogueBackward(void* dinp, const void* pre, const float* x, size_t n) const {
  if (n == 0) return;
  const bool vec = cuda::Aligned16(dinp) && cuda::Aligned16(pre) && cuda::Aligned16(x);
  WithAct([&](auto t) {
    using A = decltype(t);
    SHARDGPT_LAUNCH(gelu_epilogue_backward_kernel<A>, cuda::VecGrid(n, vec, kThreads), kThreads, 0, stream_)(
        static_cast<A*>(dinp), static_cast<const A*>(pre), x, n, vec);
  });
  SHARDGPT_CUDA_CHECK_LAUNCH("gelu_epilogue_backward_kernel");
}

void CudaKernels::residual_forward(void* out, const void* a, const void* b, size_t n) const {
  if (n == 0) return;
  Bind();
  const bool vec = cuda::Aligned16(out) && cuda::Aligned16(a) && cuda::Aligned16(b);
  WithAct([&](auto t) {
    using A = decltype(t);
    SHARDGPT_LAUNCH(residual_forward_kernel<A>, cuda::VecGrid(n, vec, kThreads), kThreads, 0, stream_)(
        static_cast<A*>(out), static_cast<const A*>(a), static_cast<const A*>(b), n, vec);
  });
  SHARDGPT_CUDA_CHECK_LAUNCH("residual_forward_kernel");
}

namespace {
// The n values at dev (device memory), copied to the host through `host` and added there in
// double in index order: the CPU twins' order, so these sums are deterministic and comparable.
template <typename T>
double SumOnHost(const T* dev, size_t n, std::vector<T>& host, cudaStream_t stream) {
  host.resize(n);
  SHARDGPT_CUDA_CHECK(cudaMemcpyAsync(host.data(), dev, sizeof(T) * n, cudaMemcpyDeviceToHost, stream));
  SHARDGPT_CUDA_CHECK(cudaStreamSynchronize(stream));
  double total = 0.0;
  for (size_t i = 0; i < n; i++) total += host[i];
  return total;
}
}  // namespace

// Losses come to the host and are summed there in double, in row order (the CPU twin's order).
double CudaKernels::crossentropy_softmax(void* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                                         float dloss_scale) const {
  if (N == 0) return 0.0;
  Bind();
  WithAct([&](auto t) {
    using A = decltype(t);
    SHARDGPT_LAUNCH(crossentropy_softmax_kernel<A>, N, kThreads, 0, stream_)(static_cast<A*>(logits), losses, targets,
                                                                            V, Vp, dloss_scale);
  });
  SHARDGPT_CUDA_CHECK_LAUNCH("crossentropy_softmax_kernel");
  return SumOnHost(losses, N, host_floats_, stream_);
}

void CudaKernels::crossentropy_softmax_acc(void* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                                           float dloss_scale, double* loss_acc) const {
  if (N == 0) return;
  Bind();
  WithAct([&](auto t) {
    using A = decltype(t);
    SHARDGPT_LAUNCH(crossentropy_softmax_kernel<A>, N, kThreads, 0, stream_)(static_cast<A*>(logits), losses, targets,
                                                                            V, Vp, dloss_scale);
  });
  SHARDGPT_CUDA_CHECK_LAUNCH("crossentropy_softmax_kernel");
  SHARDGPT_LAUNCH(add_mean_loss_kernel, 1, kThreads, 0, stream_)(loss_acc, losses, N);
  SHARDGPT_CUDA_CHECK_LAUNCH("add_mean_loss_kernel");
}

void CudaKernels::convert(const void* src, DType from, void* dst, DType to, size_t n) const {
  if (n == 0) return;
  Bind();
  const bool vec = cuda::Aligned16(src) && cuda::Aligned16(dst);
  const unsigned grid = cuda::VecGrid(n, vec, kThreads);
  if (from == to) {
    SHARDGPT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * DTypeSize(from), cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  if (from == DType::kF32) {
    auto* const convert_f32_to_bf16_kernel = &convert_kernel<uint16_t, float>;
    SHARDGPT_LAUNCH(convert_f32_to_bf16_kernel, grid, kThreads, 0, stream_)(static_cast<uint16_t*>(dst),
                                                                            static_cast<const float*>(src), n, vec);
  } else {
    auto* const convert_bf16_to_f32_kernel = &convert_kernel<float, uint16_t>;
    SHARDGPT_LAUNCH(convert_bf16_to_f32_kernel, grid, kThreads, 0, stream_)(static_cast<float*>(dst),
                                                                            static_cast<const uint16_t*>(src), n, vec);
  }
  SHARDGPT_CUDA_CHECK_LAUNCH("convert_kernel");
}

void CudaKernels::accumulate(void* dst, DType dtype, const void* src, DType src_dtype, size_t n) const {
  if (n == 0) return;
  Bind();
  const bool vec = cuda::Aligned16(dst) && cuda::Aligned16(src);
  const unsigned grid = cuda::VecGrid(n, vec, kThreads);
  const bool df = dtype == DType::kF32, sf = src_dtype == DType::kF32;
  auto* const accumulate_f32_f32_kernel = &accumulate_kernel<float, float>;
  auto* const accumulate_f32_bf16_kernel = &accumulate_kernel<float, uint16_t>;
  auto* const accumulate_bf16_f32_kernel = &accumulate_kernel<uint16_t, float>;
  auto* const accumulate_bf16_bf16_kernel = &accumulate_kernel<uint16_t, uint16_t>;
  float* const f_dst = static_cast<float*>(dst);
  uint16_t* const h_dst = static_cast<uint16_t*>(dst);
  const float* const f_src = static_cast<const float*>(src);
  const uint16_t* const h_src = static_cast<const uint16_t*>(src);
  if (df && sf) {
    SHARDGPT_LAUNCH(accumulate_f32_f32_kernel, grid, kThreads, 0, stream_)(f_dst, f_src, n, vec);
  } else if (df) {
    SHARDGPT_LAUNCH(accumulate_f32_bf16_kernel, grid, kThreads, 0, stream_)(f_dst, h_src, n, vec);
  } else if (sf) {
    SHARDGPT_LAUNCH(accumulate_bf16_f32_kernel, grid, kThreads, 0, stream_)(h_dst, f_src, n, vec);
  } else {
    SHARDGPT_LAUNCH(accumulate_bf16_bf16_kernel, grid, kThreads, 0, stream_)(h_dst, h_src, n, vec);
  }
  SHARDGPT_CUDA_CHECK_LAUNCH("accumulate_kernel");
}

// Block partials in double (the grid depends only on n), added in block order: on the host
// (sum_squares) or on the device by one thread (sum_squares_to): the same sum either way.
double* CudaKernels::SumSquaresPartials(const void* x, DType dtype, size_t n, unsigned* blocks_out) const {
  const unsigned blocks = std::min<unsigned>(GridFor(n, kThreads), 1024);
  double* partial = static_cast<double*>(Scratch(sizeof(double) * blocks));
  if (dtype == DType::kF32) {
    SHARDGPT_LAUNCH(sum_squares_kernel<float>, blocks, kThreads, 0, stream_)(partial, static_cast<const float*>(x), n);
  } else {
    SHARDGPT_LAUNCH(sum_squares_kernel<uint16_t>, blocks, kThreads, 0, stream_)(partial,
                                                                          static_cast<const uint16_t*>(x), n);
  }
  SHARDGPT_CUDA_CHECK_LAUNCH("sum_squares_kernel");
  *blocks_out = blocks;
  return partial;
}

double CudaKernels::sum_squares(const void* x, DType dtype, size_t n) const {
  if (n == 0) return 0.0;
  Bind();
  unsigned blocks = 0;
  double* partial = SumSquaresPartials(x, dtype, n, &blocks);
  return SumOnHost(partial, blocks, host_doubles_, stream_);
}

void CudaKernels::sum_squares_to(double* dst, const void* x, DType dtype, size_t n) const {
  Bind();
  if (n == 0) {
    SHARDGPT_CUDA_CHECK(cudaMemsetAsync(dst, 0, sizeof(double), stream_));
    return;
  }
  unsigned blocks = 0;
  double* partial = SumSquaresPartials(x, dtype, n, &blocks);
  SHARDGPT_LAUNCH(sum_f64_kernel, 1, 1, 0, stream_)(dst, partial, (size_t)blocks, 1.0);
  SHARDGPT_CUDA_CHECK_LAUNCH("sum_f64_kernel");
}

void CudaKernels::sum_f64(double* dst, const double* src, size_t n, double divisor) const {
  Bind();
  SHARDGPT_LAUNCH(sum_f64_kernel, 1, 1, 0, stream_)(dst, src, n, divisor);
  SHARDGPT_CUDA_CHECK_LAUNCH("sum_f64_kernel");
}

void CudaKernels::clip_factor(float* out, const double* ss, float grad_clip) const {
  Bind();
  SHARDGPT_LAUNCH(clip_factor_kernel, 1, 1, 0, stream_)(out, ss, grad_clip);
  SHARDGPT_CUDA_CHECK_LAUNCH("clip_factor_kernel");
}

void CudaKernels::adamw_mixed(float* master, void* stored, DType stored_dtype, const void* grad, DType grad_dtype,
                              float* m, float* v, size_t n, float lr, float weight_decay, const AdamWConfig& cfg,
                              int64_t t, const float* grad_scale_dev, float grad_scale) const {
  if (n == 0) return;
  Bind();
  const AdamWArgs a{lr, weight_decay, cfg.beta1, cfg.beta2, cfg.eps, AdamWC1(cfg, t), AdamWC2(cfg, t),
                    grad_scale_dev, grad_scale};  // c1, c2: adamw_update's (model/optimizer.h)
  const bool bf16_grad = grad_dtype == DType::kBF16;
  if (stored_dtype == DType::kBF16) {
    uint16_t* s = static_cast<uint16_t*>(stored);
    if (bf16_grad) return LaunchAdamWMixed<uint16_t>(stream_, master, s, grad, m, v, n, a);
    return LaunchAdamWMixed<float>(stream_, master, s, grad, m, v, n, a);
  }
  float* s = stored == master ? nullptr : static_cast<float*>(stored);  // fp32 storage: the master itself
  if (bf16_grad) return LaunchAdamWMixed<uint16_t>(stream_, master, s, grad, m, v, n, a);
  LaunchAdamWMixed<float>(stream_, master, s, grad, m, v, n, a);
}

}  // namespace shardgpt
