// CPU kernels of the GPT forward and backward pass (fp32), in the style of llm.c's train_gpt2.c.
// Matmuls (and the score/value products inside attention) go to OpenBLAS cblas_sgemm; everything
// else is OpenMP over rows with inner loops written to be auto-vectorised (-O3 -march=native).
//
// Threading: ONE pool, OpenMP's. OpenBLAS is kept single-threaded and each OpenMP thread calls
// sgemm on its own slice of the output (rows of out/dinp, rows of dw). Measured on 2 cores:
// alternating OpenBLAS's pthread pool with OpenMP's made both spin against each other (a 75 us
// layernorm took ~1.8 ms right after an sgemm, and the sgemms ran at ~180 instead of ~380
// GFLOP/s when OpenMP kernels ran between them); with a single pool neither happens.
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

namespace shardgpt {

namespace {

int g_threads = 0;  // 0: not set yet, use the OpenMP default

inline int nthreads() { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

// exp(x) for the softmaxes and tanh: Cephes range reduction + degree-6 polynomial (rel. error
// ~2 ulp on [-87, 88]; inputs are clamped there). Plain float ops only, so loops that call it
// vectorise (glibc's expf does not without -ffast-math).
inline float exp_fast(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to the nearest integer
  float n = (x * 1.44269504088896341f + magic) - magic;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  return y * __builtin_bit_cast(float, bits);
}

// tanh(u) = 1 - 2 / (exp(2u) + 1); absolute error ~1e-7.
inline float tanh_fast(float u) { return 1.0f - 2.0f / (exp_fast(2.0f * u) + 1.0f); }

// Per-thread scratch, grown on demand (attention's score tiles).
float* scratch(std::vector<float>& buf, size_t n) {
  if (buf.size() < n) buf.resize(n);
  return buf.data();
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

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int64_t n = 0; n < (int64_t)B * T; n++) {
    const int t = (int)(n % T);
    float* o = out + n * C;
    const float* we = wte + (int64_t)tokens[n] * C;
    const float* pe = wpe + (int64_t)t * C;
#pragma omp simd
    for (int i = 0; i < C; i++) o[i] = we[i] + pe[i];
  }
}

// dwte[tokens[b,t],:] += dout[b,t,:]  (scatter: each thread owns a channel slice, rows in order)
// dwpe[t,:] += sum_b dout[b,t,:]     (each thread owns positions t)
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) {
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
        const float* d = dout + n * C;
#pragma omp simd
        for (int i = c0; i < c1; i++) dw[i] += d[i];
      }
    }
#pragma omp for schedule(static)
    for (int t = 0; t < T; t++) {
      float* dp = dwpe + (int64_t)t * C;
      for (int b = 0; b < B; b++) {
        const float* d = dout + ((int64_t)b * T + t) * C;
#pragma omp simd
        for (int i = 0; i < C; i++) dp[i] += d[i];
      }
    }
  }
}

// ----------------------------------------------------------------------------------------------
// layernorm: m = mean(x), v = mean((x-m)^2), rstd = 1/sqrt(v + 1e-5), y = (x-m)*rstd*w + b

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int N,
                       int C) {
  const float eps = 1e-5f;
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int n = 0; n < N; n++) {
    const float* x = inp + (int64_t)n * C;
    float* y = out + (int64_t)n * C;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < C; i++) s += x[i];
    const float m = s / C;
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
    const float r = 1.0f / std::sqrt(v / C + eps);
#pragma omp simd
    for (int i = 0; i < C; i++) y[i] = (x[i] - m) * r * w[i] + b[i];
    mean[n] = m;
    rstd[n] = r;
  }
}

// norm = (x-m)*rstd, g = w*dout:
//   dinp += (g - mean(g) - norm * mean(g*norm)) * rstd;  dw += sum_n dout*norm;  db += sum_n dout
// dw/db: each thread sums its (static) rows into a private partial, partials added in thread order.
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C) {
  const int nt = nthreads();
  std::vector<float> partial((size_t)nt * 2 * C, 0.0f);  // [nt][dw C | db C]
#pragma omp parallel num_threads(nt)
  {
    float* pdw = partial.data() + (size_t)omp_get_thread_num() * 2 * C;
    float* pdb = pdw + C;
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      const float* x = inp + (int64_t)n * C;
      const float* d = dout + (int64_t)n * C;
      float* dx = dinp + (int64_t)n * C;
      const float m = mean[n], r = rstd[n];
      float g_mean = 0.0f, gn_mean = 0.0f;
#pragma omp simd reduction(+ : g_mean, gn_mean)
      for (int i = 0; i < C; i++) {
        const float g = w[i] * d[i];
        g_mean += g;
        gn_mean += g * (x[i] - m) * r;
      }
      g_mean /= C;
      gn_mean /= C;
#pragma omp simd
      for (int i = 0; i < C; i++) {
        const float norm = (x[i] - m) * r;
        pdb[i] += d[i];
        pdw[i] += norm * d[i];
        dx[i] += (w[i] * d[i] - g_mean - norm * gn_mean) * r;
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
// Each thread: rows [n0,n1) of dinp, rows [o0,o1) of dw and dbias (no cross-thread reduction).
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
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, C, N, 1.0f, dout + o0, OC, inp, C, 1.0f,
                  dw + (int64_t)o0 * C, C);
      if (dbias)
        for (int n = 0; n < N; n++) {
          const float* d = dout + (int64_t)n * OC;
#pragma omp simd
          for (int o = o0; o < o1; o++) dbias[o] += d[o];
        }
    }
  }
}

// ----------------------------------------------------------------------------------------------
// attention, per (b,h), with q,k,v,o,dO the [T,hs] slices of that head (row stride 3C or C):
//   forward:  S = q k^T * scale (causal: s <= t);  lse_t = log sum_s exp(S_ts);  P = exp(S - lse);
//             o = P v.  Saves only o and lse.
//   backward: P recomputed from q, k and lse;  dv += P^T dO;  dP = dO v^T;  D_t = dO_t . o_t;
//             dS = P * (dP - D);  dq += dS k * scale;  dk += dS^T q * scale.
// Rows go in blocks of att_block(T) so that the sgemms skip most of the masked upper triangle;
// the [T,T] score tiles are per-thread scratch. sgemm runs single-threaded inside the
// (b,h)-parallel OpenMP loop.

namespace {
// Row block: 32 for short sequences, 64 otherwise (measured at T=64 and T=256, hs=64; full-T
// blocks that skip nothing are ~25% slower at T=256).
inline int att_block(int T) { return T <= 128 ? 32 : 64; }
thread_local std::vector<float> t_att_p, t_att_dp;
}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt((float)hs);
  const int bs = att_block(T);
  BlasSingleThread single;
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const float* q = qkv + (int64_t)b * T * C3 + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* o = out + (int64_t)b * T * C + h * hs;
    float* l = lse + (int64_t)bh * T;
    float* S = scratch(t_att_p, (size_t)T * T);
    for (int r0 = 0; r0 < T; r0 += bs) {
      const int r1 = std::min(T, r0 + bs);
      // S[r0:r1, 0:r1] = q[r0:r1] k[0:r1]^T * scale
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hs, scale, q + (int64_t)r0 * C3, C3, k, C3,
                  0.0f, S + (int64_t)r0 * T, T);
      for (int t = r0; t < r1; t++) {
        float* row = S + (int64_t)t * T;
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int s = 0; s <= t; s++) mx = mx > row[s] ? mx : row[s];  // (std::max does not vectorise)
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int s = 0; s <= t; s++) {
          row[s] = exp_fast(row[s] - mx);
          sum += row[s];
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int s = 0; s <= t; s++) row[s] *= inv;
        for (int s = t + 1; s < r1; s++) row[s] = 0.0f;
        l[t] = mx + std::log(sum);
      }
      // o[r0:r1] = P[r0:r1, 0:r1] v[0:r1]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, 1.0f, S + (int64_t)r0 * T, T, v, C3,
                  0.0f, o + (int64_t)r0 * C, C);
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse, int B,
                        int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt((float)hs);
  const int bs = att_block(T);
  BlasSingleThread single;
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const int64_t qoff = (int64_t)b * T * C3 + h * hs, ooff = (int64_t)b * T * C + h * hs;
    const float *q = qkv + qoff, *k = q + C, *v = q + 2 * C;
    float *dq = dqkv + qoff, *dk = dq + C, *dv = dq + 2 * C;
    const float *o = out + ooff, *dO = dout + ooff;
    const float* l = lse + (int64_t)bh * T;
    float* P = scratch(t_att_p, (size_t)T * T);
    float* dS = scratch(t_att_dp, (size_t)T * T);
    for (int r0 = 0; r0 < T; r0 += bs) {
      const int r1 = std::min(T, r0 + bs), m = r1 - r0;
      float* Pb = P + (int64_t)r0 * T;
      float* dSb = dS + (int64_t)r0 * T;
      // P = exp(q k^T * scale - lse), dP = dO v^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, hs, scale, q + (int64_t)r0 * C3, C3, k, C3, 0.0f,
                  Pb, T);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, hs, 1.0f, dO + (int64_t)r0 * C, C, v, C3, 0.0f,
                  dSb, T);
      for (int t = r0; t < r1; t++) {
        float* p = P + (int64_t)t * T;
        float* ds = dS + (int64_t)t * T;
        const float* ot = o + (int64_t)t * C;
        const float* dot = dO + (int64_t)t * C;
        float D = 0.0f;
#pragma omp simd reduction(+ : D)
        for (int i = 0; i < hs; i++) D += ot[i] * dot[i];
        const float lt = l[t];
#pragma omp simd
        for (int s = 0; s <= t; s++) {
          p[s] = exp_fast(p[s] - lt);
          ds[s] = p[s] * (ds[s] - D);
        }
        for (int s = t + 1; s < r1; s++) p[s] = ds[s] = 0.0f;
      }
      // dq[r0:r1] += dS[r0:r1, 0:r1] k[0:r1] * scale
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, r1, scale, dSb, T, k, C3, 1.0f,
                  dq + (int64_t)r0 * C3, C3);
    }
    // column blocks c: only rows t >= c0 have nonzero P/dS in columns [c0,c1)
    for (int c0 = 0; c0 < T; c0 += bs) {
      const int c1 = std::min(T, c0 + bs);
      // dv[c0:c1] += P[c0:T, c0:c1]^T dO[c0:T];  dk[c0:c1] += dS[c0:T, c0:c1]^T q[c0:T] * scale
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, hs, T - c0, 1.0f, P + (int64_t)c0 * T + c0, T,
                  dO + (int64_t)c0 * C, C, 1.0f, dv + (int64_t)c0 * C3, C3);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, hs, T - c0, scale, dS + (int64_t)c0 * T + c0, T,
                  q + (int64_t)c0 * C3, C3, 1.0f, dk + (int64_t)c0 * C3, C3);
    }
  }
}

// ----------------------------------------------------------------------------------------------
// gelu (tanh approximation): y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
//   dy/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)

namespace {
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr size_t kElemChunk = 16384;           // elementwise kernels: rows of this many floats
inline int64_t elem_chunks(size_t n) { return (int64_t)((n + kElemChunk - 1) / kElemChunk); }
}  // namespace

void gelu_forward(float* out, const float* inp, size_t n) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int64_t j = 0; j < elem_chunks(n); j++) {
    const size_t i0 = j * kElemChunk, i1 = std::min(n, i0 + kElemChunk);
#pragma omp simd
    for (size_t i = i0; i < i1; i++) {
      const float x = inp[i];
      out[i] = 0.5f * x * (1.0f + tanh_fast(kGeluS * (x + 0.044715f * x * x * x)));
    }
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int64_t j = 0; j < elem_chunks(n); j++) {
    const size_t i0 = j * kElemChunk, i1 = std::min(n, i0 + kElemChunk);
#pragma omp simd
    for (size_t i = i0; i < i1; i++) {
      const float x = inp[i];
      const float th = tanh_fast(kGeluS * (x + 0.044715f * x * x * x));
      const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluS * (1.0f + 3.0f * 0.044715f * x * x);
      dinp[i] += grad * dout[i];
    }
  }
}

// ----------------------------------------------------------------------------------------------
// residual: out = a + b;  backward: da += dout, db += dout

void residual_forward(float* out, const float* a, const float* b, size_t n) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int64_t j = 0; j < elem_chunks(n); j++) {
    const size_t i0 = j * kElemChunk, i1 = std::min(n, i0 + kElemChunk);
#pragma omp simd
    for (size_t i = i0; i < i1; i++) out[i] = a[i] + b[i];
  }
}

void residual_backward(float* da, float* db, const float* dout, size_t n) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int64_t j = 0; j < elem_chunks(n); j++) {
    const size_t i0 = j * kElemChunk, i1 = std::min(n, i0 + kElemChunk);
#pragma omp simd
    for (size_t i = i0; i < i1; i++) {
      da[i] += dout[i];
      db[i] += dout[i];
    }
  }
}

// ----------------------------------------------------------------------------------------------
// crossentropy over the real columns [0,V) of logits[N,Vp]:
//   lse = log sum_v exp(x_v);  loss = lse - x[target];  dx_v = (exp(x_v - lse) - [v == target]) * dloss_scale
// (dx written in place; padded columns [V,Vp) get 0).

double crossentropy_softmax(float* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                            float dloss_scale) {
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (int n = 0; n < N; n++) {
    float* x = logits + (int64_t)n * Vp;
    const int tgt = targets[n];
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int i = 0; i < V; i++) mx = mx > x[i] ? mx : x[i];
    float sum = 0.0f;
    const float xt = x[tgt];
    if (dloss_scale != 0.0f) {
#pragma omp simd reduction(+ : sum)
      for (int i = 0; i < V; i++) {
        x[i] = exp_fast(x[i] - mx);
        sum += x[i];
      }
      const float mul = dloss_scale / sum;
#pragma omp simd
      for (int i = 0; i < V; i++) x[i] *= mul;
      x[tgt] -= dloss_scale;
      for (int i = V; i < Vp; i++) x[i] = 0.0f;
    } else {
#pragma omp simd reduction(+ : sum)
      for (int i = 0; i < V; i++) sum += exp_fast(x[i] - mx);
    }
    losses[n] = mx + std::log(sum) - xt;
  }
  double total = 0.0;  // serial, fixed order
  for (int n = 0; n < N; n++) total += losses[n];
  return total;
}

// ---- element-wise kernels of the engine ----

void convert(const void* src, DType from, void* dst, DType to, size_t n) {
  if (from == to) {
    std::memcpy(dst, src, n * DTypeSize(from));
  } else if (from == DType::kF32) {
    FloatToBf16(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n);
  } else {
    Bf16ToFloat(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n);
  }
}

void accumulate(void* dst, DType dtype, const void* src, DType src_dtype, size_t n) {
  if (dtype == DType::kF32 && src_dtype == DType::kF32) {
    float* d = static_cast<float*>(dst);
    const float* s = static_cast<const float*>(src);
#pragma omp parallel for schedule(static) num_threads(nthreads())
    for (size_t i = 0; i < n; i++) d[i] += s[i];
    return;
  }
#pragma omp parallel for schedule(static) num_threads(nthreads())
  for (size_t i = 0; i < n; i++) {
    const float s = src_dtype == DType::kF32 ? static_cast<const float*>(src)[i]
                                             : Bf16ToFloat(static_cast<const uint16_t*>(src)[i]);
    if (dtype == DType::kF32) {
      static_cast<float*>(dst)[i] += s;
    } else {
      uint16_t* d = static_cast<uint16_t*>(dst) + i;
      *d = FloatToBf16(Bf16ToFloat(*d) + s);
    }
  }
}

double sum_squares(const void* x, DType dtype, size_t n) {
  double ss = 0;
#pragma omp parallel for schedule(static) reduction(+ : ss) num_threads(nthreads())
  for (size_t i = 0; i < n; i++) {
    const double v = dtype == DType::kF32 ? static_cast<const float*>(x)[i]
                                          : Bf16ToFloat(static_cast<const uint16_t*>(x)[i]);
    ss += v * v;
  }
  return ss;
}

}  // namespace shardgpt
