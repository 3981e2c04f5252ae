// CPU kernels of the Llama block (model/kernels_cpu_llama.h): RMSNorm, rotary embeddings,
// SwiGLU and grouped-query key/value sharing, fp32 and bf16 activations.
//
// Each kernel is written once, templated over the activation storage A (float, or bf16 bits as
// uint16_t) with cpu_internal's Ld (widen, exact) and St (round to nearest even); all maths is
// fp32 between them (the RMSNorm statistic in double). Rows are split across OpenMP's pool
// (static schedules, ComputeThreads() threads) and inner loops are `omp simd`, marked `// vec:`
// for scripts/check-vectorization.sh. Variants that differ inside a vectorised loop (RoPE's
// direction) are template parameters, not run-time flags.
//
// Determinism: for a fixed thread count every kernel is bitwise reproducible: no atomics; the
// RMSNorm weight gradient goes through per-thread partials added in thread order.
#include "model/kernels_cpu_llama.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "base/bf16.h"
#include "model/kernels_cpu.h"
#include "model/kernels_cpu_internal.h"

namespace shardgpt {

namespace {

using cpu_internal::exp_fast;
using cpu_internal::Ld;
using cpu_internal::St;
using bf16_t = uint16_t;  // a bf16 activation: raw bits (base/bf16.h)

inline int nthreads() { return ComputeThreads(); }

// ----------------------------------------------------------------------------------------------
// RMSNorm: rstd = 1/sqrt(mean(x^2) + eps), y = x * rstd * w

template <typename A>
void RmsnormForward(A* out, float* rstd, const A* inp, const float* w, int N, int C, float eps) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int n = 0; n < N; n++) {
    const A* x = inp + (int64_t)n * C;
    A* y = out + (int64_t)n * C;
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < C; i++) {  // vec: rmsnorm_sum_squares
      const double v = Ld(x, i);
      ss += v * v;
    }
    const float r = (float)(1.0 / std::sqrt(ss / C + (double)eps));
#pragma omp simd
    for (int i = 0; i < C; i++) St(y, i, Ld(x, i) * r * w[i]);  // vec: rmsnorm_normalise
    rstd[n] = r;
  }
}

// g = dout * w:  dinp += rstd (g - x rstd^2 mean(g x));  dw += sum_n dout x rstd.
// dw: each thread sums its (static) rows into a private partial, partials added in thread order.
template <typename A>
void RmsnormBackward(A* dinp, float* dw, const A* dout, const A* inp, const float* w, const float* rstd, int N,
                     int C) {
  const int nt = nthreads();
  std::vector<float> partial((size_t)nt * C, 0.0f);  // [nt][C]
#pragma omp parallel num_threads(nt)
  {
    float* pdw = partial.data() + (size_t)omp_get_thread_num() * C;
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      const A* x = inp + (int64_t)n * C;
      const A* d = dout + (int64_t)n * C;
      A* dx = dinp + (int64_t)n * C;
      const float r = rstd[n];
      float gx = 0.0f;
#pragma omp simd reduction(+ : gx)
      for (int i = 0; i < C; i++) gx += w[i] * Ld(d, i) * Ld(x, i);  // vec: rmsnorm_backward_dot
      const float k = r * r * (gx / C);
#pragma omp simd
      for (int i = 0; i < C; i++) {  // vec: rmsnorm_backward_dx
        const float xi = Ld(x, i), di = Ld(d, i);
        pdw[i] += di * xi * r;
        St(dx, i, Ld(dx, i) + r * (w[i] * di - xi * k));
      }
    }  // implicit barrier: all partials complete
    const int team = omp_get_num_threads();
#pragma omp for schedule(static)
    for (int i = 0; i < C; i++) {
      float s = 0.0f;
      for (int t = 0; t < team; t++) s += partial[(size_t)t * C + i];
      dw[i] += s;
    }
  }
}

// ----------------------------------------------------------------------------------------------
// RoPE (rotate-half). The angle table cs[t][i] = cos, sn[t][i] = sin of t * inv_freq[i], in fp32
// as transformers computes them: inv_freq = 1 / theta^(float(2i) / hs), a = float(t) * inv_freq.

void RopeTables(std::vector<float>& cs, std::vector<float>& sn, int T, int hs, float theta) {
  const int h2 = hs / 2;
  std::vector<float> inv_freq(h2);
  for (int i = 0; i < h2; i++) inv_freq[i] = 1.0f / std::pow(theta, (float)(2 * i) / (float)hs);
  cs.resize((size_t)T * h2);
  sn.resize((size_t)T * h2);
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int t = 0; t < T; t++)
    for (int i = 0; i < h2; i++) {
      const float a = (float)t * inv_freq[i];
      cs[(size_t)t * h2 + i] = std::cos(a);
      sn[(size_t)t * h2 + i] = std::sin(a);
    }
}

// Forward rotates by +a, backward (kInverse) by -a. Query and key heads of each row: the first
// (NH + KV) heads of the row.
template <bool kInverse, typename A>
void Rope(A* qkv, int B, int T, int NH, int KV, int hs, float theta) {
  const int h2 = hs / 2, W = (NH + 2 * KV) * hs, heads = NH + KV;
  std::vector<float> cs, sn;
  RopeTables(cs, sn, T, hs, theta);
  const int64_t N = (int64_t)B * T;
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int64_t n = 0; n < N; n++) {
    const int t = (int)(n % T);
    const float* c = cs.data() + (size_t)t * h2;
    const float* s = sn.data() + (size_t)t * h2;
    for (int h = 0; h < heads; h++) {
      A* lo = qkv + n * W + (int64_t)h * hs;  // [0, hs/2) and [hs/2, hs): disjoint halves
      A* hi = lo + h2;
#pragma omp simd
      for (int i = 0; i < h2; i++) {  // vec: rope_rotate
        const float x0 = Ld(lo, i), x1 = Ld(hi, i);
        const float si = kInverse ? -s[i] : s[i];
        St(lo, i, x0 * c[i] - x1 * si);
        St(hi, i, x1 * c[i] + x0 * si);
      }
    }
  }
}

// ----------------------------------------------------------------------------------------------
// SwiGLU: out = silu(g) u, silu(g) = g / (1 + exp(-g)); exp_fast so that the loops vectorise.

template <typename A>
void SwigluForward(A* out, const A* gate_up, int N, int F) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int n = 0; n < N; n++) {
    const A* g = gate_up + (int64_t)n * 2 * F;
    const A* u = g + F;
    A* o = out + (int64_t)n * F;
#pragma omp simd
    for (int i = 0; i < F; i++) {  // vec: swiglu_forward
      const float gi = Ld(g, i);
      St(o, i, gi / (1.0f + exp_fast(-gi)) * Ld(u, i));
    }
  }
}

// s = sigmoid(g): dgate += dout u s (1 + g (1 - s));  dup += dout g s.
template <typename A>
void SwigluBackward(A* dgate_up, const A* gate_up, const A* dout, int N, int F) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int n = 0; n < N; n++) {
    const A* g = gate_up + (int64_t)n * 2 * F;
    const A* u = g + F;
    A* dg = dgate_up + (int64_t)n * 2 * F;
    A* du = dg + F;
    const A* d = dout + (int64_t)n * F;
#pragma omp simd
    for (int i = 0; i < F; i++) {  // vec: swiglu_backward
      const float gi = Ld(g, i), ui = Ld(u, i), di = Ld(d, i);
      const float s = 1.0f / (1.0f + exp_fast(-gi));
      St(dg, i, Ld(dg, i) + di * ui * s * (1.0f + gi * (1.0f - s)));
      St(du, i, Ld(du, i) + di * gi * s);
    }
  }
}

// ----------------------------------------------------------------------------------------------
// kv_repeat: out[n] = [q | k of kv head h/G for each h | v likewise], G = NH / KV. Copies of the
// stored bits (memcpy: exact at either dtype).

template <typename A>
void KvRepeatForward(A* out, const A* qkv, int N, int NH, int KV, int hs) {
  const int C = NH * hs, W = (NH + 2 * KV) * hs, G = NH / KV;
  const size_t head = sizeof(A) * hs;
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int n = 0; n < N; n++) {
    const A* src = qkv + (int64_t)n * W;
    A* dst = out + (int64_t)n * 3 * C;
    std::memcpy(dst, src, sizeof(A) * C);
    for (int h = 0; h < NH; h++) {
      const int j = h / G;
      std::memcpy(dst + C + (int64_t)h * hs, src + C + (int64_t)j * hs, head);
      std::memcpy(dst + 2 * C + (int64_t)h * hs, src + C + (int64_t)(KV + j) * hs, head);
    }
  }
}

// dqkv[n, q] += dout[n, q];  dqkv[n, kv head j] += sum over its group's heads (fp32, head order).
template <typename A>
void KvRepeatBackward(A* dqkv, const A* dout, int N, int NH, int KV, int hs) {
  const int C = NH * hs, W = (NH + 2 * KV) * hs, G = NH / KV;
#pragma omp parallel num_threads(nthreads())
  {
    std::vector<float> acc_buf(hs);
    float* acc = acc_buf.data();
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      const A* d = dout + (int64_t)n * 3 * C;
      A* dx = dqkv + (int64_t)n * W;
#pragma omp simd
      for (int i = 0; i < C; i++) St(dx, i, Ld(dx, i) + Ld(d, i));  // vec: kv_repeat_backward_q
      for (int part = 0; part < 2; part++) {  // k, then v
        const A* dp = d + (int64_t)(1 + part) * C;
        A* dxp = dx + C + (int64_t)part * KV * hs;
        for (int j = 0; j < KV; j++) {
          const A* g0 = dp + (int64_t)j * G * hs;
#pragma omp simd
          for (int i = 0; i < hs; i++) acc[i] = Ld(g0, i);  // vec: kv_repeat_backward_first
          for (int g = 1; g < G; g++) {
            const A* gh = g0 + (int64_t)g * hs;
#pragma omp simd
            for (int i = 0; i < hs; i++) acc[i] += Ld(gh, i);  // vec: kv_repeat_backward_sum
          }
          A* o = dxp + (int64_t)j * hs;
#pragma omp simd
          for (int i = 0; i < hs; i++) St(o, i, Ld(o, i) + acc[i]);  // vec: kv_repeat_backward_add
        }
      }
    }
  }
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C, float eps) {
  RmsnormForward(out, rstd, inp, w, N, C, eps);
}
void rmsnorm_forward(bf16_t* out, float* rstd, const bf16_t* inp, const float* w, int N, int C, float eps) {
  RmsnormForward(out, rstd, inp, w, N, C, eps);
}
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w, const float* rstd,
                      int N, int C) {
  RmsnormBackward(dinp, dw, dout, inp, w, rstd, N, C);
}
void rmsnorm_backward(bf16_t* dinp, float* dw, const bf16_t* dout, const bf16_t* inp, const float* w,
                      const float* rstd, int N, int C) {
  RmsnormBackward(dinp, dw, dout, inp, w, rstd, N, C);
}

void rope_forward(float* qkv, int B, int T, int NH, int KV, int hs, float theta) {
  Rope<false>(qkv, B, T, NH, KV, hs, theta);
}
void rope_forward(bf16_t* qkv, int B, int T, int NH, int KV, int hs, float theta) {
  Rope<false>(qkv, B, T, NH, KV, hs, theta);
}
void rope_backward(float* dqkv, int B, int T, int NH, int KV, int hs, float theta) {
  Rope<true>(dqkv, B, T, NH, KV, hs, theta);
}
void rope_backward(bf16_t* dqkv, int B, int T, int NH, int KV, int hs, float theta) {
  Rope<true>(dqkv, B, T, NH, KV, hs, theta);
}

void swiglu_forward(float* out, const float* gate_up, int N, int F) { SwigluForward(out, gate_up, N, F); }
void swiglu_forward(bf16_t* out, const bf16_t* gate_up, int N, int F) { SwigluForward(out, gate_up, N, F); }
void swiglu_backward(float* dgate_up, const float* gate_up, const float* dout, int N, int F) {
  SwigluBackward(dgate_up, gate_up, dout, N, F);
}
void swiglu_backward(bf16_t* dgate_up, const bf16_t* gate_up, const bf16_t* dout, int N, int F) {
  SwigluBackward(dgate_up, gate_up, dout, N, F);
}

void kv_repeat_forward(float* out, const float* qkv, int N, int NH, int KV, int hs) {
  KvRepeatForward(out, qkv, N, NH, KV, hs);
}
void kv_repeat_forward(bf16_t* out, const bf16_t* qkv, int N, int NH, int KV, int hs) {
  KvRepeatForward(out, qkv, N, NH, KV, hs);
}
void kv_repeat_backward(float* dqkv, const float* dout, int N, int NH, int KV, int hs) {
  KvRepeatBackward(dqkv, dout, N, NH, KV, hs);
}
void kv_repeat_backward(bf16_t* dqkv, const bf16_t* dout, int N, int NH, int KV, int hs) {
  KvRepeatBackward(dqkv, dout, N, NH, KV, hs);
}

}  // namespace shardgpt
