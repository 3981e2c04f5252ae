// CPU kernels of the GPT forward and backward pass (fp32), in the style of llm.c's train_gpt2.c.
// Matmuls (and, without AVX-512, the score/value products inside attention) go to OpenBLAS
// cblas_sgemm; with AVX-512 attention runs on register tiles (model/attention_cpu_tiled.h,
// Fp32Attention); everything else is OpenMP over rows with inner loops written to be
// auto-vectorised (-O3 -march=native).
//
// Threading: ONE pool, OpenMP's. OpenBLAS is kept single-threaded and each OpenMP thread calls
// sgemm on its own slice of the output (rows of out/dinp, rows of dw): two pools (OpenBLAS's
// pthreads and OpenMP's) would spin against each other on a small machine, slowing both the
// element-wise kernels and the sgemms.
//
// Determinism: for a fixed thread count every kernel is bitwise reproducible. All OpenMP loops
// use static schedules, no atomics; cross-row reductions (layernorm dw/db) go through
// per-thread partial arrays summed in thread order; scatters (encoder dwte) are split by channel.
#include "model/kernels_cpu.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/bf16.h"
#include "model/attention_cpu_tiled.h"
#include "model/kernels_cpu_internal.h"

namespace shardgpt {

namespace {

int g_threads = 0;  // 0: not set yet, use the OpenMP default

inline int nthreads() { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

using cpu_internal::exp_fast;

// tanh(u) = 1 - 2 / (exp(2u) + 1); absolute error ~1e-7.
inline float tanh_fast(float u) { return 1.0f - 2.0f / (exp_fast(2.0f * u) + 1.0f); }

using cpu_internal::BlasSingleThread;
using cpu_internal::Ld;
using cpu_internal::St;
using bf16_t = uint16_t;  // a bf16 activation: raw bits (base/bf16.h)

// Start of part j of [0, n) split into parts equal to within a multiple of 16.
inline int split(int n, int parts, int j) {
  if (j >= parts) return n;
  return std::min(n, (int)(((int64_t)n * j / parts + 8) / 16 * 16));
}

}  // namespace

void SetComputeThreads(int threads) {
  if (threads < 1) threads = 1;
  g_threads = threads;
  omp_set_num_threads(threads);
  openblas_set_num_threads(1);
}

int ComputeThreads() { return nthreads(); }

// ----------------------------------------------------------------------------------------------
// encoder: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]

namespace {
template <typename A>
void EncoderForward(A* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int64_t n = 0; n < (int64_t)B * T; n++) {
    const int t = (int)(n % T);
    A* o = out + n * C;
    const float* we = wte + (int64_t)tokens[n] * C;
    const float* pe = wpe + (int64_t)t * C;
#pragma omp simd
    for (int i = 0; i < C; i++) St(o, i, we[i] + pe[i]);  // vec: encoder_forward
  }
}

// dwte[tokens[b,t],:] += dout[b,t,:]  (scatter: each thread owns a channel slice, rows in order)
// dwpe[t,:] += sum_b dout[b,t,:]     (each thread owns positions t)
template <typename A>
void EncoderBackward(float* dwte, float* dwpe, const A* dout, const int32_t* tokens, int B, int T, int C) {
  const int nt = nthreads();
  const int chunk = ((C + nt - 1) / nt + 15) / 16 * 16;  // channel slice, multiple of 16 floats
  const int nchunks = (C + chunk - 1) / chunk;
#pragma omp parallel num_threads(nt)
  {
#pragma omp for schedule(static) nowait
    for (int j = 0; j < nchunks; j++) {
      const int c0 = j * chunk, c1 = std::min(C, c0 + chunk);
      for (int64_t n = 0; n < (int64_t)B * T; n++) {
        float* dw = dwte + (int64_t)tokens[n] * C;
        const A* d = dout + n * C;
#pragma omp simd
        for (int i = c0; i < c1; i++) dw[i] += Ld(d, i);  // vec: encoder_backward_wte
      }
    }
#pragma omp for schedule(static)
    for (int t = 0; t < T; t++) {
      float* dp = dwpe + (int64_t)t * C;
      for (int b = 0; b < B; b++) {
        const A* d = dout + ((int64_t)b * T + t) * C;
#pragma omp simd
        for (int i = 0; i < C; i++) dp[i] += Ld(d, i);  // vec: encoder_backward_wpe
      }
    }
  }
}
}  // namespace

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C) {
  EncoderForward(out, tokens, wte, wpe, B, T, C);
}
void encoder_forward(bf16_t* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C) {
  EncoderForward(out, tokens, wte, wpe, B, T, C);
}
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) {
  EncoderBackward(dwte, dwpe, dout, tokens, B, T, C);
}
void encoder_backward(float* dwte, float* dwpe, const bf16_t* dout, const int32_t* tokens, int B, int T, int C) {
  EncoderBackward(dwte, dwpe, dout, tokens, B, T, C);
}

// ----------------------------------------------------------------------------------------------
// layernorm: m = mean(x), v = mean((x-m)^2), rstd = 1/sqrt(v + 1e-5), y = (x-m)*rstd*w + b

namespace {
// One row of layernorm_forward; residual_layernorm_forward runs the same code, so the two are
// bitwise equal.
template <typename A>
inline void layernorm_row(A* y, float* mean, float* rstd, const A* x, const float* w, const float* b, int C) {
  const float eps = 1e-5f;
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < C; i++) s += Ld(x, i);  // vec: layernorm_mean
  const float m = s / C;
  float v = 0.0f;
#pragma omp simd reduction(+ : v)
  for (int i = 0; i < C; i++) v += (Ld(x, i) - m) * (Ld(x, i) - m);  // vec: layernorm_variance
  const float r = 1.0f / std::sqrt(v / C + eps);
#pragma omp simd
  for (int i = 0; i < C; i++) St(y, i, (Ld(x, i) - m) * r * w[i] + b[i]);  // vec: layernorm_normalise
  *mean = m;
  *rstd = r;
}

template <typename A>
void LayernormForward(A* out, float* mean, float* rstd, const A* inp, const float* w, const float* b, int N, int C) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int n = 0; n < N; n++)
    layernorm_row(out + (int64_t)n * C, mean + n, rstd + n, inp + (int64_t)n * C, w, b, C);
}

// res = a + b row by row, each row normalised while it is still in cache (at bf16 the
// LayerNorm reads the row as stored, rounded: what a separate layernorm_forward would read).
template <typename A>
void ResidualLayernormForward(A* res_out, A* ln_out, float* mean, float* rstd, const A* a, const A* b,
                              const float* w, const float* bias, int N, int C) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int n = 0; n < N; n++) {
    const int64_t o = (int64_t)n * C;
    A* x = res_out + o;
#pragma omp simd
    for (int i = 0; i < C; i++) St(x, i, Ld(a, o + i) + Ld(b, o + i));  // vec: residual_layernorm_add
    layernorm_row(ln_out + o, mean + n, rstd + n, x, w, bias, C);
  }
}
}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                       int C) {
  LayernormForward(out, mean, rstd, inp, w, b, N, C);
}
void layernorm_forward(bf16_t* out, float* mean, float* rstd, const bf16_t* inp, const float* w, const float* b,
                       int N, int C) {
  LayernormForward(out, mean, rstd, inp, w, b, N, C);
}
void residual_layernorm_forward(float* res_out, float* ln_out, float* mean, float* rstd, const float* a,
                                const float* b, const float* w, const float* bias, int N, int C) {
  ResidualLayernormForward(res_out, ln_out, mean, rstd, a, b, w, bias, N, C);
}
void residual_layernorm_forward(bf16_t* res_out, bf16_t* ln_out, float* mean, float* rstd, const bf16_t* a,
                                const bf16_t* b, const float* w, const float* bias, int N, int C) {
  ResidualLayernormForward(res_out, ln_out, mean, rstd, a, b, w, bias, N, C);
}

// norm = (x-m)*rstd, g = w*dout:
//   dinp += (g - mean(g) - norm * mean(g*norm)) * rstd;  dw += sum_n dout*norm;  db += sum_n dout
// dw/db: each thread sums its (static) rows into a private partial, partials added in thread order.
namespace {
template <typename A>
void LayernormBackward(A* dinp, float* dw, float* db, const A* dout, const A* inp, const float* w, const float* mean,
                       const float* rstd, int N, int C) {
  const int nt = nthreads();
  std::vector<float> partial((size_t)nt * 2 * C, 0.0f);  // [nt][dw C | db C]
#pragma omp parallel num_threads(nt)
  {
    float* pdw = partial.data() + (size_t)omp_get_thread_num() * 2 * C;
    float* pdb = pdw + C;
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      const A* x = inp + (int64_t)n * C;
      const A* d = dout + (int64_t)n * C;
      A* dx = dinp + (int64_t)n * C;
      const float m = mean[n], r = rstd[n];
      float g_mean = 0.0f, gn_mean = 0.0f;
#pragma omp simd reduction(+ : g_mean, gn_mean)
      for (int i = 0; i < C; i++) {  // vec: layernorm_backward_sums
        const float g = w[i] * Ld(d, i);
        g_mean += g;
        gn_mean += g * (Ld(x, i) - m) * r;
      }
      g_mean /= C;
      gn_mean /= C;
#pragma omp simd
      for (int i = 0; i < C; i++) {  // vec: layernorm_backward_dx
        const float norm = (Ld(x, i) - m) * r, di = Ld(d, i);
        pdb[i] += di;
        pdw[i] += norm * di;
        St(dx, i, Ld(dx, i) + (w[i] * di - g_mean - norm * gn_mean) * r);
      }
    }  // implicit barrier: all partials complete
    const int team = omp_get_num_threads();
#pragma omp for schedule(static)
    for (int i = 0; i < 2 * C; i++) {
      float s = 0.0f;
      for (int t = 0; t < team; t++) s += partial[(size_t)t * 2 * C + i];
      (i < C ? dw[i] : db[i - C]) += s;
    }
  }
}
}  // namespace

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C) {
  LayernormBackward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}
void layernorm_backward(bf16_t* dinp, float* dw, float* db, const bf16_t* dout, const bf16_t* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C) {
  LayernormBackward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

// ----------------------------------------------------------------------------------------------
// matmul: out[N,OC] = inp[N,C] @ w[OC,C]^T + bias[OC]

void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C, int OC) {
  BlasSingleThread single;
#pragma omp parallel num_threads(nthreads())
  {
    const int tid = omp_get_thread_num(), team = omp_get_num_threads();
    const float beta = bias ? 1.0f : 0.0f;  // out = bias, then sgemm accumulates onto it
    if (N >= OC) {  // each thread: rows [n0,n1) of out
      const int n0 = split(N, team, tid), n1 = split(N, team, tid + 1);
      if (bias)
        for (int n = n0; n < n1; n++) std::memcpy(out + (int64_t)n * OC, bias, sizeof(float) * OC);
      if (n1 > n0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n1 - n0, OC, C, 1.0f, inp + (int64_t)n0 * C, C, w, C,
                    beta, out + (int64_t)n0 * OC, OC);
    } else {  // each thread: columns [o0,o1) of out
      const int o0 = split(OC, team, tid), o1 = split(OC, team, tid + 1);
      if (bias)
        for (int n = 0; n < N; n++) std::memcpy(out + (int64_t)n * OC + o0, bias + o0, sizeof(float) * (o1 - o0));
      if (o1 > o0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, o1 - o0, C, 1.0f, inp, C, w + (int64_t)o0 * C, C, beta,
                    out + o0, OC);
    }
  }
}

// dinp[N,C] += dout[N,OC] @ w[OC,C];  dw[OC,C] += dout^T @ inp[N,C];  dbias[OC] += sum_n dout[n,:]
// (each output may be null: skipped). Each thread: rows [n0,n1) of dinp, rows [o0,o1) of dw and dbias (no cross-thread reduction).
void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                     int N, int C, int OC) {
  BlasSingleThread single;
#pragma omp parallel num_threads(nthreads())
  {
    const int tid = omp_get_thread_num(), team = omp_get_num_threads();
    const int n0 = split(N, team, tid), n1 = split(N, team, tid + 1);
    const int o0 = split(OC, team, tid), o1 = split(OC, team, tid + 1);
    if (dinp && n1 > n0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n1 - n0, C, OC, 1.0f, dout + (int64_t)n0 * OC, OC, w, C,
                  1.0f, dinp + (int64_t)n0 * C, C);
    if (o1 > o0) {
      if (dw)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, C, N, 1.0f, dout + o0, OC, inp, C, 1.0f,
                    dw + (int64_t)o0 * C, C);
      if (dbias)
        for (int n = 0; n < N; n++) {
          const float* d = dout + (int64_t)n * OC;
#pragma omp simd
          for (int o = o0; o < o1; o++) dbias[o] += d[o];  // vec: matmul_dbias
        }
    }
  }
}

// bf16 activations, fp32 products: the operands widened to fp32 (exact) and the fp32 kernel run
// on them; the result rounded once (dinp: bf16(fp32(dinp) + dout @ w)). The matmul's numbers
// are then the fp32 kernel's on the same values; the conversions are extra passes (at bf16
// precision, kernels_cpu_bf16.cc's matmuls take the bf16 operands directly instead).
namespace {
thread_local std::vector<float> t_act_a, t_act_b, t_act_c;
}  // namespace

void matmul_forward(bf16_t* out, const bf16_t* inp, const float* w, const float* bias, int N, int C, int OC) {
  const size_t NOC = (size_t)N * OC;
  float* o = cpu_internal::scratch(t_act_c, NOC);
  matmul_forward(o, cpu_internal::Widen(inp, (size_t)N * C, t_act_a), w, bias, N, C, OC);
  cpu_internal::Narrow(o, out, NOC);
}

void matmul_backward(bf16_t* dinp, float* dw, float* dbias, const bf16_t* dout, const bf16_t* inp, const float* w,
                     int N, int C, int OC) {
  const size_t NC = (size_t)N * C;
  const float* d = cpu_internal::Widen(dout, (size_t)N * OC, t_act_b);
  const float* x = dw ? cpu_internal::Widen(inp, NC, t_act_a) : nullptr;
  float* di = dinp ? cpu_internal::Widen(dinp, NC, t_act_c) : nullptr;
  matmul_backward(di, dw, dbias, d, x, w, N, C, OC);
  if (dinp) cpu_internal::Narrow(di, dinp, NC);
}

// ----------------------------------------------------------------------------------------------
// attention: the blocked causal attention of model/kernels_cpu_internal.h (maths there), with every
// score/value product a single-threaded cblas_sgemm inside the (b,h)-parallel OpenMP loop.

namespace {
struct SgemmPolicy {
  void operator()(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                  int ldb, float beta, float* C, int ldc) const {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda,
                B, ldb, beta, C, ldc);
  }
};
}  // namespace

namespace {
#ifdef __AVX512F__
Fp32Attention g_fp32_attention = Fp32Attention::kTiled;
#else
Fp32Attention g_fp32_attention = Fp32Attention::kSgemm;
#endif
}  // namespace

Fp32Attention Fp32AttentionFor(int T, int C, int NH, bool backward) {
  const bool tiled = g_fp32_attention == Fp32Attention::kTiled && cpu_internal::AttentionTiledFits(C, NH) &&
                     (!backward || T <= cpu_internal::kTiledAttentionBackwardMaxT);
  return tiled ? Fp32Attention::kTiled : Fp32Attention::kSgemm;
}

Fp32Attention CurrentFp32Attention() { return g_fp32_attention; }
void SetFp32Attention(Fp32Attention a) { g_fp32_attention = a; }
const char* Fp32AttentionName(Fp32Attention a) { return a == Fp32Attention::kTiled ? "tiled" : "sgemm"; }

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  if (Fp32AttentionFor(T, C, NH, /*backward=*/false) == Fp32Attention::kTiled)
    return cpu_internal::AttentionForwardTiled(nthreads(), out, lse, qkv, B, T, C, NH);
  BlasSingleThread single;
  cpu_internal::AttentionForward(SgemmPolicy{}, nthreads(), out, lse, qkv, B, T, C, NH);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int B,
                        int T, int C, int NH) {
  if (Fp32AttentionFor(T, C, NH, /*backward=*/true) == Fp32Attention::kTiled)
    return cpu_internal::AttentionBackwardTiled(nthreads(), dqkv, dout, qkv, out, lse, B, T, C, NH);
  BlasSingleThread single;
  cpu_internal::AttentionBackward(SgemmPolicy{}, nthreads(), dqkv, dout, qkv, out, lse, B, T, C, NH);
}

// bf16 activations: widened to fp32, the fp32 kernel, the outputs rounded once (as the matmuls).
void attention_forward(bf16_t* out, float* lse, const bf16_t* qkv, int B, int T, int C, int NH) {
  const size_t NC = (size_t)B * T * C;
  float* o = cpu_internal::scratch(t_act_c, NC);
  attention_forward(o, lse, cpu_internal::Widen(qkv, 3 * NC, t_act_a), B, T, C, NH);
  cpu_internal::Narrow(o, out, NC);
}

void attention_backward(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv, const bf16_t* out, const float* lse,
                        int B, int T, int C, int NH) {
  const size_t NC = (size_t)B * T * C;
  std::vector<float> o(NC), d(NC);  // two more operands than the matmuls: not worth thread_local
  cpu_internal::Widen(out, NC, o), cpu_internal::Widen(dout, NC, d);
  float* dq = cpu_internal::Widen(dqkv, 3 * NC, t_act_c);
  attention_backward(dq, d.data(), cpu_internal::Widen(qkv, 3 * NC, t_act_a), o.data(), lse, B, T, C, NH);
  cpu_internal::Narrow(dq, dqkv, 3 * NC);
}

// ----------------------------------------------------------------------------------------------
// gelu (tanh approximation): y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
//   dy/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)

namespace {
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr size_t kElemChunk = 16384;           // elementwise kernels: rows of this many floats
inline int64_t elem_chunks(size_t n) { return (int64_t)((n + kElemChunk - 1) / kElemChunk); }

// The flags of these kernels are template parameters, never tested inside a vectorised loop:
// a run-time select in a masked loop costs some CPUs (AMD Zen 4) an order of magnitude.
// kKeepInput: pre = inp as out's type as well (the epilogue's copy of the GELU's input).
template <bool kKeepInput, typename I, typename O>
void GeluForward(O* out, const I* inp, size_t n, O* pre) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int64_t j = 0; j < elem_chunks(n); j++) {
    const size_t i0 = j * kElemChunk, i1 = std::min(n, i0 + kElemChunk);
#pragma omp simd
    for (size_t i = i0; i < i1; i++) {  // vec: gelu_forward
      const float x = Ld(inp, i);
      if constexpr (kKeepInput) St(pre, i, x);
      St(out, i, 0.5f * x * (1.0f + tanh_fast(kGeluS * (x + 0.044715f * x * x * x))));
    }
  }
}

// kAccumulate: dinp += dout * gelu'(inp); else dinp = dout * gelu'(inp) (the epilogue's).
template <bool kAccumulate, typename A, typename G>
void GeluBackward(A* dinp, const A* inp, const G* dout, size_t n) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int64_t j = 0; j < elem_chunks(n); j++) {
    const size_t i0 = j * kElemChunk, i1 = std::min(n, i0 + kElemChunk);
#pragma omp simd
    for (size_t i = i0; i < i1; i++) {  // vec: gelu_backward
      const float x = Ld(inp, i);
      const float th = tanh_fast(kGeluS * (x + 0.044715f * x * x * x));
      const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluS * (1.0f + 3.0f * 0.044715f * x * x);
      if constexpr (kAccumulate) St(dinp, i, Ld(dinp, i) + grad * Ld(dout, i));
      else St(dinp, i, 0.0f + grad * Ld(dout, i));  // (0 +: a -0 product stores +0)
    }
  }
}

template <typename A>
void ResidualForward(A* out, const A* a, const A* b, size_t n) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int64_t j = 0; j < elem_chunks(n); j++) {
    const size_t i0 = j * kElemChunk, i1 = std::min(n, i0 + kElemChunk);
#pragma omp simd
    for (size_t i = i0; i < i1; i++) St(out, i, Ld(a, i) + Ld(b, i));  // vec: residual_forward
  }
}
}  // namespace

void gelu_forward(float* out, const float* inp, size_t n) { GeluForward<false>(out, inp, n, out); }
void gelu_forward(bf16_t* out, const bf16_t* inp, size_t n) { GeluForward<false>(out, inp, n, out); }
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  GeluBackward</*kAccumulate=*/true>(dinp, inp, dout, n);
}
void gelu_backward(bf16_t* dinp, const bf16_t* inp, const bf16_t* dout, size_t n) {
  GeluBackward</*kAccumulate=*/true>(dinp, inp, dout, n);
}
void gelu_epilogue_forward(float* out, float* pre, const float* x, size_t n) { GeluForward<true>(out, x, n, pre); }
void gelu_epilogue_forward(bf16_t* out, bf16_t* pre, const float* x, size_t n) { GeluForward<true>(out, x, n, pre); }
void gelu_epilogue_backward(float* dinp, const float* pre, const float* x, size_t n) {
  GeluBackward</*kAccumulate=*/false>(dinp, pre, x, n);
}
void gelu_epilogue_backward(bf16_t* dinp, const bf16_t* pre, const float* x, size_t n) {
  GeluBackward</*kAccumulate=*/false>(dinp, pre, x, n);
}

// ----------------------------------------------------------------------------------------------
// residual: out = a + b;  backward: da += dout, db += dout

void residual_forward(float* out, const float* a, const float* b, size_t n) { ResidualForward(out, a, b, n); }
void residual_forward(bf16_t* out, const bf16_t* a, const bf16_t* b, size_t n) { ResidualForward(out, a, b, n); }

void residual_backward(float* da, float* db, const float* dout, size_t n) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int64_t j = 0; j < elem_chunks(n); j++) {
    const size_t i0 = j * kElemChunk, i1 = std::min(n, i0 + kElemChunk);
#pragma omp simd
    for (size_t i = i0; i < i1; i++) {  // vec: residual_backward
      da[i] += dout[i];
      db[i] += dout[i];
    }
  }
}

// ----------------------------------------------------------------------------------------------
// crossentropy over the real columns [0,V) of logits[N,Vp]:
//   lse = log sum_v exp(x_v);  loss = lse - x[target];  dx_v = (exp(x_v - lse) - [v == target]) * dloss_scale
// (dx written in place; padded columns [V,Vp) get 0).

namespace {
// bf16 logits: the probabilities are not stored between passes (a bf16 intermediate would be
// rounded twice): exp is taken again in the writing pass and each dlogit rounded once.
void CrossentropyRowBf16(bf16_t* x, float* loss, int tgt, int V, int Vp, float dloss_scale) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int i = 0; i < V; i++) mx = mx > Ld(x, i) ? mx : Ld(x, i);  // vec: crossentropy_bf16_max
  const float xt = Ld(x, tgt);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int i = 0; i < V; i++) sum += exp_fast(Ld(x, i) - mx);  // vec: crossentropy_bf16_sum
  if (dloss_scale != 0.0f) {
    const float mul = dloss_scale / sum;
#pragma omp simd
    for (int i = 0; i < V; i++) St(x, i, exp_fast(Ld(x, i) - mx) * mul);  // vec: crossentropy_bf16_gradient
    St(x, tgt, exp_fast(xt - mx) * mul - dloss_scale);
    for (int i = V; i < Vp; i++) x[i] = 0;
  }
  *loss = mx + std::log(sum) - xt;
}
}  // namespace

double crossentropy_softmax(bf16_t* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                            float dloss_scale) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int n = 0; n < N; n++) CrossentropyRowBf16(logits + (int64_t)n * Vp, losses + n, targets[n], V, Vp, dloss_scale);
  double total = 0.0;  // serial, fixed order
  for (int n = 0; n < N; n++) total += losses[n];
  return total;
}

double crossentropy_softmax(float* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                            float dloss_scale) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int n = 0; n < N; n++) {
    float* x = logits + (int64_t)n * Vp;
    const int tgt = targets[n];
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int i = 0; i < V; i++) mx = mx > x[i] ? mx : x[i];  // vec: crossentropy_max
    float sum = 0.0f;
    const float xt = x[tgt];
    if (dloss_scale != 0.0f) {
#pragma omp simd reduction(+ : sum)
      for (int i = 0; i < V; i++) {  // vec: crossentropy_exp
        x[i] = exp_fast(x[i] - mx);
        sum += x[i];
      }
      const float mul = dloss_scale / sum;
#pragma omp simd
      for (int i = 0; i < V; i++) x[i] *= mul;  // vec: crossentropy_gradient
      x[tgt] -= dloss_scale;
      for (int i = V; i < Vp; i++) x[i] = 0.0f;
    } else {
#pragma omp simd reduction(+ : sum)
      for (int i = 0; i < V; i++) sum += exp_fast(x[i] - mx);  // vec: crossentropy_sum
    }
    losses[n] = mx + std::log(sum) - xt;
  }
  double total = 0.0;  // serial, fixed order
  for (int n = 0; n < N; n++) total += losses[n];
  return total;
}

void add_mean_loss(double* loss_acc, const float* losses, int N) {
  double total = 0.0;  // serial, fixed order (crossentropy_softmax's)
  for (int n = 0; n < N; n++) total += losses[n];
  *loss_acc += static_cast<float>(total / N);
}

// ---- element-wise kernels of the engine ----

namespace {
// f(i0, i1) over [0, n) in fixed chunks across the compute threads (memory-bound passes: one
// thread does not reach the machine's bandwidth).
template <typename F>
void ForChunks(size_t n, F f) {
  constexpr size_t kChunk = size_t{1} << 16;
  const int64_t chunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static) num_threads(nthreads()) if (chunks > 1)
  for (int64_t j = 0; j < chunks; j++) {
    const size_t i0 = static_cast<size_t>(j) * kChunk;
    f(i0, std::min(n, i0 + kChunk));
  }
}
// dst += src for one (destination, source) pair of element types: branch-free, so it vectorises.
inline float AsFloat(float v) { return v; }
inline float AsFloat(uint16_t v) { return Bf16ToFloat(v); }
inline void AddInto(float* d, float s) { *d += s; }
inline void AddInto(uint16_t* d, float s) { *d = FloatToBf16(Bf16ToFloat(*d) + s); }
template <typename D, typename S>
void AccumulateAs(void* dst, const void* src, size_t n) {
  D* d = static_cast<D*>(dst);
  const S* s = static_cast<const S*>(src);
  ForChunks(n, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; i++) AddInto(d + i, AsFloat(s[i]));  // vec: accumulate
  });
}
}  // namespace

void convert(const void* src, DType from, void* dst, DType to, size_t n) {
  if (from == to) {
    ForChunks(n * DTypeSize(from), [&](size_t b0, size_t b1) {
      std::memcpy(static_cast<char*>(dst) + b0, static_cast<const char*>(src) + b0, b1 - b0);
    });
  } else if (from == DType::kF32) {
    ForChunks(n, [&](size_t i0, size_t i1) {
      FloatToBf16(static_cast<const float*>(src) + i0, static_cast<uint16_t*>(dst) + i0, i1 - i0);  // vec: convert_to_bf16
    });
  } else {
    ForChunks(n, [&](size_t i0, size_t i1) {
      Bf16ToFloat(static_cast<const uint16_t*>(src) + i0, static_cast<float*>(dst) + i0, i1 - i0);  // vec: convert_to_f32
    });
  }
}

void accumulate(void* dst, DType dtype, const void* src, DType src_dtype, size_t n) {
  const bool d32 = dtype == DType::kF32, s32 = src_dtype == DType::kF32;
  if (d32 && s32) AccumulateAs<float, float>(dst, src, n);
  else if (d32) AccumulateAs<float, uint16_t>(dst, src, n);
  else if (s32) AccumulateAs<uint16_t, float>(dst, src, n);
  else AccumulateAs<uint16_t, uint16_t>(dst, src, n);
}

namespace {
// Sum of squares over fixed blocks: each block of kSumSquaresBlock elements is summed with K
// independent double accumulators (the loop vectorises; one chain of dependent adds runs at
// one add per ~4 cycles, far below memory speed), the blocks' sums are added in index order.
// K = 8 for fp32 and 16 for bf16 (the bf16 loop's widening is a shift: it needs twice the
// accumulators to run at the fp32 loop's elements per second).
// The blocks do not depend on the thread count, so the result is the same bits on any number
// of threads (an OpenMP reduction combines the threads' partials in no fixed order).
constexpr size_t kSumSquaresBlock = 1 << 15;
inline double Widen(float v) { return v; }
inline double Widen(uint16_t v) { return Bf16ToFloat(v); }
template <typename T>
double SumSquaresBlock(const T* x, size_t n) {
  constexpr int K = sizeof(T) == 2 ? 16 : 8;
  double acc[K] = {};
  size_t i = 0;
  for (; i + K <= n; i += K)
    for (int j = 0; j < K; j++) {
      const double v = Widen(x[i + j]);
      acc[j] += v * v;
    }
  for (; i < n; i++) {
    const double v = Widen(x[i]);
    acc[0] += v * v;
  }
  for (int w = K / 2; w >= 1; w /= 2)  // pairwise: ((a0 + a1) + (a2 + a3)) + ... for K = 8
    for (int j = 0; j < w; j++) acc[j] = acc[2 * j] + acc[2 * j + 1];
  return acc[0];
}
template <typename T>
double SumSquares(const T* x, size_t n) {
  const size_t blocks = (n + kSumSquaresBlock - 1) / kSumSquaresBlock;
  if (blocks <= 1) return SumSquaresBlock(x, n);
  std::vector<double> part(blocks);
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (size_t b = 0; b < blocks; b++)
    part[b] = SumSquaresBlock(x + b * kSumSquaresBlock, std::min(kSumSquaresBlock, n - b * kSumSquaresBlock));
  double ss = 0;
  for (double v : part) ss += v;
  return ss;
}
}  // namespace

double sum_squares(const void* x, DType dtype, size_t n) {
  return dtype == DType::kF32 ? SumSquares(static_cast<const float*>(x), n)
                              : SumSquares(static_cast<const uint16_t*>(x), n);
}

void sum_f64(double* dst, const double* src, size_t n, double divisor) {
  double total = 0.0;
  for (size_t i = 0; i < n; i++) total += src[i];
  *dst = total / divisor;
}

namespace {
// adamw_mixed for one (gradient type, stored form): the branches are template arguments so
// each loop is straight-line and vectorises (the bf16 widening is a shift, the narrowing RNE
// integer arithmetic, base/bf16.h).
enum class StoreAs { kNothing, kF32, kBf16 };
inline float GradAt(const float* g, size_t i) { return g[i]; }
inline float GradAt(const uint16_t* g, size_t i) { return Bf16ToFloat(g[i]); }
template <typename G, StoreAs S>
void AdamWMixedLoop(float* master, void* stored, const G* grad, float* m, float* v, size_t n, float lr, float wd,
                    const AdamWConfig& cfg, int64_t t, float grad_scale) {
  const float b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps;
  const float c1 = AdamWC1(cfg, t), c2 = AdamWC2(cfg, t);
#pragma omp parallel for simd schedule(static) num_threads(nthreads())
  for (size_t i = 0; i < n; i++) {  // vec: adamw_mixed
    adamw_element(master + i, GradAt(grad, i), m + i, v + i, lr, wd, b1, b2, eps, c1, c2, grad_scale);
    if constexpr (S == StoreAs::kBf16) static_cast<uint16_t*>(stored)[i] = FloatToBf16(master[i]);
    if constexpr (S == StoreAs::kF32) static_cast<float*>(stored)[i] = master[i];
  }
}
template <typename G>
void AdamWMixedStore(float* master, void* stored, DType stored_dtype, const G* grad, float* m, float* v, size_t n,
                     float lr, float wd, const AdamWConfig& cfg, int64_t t, float grad_scale) {
  if (stored_dtype == DType::kBF16)
    AdamWMixedLoop<G, StoreAs::kBf16>(master, stored, grad, m, v, n, lr, wd, cfg, t, grad_scale);
  else if (stored == master)
    AdamWMixedLoop<G, StoreAs::kNothing>(master, stored, grad, m, v, n, lr, wd, cfg, t, grad_scale);
  else
    AdamWMixedLoop<G, StoreAs::kF32>(master, stored, grad, m, v, n, lr, wd, cfg, t, grad_scale);
}
}  // namespace

void adamw_mixed(float* master, void* stored, DType stored_dtype, const void* grad, DType grad_dtype, float* m,
                 float* v, size_t n, float lr, float weight_decay, const AdamWConfig& cfg, int64_t t,
                 float grad_scale) {
  if (grad_dtype == DType::kBF16)
    AdamWMixedStore(master, stored, stored_dtype, static_cast<const uint16_t*>(grad), m, v, n, lr, weight_decay, cfg,
                    t, grad_scale);
  else
    AdamWMixedStore(master, stored, stored_dtype, static_cast<const float*>(grad), m, v, n, lr, weight_decay, cfg, t,
                    grad_scale);
}

// The expressions of Engine::Step's host path, so both give the same factor.
void clip_factor(float* out, const double* ss, float grad_clip) {
  const float norm = static_cast<float>(std::sqrt(*ss));
  out[0] = norm;
  out[1] = (grad_clip > 0 && norm > grad_clip) ? grad_clip / (norm + 1e-6f) : 1.0f;
}

}  // namespace shardgpt
