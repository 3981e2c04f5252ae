// Private to the CPU backend (kernels_cpu.cc, kernels_cpu_bf16.cc, attention_cpu_tiled.cc and
// cpu_device.cc; nothing outside model/ includes it): the helpers they share, and the causal
// attention forward and backward written once over a GEMM policy, so that the fp32 kernels (OpenBLAS sgemm) and
// the bf16 kernels (oneDNN, inputs rounded to bf16, fp32 accumulation) share every line of the
// blocking, the masking and the fp32 softmax; only the score/value products differ.
//
// A Gemm policy is a callable with cblas_sgemm's row-major signature:
//   gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc):
//   C[M,N] (ldc) = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C
// called from inside the (batch, head)-parallel OpenMP loop: it must be single-threaded and
// safe to call from several threads at once (per-thread scratch).
//
// Maths (per (b,h), q,k,v,o,dO the [T,hs] slices of that head, row stride 3C or C):
//   forward:  S = q k^T * scale (causal: s <= t);  lse_t = log sum_s exp(S_ts);  P = exp(S - lse);
//             o = P v.  Saves only o and lse.
//   backward: P recomputed from q, k and lse;  dv += P^T dO;  dP = dO v^T;  D_t = dO_t . o_t;
//             dS = P * (dP - D);  dq += dS k * scale;  dk += dS^T q * scale.
// Rows go in blocks of AttentionBlock(T) so that the products skip most of the masked upper
// triangle; the [T,T] score tiles are per-thread scratch, their softmax rows in whole groups of
// 16 lanes (CausalRowExp).
#pragma once

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "base/bf16.h"
#include "model/kernels_cpu.h"

namespace shardgpt {
namespace cpu_internal {

// Activation storage: fp32, or bf16 as raw bits. Ld widens (exact), St rounds to nearest even
// (FloatToBf16); the kernels templated over the storage type do all maths in fp32 between them.
inline float Ld(const float* p, int64_t i) { return p[i]; }
inline float Ld(const uint16_t* p, int64_t i) { return Bf16ToFloat(p[i]); }
inline void St(float* p, int64_t i, float v) { p[i] = v; }
inline void St(uint16_t* p, int64_t i, float v) { p[i] = FloatToBf16(v); }

// buf[0, n) = fp32(src) (exact); OpenMP over chunks (call outside parallel regions).
inline float* Widen(const uint16_t* src, size_t n, std::vector<float>& buf) {
  if (buf.size() < n) buf.resize(n);
  float* dst = buf.data();
#pragma omp parallel for simd schedule(static) num_threads(ComputeThreads())
  for (size_t i = 0; i < n; i++) dst[i] = Bf16ToFloat(src[i]);  // vec: widen
  return dst;
}
// dst = bf16(src), rounded to nearest even.
inline void Narrow(const float* src, uint16_t* dst, size_t n) {
#pragma omp parallel for simd schedule(static) num_threads(ComputeThreads())
  for (size_t i = 0; i < n; i++) dst[i] = FloatToBf16(src[i]);  // vec: narrow
}

// exp(x) for the softmaxes and tanh: Cephes range reduction + degree-6 polynomial (rel. error
// ~2 ulp on [-87, 88]; inputs are clamped there). Plain float ops only, so loops that call it
// vectorise (glibc's expf does not without -ffast-math).
inline float exp_fast(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to the nearest integer
  const float t = x * 1.44269504088896341f + magic;  // bits: 0x4B400000 + round(x / ln 2)
  float n = t - magic;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  // 2^n from t's bits, not from a float -> int conversion: a NaN input (a diverged run) must
  // give NaN, and converting NaN to int is undefined behaviour.
  const uint32_t bits = (__builtin_bit_cast(uint32_t, t) - 0x4B400000u + 127u) << 23;
  return y * __builtin_bit_cast(float, bits);
}

// Keeps OpenBLAS single-threaded while alive: sgemm is called from inside OpenMP regions.
// (SetComputeThreads already sets 1; this guards against someone else having changed it.)
struct BlasSingleThread {
  int saved = openblas_get_num_threads();
  BlasSingleThread() {
    if (saved != 1) openblas_set_num_threads(1);
  }
  ~BlasSingleThread() {
    if (saved != 1) openblas_set_num_threads(saved);
  }
};

// Per-thread scratch, grown on demand.
template <typename T>
T* scratch(std::vector<T>& buf, size_t n) {
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// Row block: 32 for short sequences, 64 otherwise (full-T blocks, which skip nothing of the
// masked triangle, are slower at T=256).
inline int AttentionBlock(int T) { return T <= 128 ? 32 : 64; }

// The softmax loops over a causal row t run in whole groups of kRowGroup lanes, up to
// RowGroupEnd(t), the lanes past t masked, so that no loop has a scalar remainder of up to 15
// exps (a loop over s <= t would). The score tiles' rows are
// RowStride(T) floats apart, so that a row's last group stays inside it; lanes in
// [r1, RowGroupEnd) hold no score (never read unmasked).
constexpr int kRowGroup = 16;
inline int RowGroupEnd(int t) { return (t + kRowGroup) / kRowGroup * kRowGroup; }
inline int RowStride(int T) { return (T + kRowGroup - 1) / kRowGroup * kRowGroup; }

// max over row[0..t]
inline float CausalRowMax(const float* row, int t) {
  float lane[kRowGroup];
  for (int j = 0; j < kRowGroup; j++) lane[j] = -INFINITY;
  for (int s0 = 0; s0 <= t; s0 += kRowGroup) {
#pragma omp simd
    for (int j = 0; j < kRowGroup; j++) {  // vec: causal_row_max
      const float x = s0 + j <= t ? row[s0 + j] : -INFINITY;
      lane[j] = lane[j] > x ? lane[j] : x;  // (std::max does not vectorise)
    }
  }
  float mx = lane[0];
  for (int j = 1; j < kRowGroup; j++) mx = mx > lane[j] ? mx : lane[j];
  return mx;
}

// row[s] = exp(row[s] - shift) for s <= t, 0 for the rest of t's group; returns the sum.
inline float CausalRowExp(float* row, int t, float shift) {
  float lane[kRowGroup] = {};
  for (int s0 = 0; s0 <= t; s0 += kRowGroup) {
#pragma omp simd
    for (int j = 0; j < kRowGroup; j++) {  // vec: causal_row_exp
      const float e = exp_fast(row[s0 + j] - shift);
      row[s0 + j] = s0 + j <= t ? e : 0.0f;
      lane[j] += row[s0 + j];
    }
  }
  float sum = 0.0f;
  for (int j = 0; j < kRowGroup; j++) sum += lane[j];
  return sum;
}

// The backward's row t: D = o_t . dO_t; p[s] = exp(p[s] - lse) (the score row in, P out) and
// ds[s] = p[s] (ds[s] - D) (dP in, dS out) for s <= t; both 0 for the rest of t's group.
inline void CausalRowGradient(float* p, float* ds, int t, float lse, const float* o, const float* dO, int hs) {
  float D = 0.0f;
#pragma omp simd reduction(+ : D)
  for (int i = 0; i < hs; i++) D += o[i] * dO[i];  // vec: causal_row_gradient_d
  const int end = RowGroupEnd(t);
  for (int s0 = 0; s0 < end; s0 += kRowGroup) {
#pragma omp simd
    for (int j = 0; j < kRowGroup; j++) {  // vec: causal_row_gradient
      const bool in = s0 + j <= t;
      const float e = exp_fast(p[s0 + j] - lse);
      p[s0 + j] = in ? e : 0.0f;
      ds[s0 + j] = in ? e * (ds[s0 + j] - D) : 0.0f;
    }
  }
}

inline thread_local std::vector<float> t_att_p, t_att_dp;

// out[B,T,C] (writes), lse[B,NH,T] (writes) from qkv[B,T,3C]; threads: OpenMP over (b,h).
template <class Gemm>
void AttentionForward(const Gemm& gemm, int threads, float* out, float* lse, const float* qkv, int B, int T, int C,
                      int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt((float)hs);
  const int bs = AttentionBlock(T);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const float* q = qkv + (int64_t)b * T * C3 + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* o = out + (int64_t)b * T * C + h * hs;
    float* l = lse + (int64_t)bh * T;
    const int ld = RowStride(T);
    float* S = scratch(t_att_p, (size_t)T * ld);
    for (int r0 = 0; r0 < T; r0 += bs) {
      const int r1 = std::min(T, r0 + bs);
      // S[r0:r1, 0:r1] = q[r0:r1] k[0:r1]^T * scale
      gemm(false, true, r1 - r0, r1, hs, scale, q + (int64_t)r0 * C3, C3, k, C3, 0.0f, S + (int64_t)r0 * ld, ld);
      for (int t = r0; t < r1; t++) {
        float* row = S + (int64_t)t * ld;
        const float mx = CausalRowMax(row, t);
        const float sum = CausalRowExp(row, t, mx);
        const float inv = 1.0f / sum;
        const int end = RowGroupEnd(t);
        for (int s0 = 0; s0 < end; s0 += kRowGroup) {
#pragma omp simd
          for (int j = 0; j < kRowGroup; j++) row[s0 + j] *= inv;  // vec: attention_normalise
        }
        for (int s = end; s < r1; s++) row[s] = 0.0f;
        l[t] = mx + std::log(sum);
      }
      // o[r0:r1] = P[r0:r1, 0:r1] v[0:r1]
      gemm(false, false, r1 - r0, hs, r1, 1.0f, S + (int64_t)r0 * ld, ld, v, C3, 0.0f, o + (int64_t)r0 * C, C);
    }
  }
}

// dqkv[B,T,3C] +=; needs the forward's out and lse.
template <class Gemm>
void AttentionBackward(const Gemm& gemm, int threads, float* dqkv, const float* dout, const float* qkv,
                       const float* out, const float* lse, int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt((float)hs);
  const int bs = AttentionBlock(T);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const int64_t qoff = (int64_t)b * T * C3 + h * hs, ooff = (int64_t)b * T * C + h * hs;
    const float *q = qkv + qoff, *k = q + C, *v = q + 2 * C;
    float *dq = dqkv + qoff, *dk = dq + C, *dv = dq + 2 * C;
    const float *o = out + ooff, *dO = dout + ooff;
    const float* l = lse + (int64_t)bh * T;
    const int ld = RowStride(T);
    float* P = scratch(t_att_p, (size_t)T * ld);
    float* dS = scratch(t_att_dp, (size_t)T * ld);
    for (int r0 = 0; r0 < T; r0 += bs) {
      const int r1 = std::min(T, r0 + bs), m = r1 - r0;
      float* Pb = P + (int64_t)r0 * ld;
      float* dSb = dS + (int64_t)r0 * ld;
      // P = exp(q k^T * scale - lse), dP = dO v^T
      gemm(false, true, m, r1, hs, scale, q + (int64_t)r0 * C3, C3, k, C3, 0.0f, Pb, ld);
      gemm(false, true, m, r1, hs, 1.0f, dO + (int64_t)r0 * C, C, v, C3, 0.0f, dSb, ld);
      for (int t = r0; t < r1; t++) {
        float* p = P + (int64_t)t * ld;
        float* ds = dS + (int64_t)t * ld;
        CausalRowGradient(p, ds, t, l[t], o + (int64_t)t * C, dO + (int64_t)t * C, hs);
        for (int s = RowGroupEnd(t); s < r1; s++) p[s] = ds[s] = 0.0f;
      }
      // dq[r0:r1] += dS[r0:r1, 0:r1] k[0:r1] * scale
      gemm(false, false, m, hs, r1, scale, dSb, ld, k, C3, 1.0f, dq + (int64_t)r0 * C3, C3);
    }
    // column blocks c: only rows t >= c0 have nonzero P/dS in columns [c0,c1)
    for (int c0 = 0; c0 < T; c0 += bs) {
      const int c1 = std::min(T, c0 + bs);
      // dv[c0:c1] += P[c0:T, c0:c1]^T dO[c0:T];  dk[c0:c1] += dS[c0:T, c0:c1]^T q[c0:T] * scale
      gemm(true, false, c1 - c0, hs, T - c0, 1.0f, P + (int64_t)c0 * ld + c0, ld, dO + (int64_t)c0 * C, C, 1.0f,
           dv + (int64_t)c0 * C3, C3);
      gemm(true, false, c1 - c0, hs, T - c0, scale, dS + (int64_t)c0 * ld + c0, ld, q + (int64_t)c0 * C3, C3, 1.0f,
           dk + (int64_t)c0 * C3, C3);
    }
  }
}

}  // namespace cpu_internal
}  // namespace shardgpt
