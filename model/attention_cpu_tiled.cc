// Causal fp32 attention on register tiles (maths and layout: model/attention_cpu_tiled.h).
#include "model/attention_cpu_tiled.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "model/kernels_cpu_internal.h"

namespace shardgpt {
namespace cpu_internal {
namespace {

// 16 floats: one AVX-512 register (two AVX2 ones). Loads and stores go through memcpy
// (unaligned, no aliasing question): one vmovups each. Without AVX-512, GCC warns that passing
// a 64-byte vector by value has another ABI: every function here is internal, so no ABI is
// shared with other code.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float V16 __attribute__((vector_size(64)));
constexpr int kLanes = 16;
inline V16 Load(const float* p) {
  V16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void Store(float* p, const V16& v) { std::memcpy(p, &v, sizeof v); }
// (Not V16{} + x: adding +0.0 is not an identity for -0.0, so the compiler keeps the add.)
inline V16 Splat(float x) { return V16{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

// Scores: s[r][16j + l] = alpha * sum_{d < hs} a[r][d] bt[d][16j + l] for r < R, j < NV:
// R query rows (row stride lda) against 16 NV columns of the transposed keys bt (row stride
// ldb). Per d: NV loads, R broadcasts, R NV fused multiply-adds on R NV accumulators.
template <int R, int NV>
inline void ScoreTile(const float* a, int64_t lda, const float* bt, int64_t ldb, int hs, float alpha, float* s,
                      int64_t lds) {
  V16 acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
#pragma GCC unroll 8
    for (int j = 0; j < NV; j++) acc[r][j] = V16{};
  for (int d = 0; d < hs; d++) {
    V16 b[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; j++) b[j] = Load(bt + d * ldb + kLanes * j);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      const V16 x = Splat(a[r * lda + d]);
#pragma GCC unroll 8
      for (int j = 0; j < NV; j++) acc[r][j] += x * b[j];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
#pragma GCC unroll 8
    for (int j = 0; j < NV; j++) Store(s + r * lds + kLanes * j, acc[r][j] * alpha);
}

// Values: o[r][16j + l] (+)= alpha scale_r sum_{u < n} p[r][u] x[u][16j + l] for r < R, j < NV:
// R rows of a probability (or dS) tile (row stride ldp) times n rows of x (row stride ldx).
// row_scale: a factor per row (null: 1); kAccumulate: add to o instead of writing it (a
// template parameter: no run-time flag inside the vector code).
template <int R, int NV, bool kAccumulate>
inline void ValueTile(const float* p, int64_t ldp, int n, const float* x, int64_t ldx, float alpha,
                      const float* row_scale, float* o, int64_t ldo) {
  V16 acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; r++)
#pragma GCC unroll 8
    for (int j = 0; j < NV; j++) acc[r][j] = V16{};
  for (int u = 0; u < n; u++) {
    V16 xv[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; j++) xv[j] = Load(x + u * ldx + kLanes * j);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      const V16 pr = Splat(p[r * ldp + u]);
#pragma GCC unroll 8
      for (int j = 0; j < NV; j++) acc[r][j] += pr * xv[j];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; r++) {
    const float f = row_scale ? alpha * row_scale[r] : alpha;
#pragma GCC unroll 8
    for (int j = 0; j < NV; j++) {
      float* dst = o + r * ldo + kLanes * j;
      if constexpr (kAccumulate) Store(dst, Load(dst) + acc[r][j] * f);
      else Store(dst, acc[r][j] * f);
    }
  }
}

// Transposed values: o[c][16j + l] += alpha sum_{t0 <= t < t1} p[t][c] x[t][16j + l] for
// c < R, j < NV: R adjacent columns of p (row stride ldp) against rows of x (row stride ldx).
template <int R, int NV>
inline void ValueTileT(const float* p, int64_t ldp, int t0, int t1, const float* x, int64_t ldx, float alpha,
                       float* o, int64_t ldo) {
  V16 acc[R][NV];
#pragma GCC unroll 8
  for (int c = 0; c < R; c++)
#pragma GCC unroll 8
    for (int j = 0; j < NV; j++) acc[c][j] = V16{};
  for (int t = t0; t < t1; t++) {
    V16 xv[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; j++) xv[j] = Load(x + t * ldx + kLanes * j);
#pragma GCC unroll 8
    for (int c = 0; c < R; c++) {
      const V16 pc = Splat(p[t * ldp + c]);
#pragma GCC unroll 8
      for (int j = 0; j < NV; j++) acc[c][j] += pc * xv[j];
    }
  }
#pragma GCC unroll 8
  for (int c = 0; c < R; c++)
#pragma GCC unroll 8
    for (int j = 0; j < NV; j++) {
      float* dst = o + c * ldo + kLanes * j;
      Store(dst, Load(dst) + acc[c][j] * alpha);
    }
}

// The value tiles over a head of hs columns (hs % 16 == 0) go in passes of kValueVectors(R)
// vectors, R x that many accumulators (16 of AVX-512's 32 registers): R = 8 rows take 32 columns
// a pass (per row of x 2 loads and 8 broadcasts for 16 FMAs: faster than 4 rows x 64 columns),
// R = 4 columns take 64 (for dk/dv: faster than 8 or 16 columns). f(nv, c) runs the pass of nv
// vectors at column c.
constexpr int kValueVectors(int R) { return R >= 8 ? 2 : 4; }
template <int R, typename F>
void ForValuePasses(int hs, F f) {
  constexpr int kV = kValueVectors(R);
  for (int c = 0; c < hs; c += kV * kLanes) {
    switch (std::min(kV, (hs - c) / kLanes)) {
      case 4: f(std::integral_constant<int, 4>{}, c); break;
      case 3: f(std::integral_constant<int, 3>{}, c); break;
      case 2: f(std::integral_constant<int, 2>{}, c); break;
      default: f(std::integral_constant<int, 1>{}, c); break;
    }
  }
}
template <int R, bool kAccumulate>
void ValueRows(const float* p, int64_t ldp, int n, const float* x, int64_t ldx, float alpha, const float* row_scale,
               float* o, int64_t ldo, int hs) {
  ForValuePasses<R>(hs, [&](auto nv, int c) {
    ValueTile<R, decltype(nv)::value, kAccumulate>(p, ldp, n, x + c, ldx, alpha, row_scale, o + c, ldo);
  });
}
template <int R>
void ValueColumns(const float* p, int64_t ldp, int t0, int t1, const float* x, int64_t ldx, float alpha, float* o,
                  int64_t ldo, int hs) {
  ForValuePasses<R>(hs, [&](auto nv, int c) {
    ValueTileT<R, decltype(nv)::value>(p, ldp, t0, t1, x + c, ldx, alpha, o + c, ldo);
  });
}

// The value rows of a score tile's rows [t0, t0 + rows) (rows <= 8, t0 a multiple of 8): row t
// sums over u <= t, and u up to the tile's last row reads zeros past each row's diagonal.
template <bool kAccumulate>
void ValueRowsOfTile(const float* p, int64_t ldp, int t0, int rows, const float* x, int64_t ldx, float alpha,
                     const float* row_scale, float* o, int64_t ldo, int hs) {
  if (rows == 8) return ValueRows<8, kAccumulate>(p, ldp, t0 + 8, x, ldx, alpha, row_scale, o, ldo, hs);
  for (int r = 0; r < rows; r++)
    ValueRows<1, kAccumulate>(p + r * ldp, ldp, t0 + r + 1, x, ldx, alpha, row_scale ? row_scale + r : nullptr,
                              o + r * ldo, ldo, hs);
}

// Rows [t0, t0 + rows) of the scores a bt^T * alpha, columns [0, 16 ceil((t0 + rows) / 16)):
// every column a causal row of the tile can need. rows <= 8.
void ScoreRows(const float* a, int64_t lda, const float* bt, int64_t ldb, int hs, float alpha, int t0, int rows,
               float* s, int64_t lds) {
  const int nvec = (t0 + rows + kLanes - 1) / kLanes;
  if (rows == 8) {
    int j = 0;
    for (; j + 2 <= nvec; j += 2) ScoreTile<8, 2>(a, lda, bt + kLanes * j, ldb, hs, alpha, s + kLanes * j, lds);
    if (j < nvec) ScoreTile<8, 1>(a, lda, bt + kLanes * j, ldb, hs, alpha, s + kLanes * j, lds);
    return;
  }
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < nvec; j++)
      ScoreTile<1, 1>(a + r * lda, lda, bt + kLanes * j, ldb, hs, alpha, s + r * lds + kLanes * j, lds);
}

// dst[c][r] = src[r][c] for r < rows, c < cols; dst's columns [rows, ld) zeroed.
void Transpose(const float* src, int64_t lds, int rows, int cols, float* dst, int64_t ld) {
  for (int r0 = 0; r0 < rows; r0 += kLanes) {
    const int r1 = std::min(rows, r0 + kLanes);
    for (int c = 0; c < cols; c++)
      for (int r = r0; r < r1; r++) dst[c * ld + r] = src[r * lds + c];
  }
  for (int c = 0; c < cols; c++) std::fill(dst + c * ld + rows, dst + (c + 1) * ld, 0.0f);
}

thread_local std::vector<float> t_kt, t_vt, t_rows;

// Query rows go in tiles of 8, for the scores and the values (the last tile of a T that is no
// multiple of 8: row by row). Every row t of a tile starting at a multiple of 8 has its
// probabilities written up to RowGroupEnd(t) (0 past t), which is past the tile's last row: the
// value products, which run to the tile's last row (ValueRowsOfTile; in the backward's
// ValueColumns, to the last of 4 columns starting at a multiple of 4), read only exact zeros
// above the diagonal.
void ForwardHead(const float* q, const float* k, const float* v, int64_t ldq, float* o, int64_t ldo, float* lse,
                 int T, int hs, float scale) {
  const int ld = RowStride(T);
  float* kt = scratch(t_kt, static_cast<size_t>(hs) * ld);
  Transpose(k, ldq, T, hs, kt, ld);
  float* s = scratch(t_rows, static_cast<size_t>(8) * ld);
  float inv[8];
  for (int t0 = 0; t0 < T; t0 += 8) {
    const int rows = std::min(8, T - t0);
    ScoreRows(q + t0 * ldq, ldq, kt, ld, hs, scale, t0, rows, s, ld);
    for (int r = 0; r < rows; r++) {
      const int t = t0 + r;
      const float mx = CausalRowMax(s + r * ld, t);
      const float sum = CausalRowExp(s + r * ld, t, mx);
      lse[t] = mx + std::log(sum);
      inv[r] = 1.0f / sum;
    }
    // o[t] = (sum_u exp(S_tu - mx) v[u]) / sum
    ValueRowsOfTile</*kAccumulate=*/false>(s, ld, t0, rows, v, ldq, 1.0f, inv, o + t0 * ldo, ldo, hs);
  }
}

void BackwardHead(const float* q, const float* k, const float* v, float* dq, float* dk, float* dv, int64_t ldq,
                  const float* o, const float* dO, int64_t ldo, const float* lse, int T, int hs, float scale) {
  const int ld = RowStride(T);
  float* kt = scratch(t_kt, static_cast<size_t>(hs) * ld);
  float* vt = scratch(t_vt, static_cast<size_t>(hs) * ld);
  Transpose(k, ldq, T, hs, kt, ld);
  Transpose(v, ldq, T, hs, vt, ld);
  float* P = scratch(t_att_p, static_cast<size_t>(T) * ld);
  float* dS = scratch(t_att_dp, static_cast<size_t>(T) * ld);
  for (int t0 = 0; t0 < T; t0 += 8) {
    const int rows = std::min(8, T - t0);
    float* Pt = P + t0 * ld;
    float* dSt = dS + t0 * ld;
    ScoreRows(q + t0 * ldq, ldq, kt, ld, hs, scale, t0, rows, Pt, ld);   // S
    ScoreRows(dO + t0 * ldo, ldo, vt, ld, hs, 1.0f, t0, rows, dSt, ld);  // dP = dO v^T
    for (int r = 0; r < rows; r++)
      CausalRowGradient(Pt + r * ld, dSt + r * ld, t0 + r, lse[t0 + r], o + (t0 + r) * ldo, dO + (t0 + r) * ldo, hs);
    // dq[t] += scale sum_u dS[t][u] k[u]
    ValueRowsOfTile</*kAccumulate=*/true>(dSt, ld, t0, rows, k, ldq, scale, nullptr, dq + t0 * ldq, ldq, hs);
  }
  // dv[u] += sum_{t >= u} P[t][u] dO[t];  dk[u] += scale sum_{t >= u} dS[t][u] q[t]
  for (int c0 = 0; c0 < T; c0 += 4) {
    if (T - c0 >= 4) {
      ValueColumns<4>(P + c0, ld, c0, T, dO, ldo, 1.0f, dv + c0 * ldq, ldq, hs);
      ValueColumns<4>(dS + c0, ld, c0, T, q, ldq, scale, dk + c0 * ldq, ldq, hs);
      continue;
    }
    for (int c = c0; c < T; c++) {
      ValueColumns<1>(P + c, ld, c, T, dO, ldo, 1.0f, dv + c * ldq, ldq, hs);
      ValueColumns<1>(dS + c, ld, c, T, q, ldq, scale, dk + c * ldq, ldq, hs);
    }
  }
}

}  // namespace

void AttentionForwardTiled(int threads, float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const float* q = qkv + static_cast<int64_t>(b) * T * C3 + h * hs;
    ForwardHead(q, q + C, q + 2 * C, C3, out + static_cast<int64_t>(b) * T * C + h * hs, C,
                lse + static_cast<int64_t>(bh) * T, T, hs, scale);
  }
}

void AttentionBackwardTiled(int threads, float* dqkv, const float* dout, const float* qkv, const float* out,
                            const float* lse, int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const int64_t qoff = static_cast<int64_t>(b) * T * C3 + h * hs, ooff = static_cast<int64_t>(b) * T * C + h * hs;
    const float* q = qkv + qoff;
    float* dq = dqkv + qoff;
    BackwardHead(q, q + C, q + 2 * C, dq, dq + C, dq + 2 * C, C3, out + ooff, dout + ooff, C,
                 lse + static_cast<int64_t>(bh) * T, T, hs, scale);
  }
}

}  // namespace cpu_internal
}  // namespace shardgpt
