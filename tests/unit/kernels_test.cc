// Tests of the CPU kernels (model/kernels_cpu.h).
//
// Method: every kernel has a naive double-precision reference here. Forward outputs are compared
// with it; backward kernels are compared with central finite differences (in double) of the
// reference's scalar loss L = sum(dout * out), and for attention also with a naive analytic
// double backward (itself checked against finite differences) at sizes that span several of
// the kernel's 64-row blocks. Plus: accumulate semantics, padded vocabulary columns, bitwise
// determinism for a fixed thread count.
#include "base/bf16.h"
#include "model/kernels_cpu.h"
#include "tests/common/random_data.h"

#include <cblas.h>
#include <gtest/gtest.h>

#include "test_util.h"
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace shardgpt {
namespace {

using VecF = std::vector<float>;
using VecD = std::vector<double>;

VecD ToD(const VecF& v) { return VecD(v.begin(), v.end()); }

double Dot(const VecD& a, const VecF& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

// Central differences (double) of loss() with respect to every element of x (perturbed in place).
VecD NumGrad(VecD& x, const std::function<double()>& loss, double h = 1e-6) {
  VecD g(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss();
    x[i] = x0 - h;
    const double lm = loss();
    x[i] = x0;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

using testutil::BitwiseEqual;
using testutil::ExpectClose;

// ---------------------------------------------------------------------------------------------
// Double references.

VecD RefEncoder(const std::vector<int32_t>& tok, const VecD& wte, const VecD& wpe, int B, int T, int C) {
  VecD out((size_t)B * T * C);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++)
        out[((size_t)b * T + t) * C + c] = wte[(size_t)tok[b * T + t] * C + c] + wpe[(size_t)t * C + c];
  return out;
}

VecD RefLayernorm(const VecD& x, const VecD& w, const VecD& bias, int N, int C, VecD* mean = nullptr,
                  VecD* rstd = nullptr) {
  VecD out((size_t)N * C);
  if (mean) mean->assign(N, 0);
  if (rstd) rstd->assign(N, 0);
  for (int n = 0; n < N; n++) {
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; c++) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    const double r = 1.0 / std::sqrt(v + 1e-5);
    for (int c = 0; c < C; c++) out[n * C + c] = (x[n * C + c] - m) * r * w[c] + bias[c];
    if (mean) (*mean)[n] = m;
    if (rstd) (*rstd)[n] = r;
  }
  return out;
}

VecD RefMatmul(const VecD& inp, const VecD& w, const VecD* bias, int N, int C, int OC) {
  VecD out((size_t)N * OC);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double s = bias ? (*bias)[o] : 0.0;
      for (int c = 0; c < C; c++) s += inp[(size_t)n * C + c] * w[(size_t)o * C + c];
      out[(size_t)n * OC + o] = s;
    }
  return out;
}

// Naive causal attention: materialises the full [T,T] probabilities.
VecD RefAttention(const VecD& qkv, int B, int T, int C, int NH, VecD* lse = nullptr) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt((double)hs);
  VecD out((size_t)B * T * C, 0.0);
  if (lse) lse->assign((size_t)B * NH * T, 0.0);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const double* q = &qkv[((size_t)b * T + t) * 3 * C + h * hs];
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int u = 0; u <= t; u++) {
          const double* k = &qkv[((size_t)b * T + u) * 3 * C + C + h * hs];
          double d = 0;
          for (int i = 0; i < hs; i++) d += q[i] * k[i];
          s[u] = d * scale;
          mx = std::max(mx, s[u]);
        }
        double sum = 0;
        for (int u = 0; u <= t; u++) sum += std::exp(s[u] - mx);
        if (lse) (*lse)[((size_t)b * NH + h) * T + t] = mx + std::log(sum);
        for (int u = 0; u <= t; u++) {
          const double p = std::exp(s[u] - mx) / sum;
          const double* v = &qkv[((size_t)b * T + u) * 3 * C + 2 * C + h * hs];
          for (int i = 0; i < hs; i++) out[((size_t)b * T + t) * C + h * hs + i] += p * v[i];
        }
      }
  return out;
}

// Naive analytic backward of RefAttention (standard softmax backward), returns dqkv.
VecD RefAttentionBackward(const VecD& qkv, const VecD& dout, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt((double)hs);
  VecD dqkv(qkv.size(), 0.0);
  auto at = [&](int b, int t, int part, int h) { return ((size_t)b * T + t) * 3 * C + part * C + h * hs; };
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        std::vector<double> s(t + 1), p(t + 1), dp(t + 1);
        double mx = -1e300, sum = 0;
        for (int u = 0; u <= t; u++) {
          double d = 0;
          for (int i = 0; i < hs; i++) d += qkv[at(b, t, 0, h) + i] * qkv[at(b, u, 1, h) + i];
          s[u] = d * scale;
          mx = std::max(mx, s[u]);
        }
        for (int u = 0; u <= t; u++) sum += std::exp(s[u] - mx);
        const double* dO = &dout[((size_t)b * T + t) * C + h * hs];
        double pdp = 0;
        for (int u = 0; u <= t; u++) {
          p[u] = std::exp(s[u] - mx) / sum;
          double d = 0;
          for (int i = 0; i < hs; i++) {
            d += dO[i] * qkv[at(b, u, 2, h) + i];
            dqkv[at(b, u, 2, h) + i] += p[u] * dO[i];  // dv
          }
          dp[u] = d;
          pdp += p[u] * d;
        }
        for (int u = 0; u <= t; u++) {
          const double ds = p[u] * (dp[u] - pdp) * scale;
          for (int i = 0; i < hs; i++) {
            dqkv[at(b, t, 0, h) + i] += ds * qkv[at(b, u, 1, h) + i];
            dqkv[at(b, u, 1, h) + i] += ds * qkv[at(b, t, 0, h) + i];
          }
        }
      }
  return dqkv;
}

double RefGelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// Per-row losses of softmax cross-entropy over the first V of Vp columns.
VecD RefCrossEntropy(const VecD& logits, const std::vector<int32_t>& tgt, int N, int V, int Vp) {
  VecD loss(N);
  for (int n = 0; n < N; n++) {
    double mx = -1e300, sum = 0;
    for (int v = 0; v < V; v++) mx = std::max(mx, logits[(size_t)n * Vp + v]);
    for (int v = 0; v < V; v++) sum += std::exp(logits[(size_t)n * Vp + v] - mx);
    loss[n] = mx + std::log(sum) - logits[(size_t)n * Vp + tgt[n]];
  }
  return loss;
}

class KernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = ComputeThreads();
    SetComputeThreads(2);
  }
  void TearDown() override { SetComputeThreads(saved_); }
  int saved_ = 1;
};

// ---------------------------------------------------------------------------------------------

using KernelsThreads = KernelsTest;

TEST_F(KernelsThreads, SetComputeThreadsSizesOpenMPAndKeepsOpenBLASSingleThreaded) {
  // One thread pool: OpenMP's; sgemm is called single-threaded from each OpenMP thread.
  SetComputeThreads(3);
  EXPECT_EQ(ComputeThreads(), 3);
  EXPECT_EQ(omp_get_max_threads(), 3);
  EXPECT_EQ(openblas_get_num_threads(), 1);
  SetComputeThreads(1);
  EXPECT_EQ(ComputeThreads(), 1);
  EXPECT_EQ(omp_get_max_threads(), 1);
}

TEST_F(KernelsThreads, KernelsRestoreOpenBLASThreadsSetElsewhere) {
  openblas_set_num_threads(2);  // someone else's choice: kernels must leave it as they found it
  const int B = 1, T = 4, C = 8, NH = 2;
  VecF qkv = RandomFloats((size_t)B * T * 3 * C, 1), out((size_t)B * T * C), lse((size_t)B * NH * T);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  EXPECT_EQ(openblas_get_num_threads(), 2);
  VecF dqkv(qkv.size(), 0.0f);
  attention_backward(dqkv.data(), out.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
  EXPECT_EQ(openblas_get_num_threads(), 2);
  VecF w = RandomFloats(8 * 8, 2), mo((size_t)B * T * 8), dw(8 * 8, 0.0f);
  matmul_forward(mo.data(), out.data(), w.data(), nullptr, B * T, C, 8);
  EXPECT_EQ(openblas_get_num_threads(), 2);
  matmul_backward(nullptr, dw.data(), nullptr, mo.data(), out.data(), w.data(), B * T, C, 8);
  EXPECT_EQ(openblas_get_num_threads(), 2);
  ExpectClose(mo, RefMatmul(ToD(out), ToD(w), nullptr, B * T, C, 8), 1e-5, 1e-5, "out");
}

// ---------------------------------------------------------------------------------------------

using KernelsEncoder = KernelsTest;

TEST_F(KernelsEncoder, ForwardMatchesReference) {
  const int B = 2, T = 5, C = 40, V = 7;
  auto tok = RandomTokens(B * T, V, 1);
  VecF wte = RandomFloats((size_t)V * C, 2), wpe = RandomFloats((size_t)T * C, 3), out((size_t)B * T * C, NAN);
  encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  ExpectClose(out, RefEncoder(tok, ToD(wte), ToD(wpe), B, T, C), 0, 1e-6, "out");
}

TEST_F(KernelsEncoder, BackwardMatchesNumericAndAccumulates) {
  const int B = 2, T = 5, C = 40, V = 4;  // few ids: many repeated tokens in the scatter
  auto tok = RandomTokens(B * T, V, 4);
  VecF dout = RandomFloats((size_t)B * T * C, 5);
  VecD wte = ToD(RandomFloats((size_t)V * C, 6)), wpe = ToD(RandomFloats((size_t)T * C, 7));
  auto loss = [&] { return Dot(RefEncoder(tok, wte, wpe, B, T, C), dout); };
  const VecD g_wte = NumGrad(wte, loss), g_wpe = NumGrad(wpe, loss);
  VecF dwte((size_t)V * C, 0.0f), dwpe((size_t)T * C, 0.0f);
  encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
  ExpectClose(dwte, g_wte, 1e-5, 1e-5, "dwte");
  ExpectClose(dwpe, g_wpe, 1e-5, 1e-5, "dwpe");
  encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
  VecD g2(g_wte);
  for (auto& x : g2) x *= 2;
  ExpectClose(dwte, g2, 1e-5, 1e-5, "dwte twice");
}

// ---------------------------------------------------------------------------------------------

using KernelsLayernorm = KernelsTest;

TEST_F(KernelsLayernorm, ForwardMatchesReference) {
  const int N = 7, C = 48;
  VecF x = RandomFloats((size_t)N * C, 1, -2, 3), w = RandomFloats(C, 2), b = RandomFloats(C, 3);
  VecF out((size_t)N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  VecD rm, rr;
  VecD ref = RefLayernorm(ToD(x), ToD(w), ToD(b), N, C, &rm, &rr);
  ExpectClose(out, ref, 1e-5, 1e-5, "out");
  ExpectClose(mean, rm, 1e-5, 1e-6, "mean");
  ExpectClose(rstd, rr, 1e-5, 1e-6, "rstd");
}

TEST_F(KernelsLayernorm, EpsAndBiasedVariance) {
  // Constant-ish row: variance 1e-6 (biased); rstd must be 1/sqrt(1e-6 + 1e-5).
  const int C = 4;
  VecF x = {1.001f, 0.999f, 1.001f, 0.999f}, w(C, 1.0f), b(C, 0.0f), out(C), mean(1), rstd(1);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), 1, C);
  EXPECT_NEAR(rstd[0], 1.0 / std::sqrt(1e-6 + 1e-5), 1e-2);
}

TEST_F(KernelsLayernorm, BackwardMatchesNumericAndAccumulates) {
  const int N = 6, C = 40;
  VecF xf = RandomFloats((size_t)N * C, 1, -2, 2), wf = RandomFloats(C, 2), bf = RandomFloats(C, 3);
  VecF dout = RandomFloats((size_t)N * C, 4);
  VecD x = ToD(xf), w = ToD(wf), b = ToD(bf);
  auto loss = [&] { return Dot(RefLayernorm(x, w, b, N, C), dout); };
  VecD gx = NumGrad(x, loss), gw = NumGrad(w, loss), gb = NumGrad(b, loss);

  VecF out((size_t)N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), xf.data(), wf.data(), bf.data(), N, C);
  VecF dinp = RandomFloats((size_t)N * C, 9), dinp0 = dinp;  // accumulates onto existing content
  VecF dw(C, 0.0f), db(C, 0.0f);
  layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), xf.data(), wf.data(), mean.data(), rstd.data(),
                     N, C);
  VecD want_dinp(gx);
  for (size_t i = 0; i < want_dinp.size(); i++) want_dinp[i] += dinp0[i];
  ExpectClose(dinp, want_dinp, 1e-4, 1e-4, "dinp");
  ExpectClose(dw, gw, 1e-4, 1e-4, "dw");
  ExpectClose(db, gb, 1e-4, 1e-4, "db");

  layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), xf.data(), wf.data(), mean.data(), rstd.data(),
                     N, C);
  for (auto& g : gw) g *= 2;
  for (auto& g : gb) g *= 2;
  ExpectClose(dw, gw, 1e-4, 1e-4, "dw twice");
  ExpectClose(db, gb, 1e-4, 1e-4, "db twice");
}

// ---------------------------------------------------------------------------------------------

using KernelsMatmul = KernelsTest;

TEST_F(KernelsMatmul, ForwardMatchesReference) {
  const int N = 6, C = 8, OC = 5;
  VecF inp = RandomFloats((size_t)N * C, 1), w = RandomFloats((size_t)OC * C, 2), bias = RandomFloats(OC, 3);
  VecF out((size_t)N * OC, NAN);  // must be overwritten, not accumulated into
  VecD binp = ToD(bias);
  matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  ExpectClose(out, RefMatmul(ToD(inp), ToD(w), &binp, N, C, OC), 1e-5, 1e-5, "out with bias");
  std::fill(out.begin(), out.end(), NAN);
  matmul_forward(out.data(), inp.data(), w.data(), nullptr, N, C, OC);
  ExpectClose(out, RefMatmul(ToD(inp), ToD(w), nullptr, N, C, OC), 1e-5, 1e-5, "out without bias");
}

TEST_F(KernelsMatmul, BackwardMatchesNumericAndAccumulates) {
  const int N = 6, C = 8, OC = 5;
  VecF inpf = RandomFloats((size_t)N * C, 1), wf = RandomFloats((size_t)OC * C, 2), bf = RandomFloats(OC, 3);
  VecF dout = RandomFloats((size_t)N * OC, 4);
  VecD inp = ToD(inpf), w = ToD(wf), b = ToD(bf);
  auto loss = [&] { return Dot(RefMatmul(inp, w, &b, N, C, OC), dout); };
  const VecD gi = NumGrad(inp, loss), gw = NumGrad(w, loss), gb = NumGrad(b, loss);

  VecF dinp((size_t)N * C, 0.0f), dw((size_t)OC * C, 0.0f), db(OC, 0.0f);
  matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inpf.data(), wf.data(), N, C, OC);
  ExpectClose(dinp, gi, 1e-5, 1e-5, "dinp");
  ExpectClose(dw, gw, 1e-5, 1e-5, "dw");
  ExpectClose(db, gb, 1e-5, 1e-5, "dbias");

  matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inpf.data(), wf.data(), N, C, OC);
  VecD gi2(gi), gw2(gw), gb2(gb);
  for (auto* v : {&gi2, &gw2, &gb2})
    for (auto& g : *v) g *= 2;
  ExpectClose(dinp, gi2, 1e-5, 1e-5, "dinp twice");
  ExpectClose(dw, gw2, 1e-5, 1e-5, "dw twice");
  ExpectClose(db, gb2, 1e-5, 1e-5, "dbias twice");

  // Null dinp and dbias: only dw changes.
  VecF dw3((size_t)OC * C, 0.0f);
  matmul_backward(nullptr, dw3.data(), nullptr, dout.data(), inpf.data(), wf.data(), N, C, OC);
  ExpectClose(dw3, gw, 1e-5, 1e-5, "dw (null dinp, dbias)");
}

// Shapes where the kernel splits rows (N >= OC) or columns (N < OC) between the threads, with
// ragged slices; closed-form double references: dinp = dout w, dw = dout^T inp, dbias = colsum.
void CheckMatmulShape(int N, int C, int OC, uint32_t seed) {
  VecF inp = RandomFloats((size_t)N * C, seed), w = RandomFloats((size_t)OC * C, seed + 1), bias = RandomFloats(OC, seed + 2);
  VecF dout = RandomFloats((size_t)N * OC, seed + 3), out((size_t)N * OC, NAN);
  VecD bd = ToD(bias);
  matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  ExpectClose(out, RefMatmul(ToD(inp), ToD(w), &bd, N, C, OC), 1e-5, 1e-5, "out");
  VecF dinp = RandomFloats((size_t)N * C, seed + 4), dw = RandomFloats((size_t)OC * C, seed + 5), db = RandomFloats(OC, seed + 6);
  VecD want_di(dinp.begin(), dinp.end()), want_dw(dw.begin(), dw.end()), want_db(db.begin(), db.end());
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      const double d = dout[(size_t)n * OC + o];
      want_db[o] += d;
      for (int c = 0; c < C; c++) {
        want_di[(size_t)n * C + c] += d * w[(size_t)o * C + c];
        want_dw[(size_t)o * C + c] += d * inp[(size_t)n * C + c];
      }
    }
  matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  ExpectClose(dinp, want_di, 1e-5, 1e-5, "dinp");
  ExpectClose(dw, want_dw, 1e-5, 1e-5, "dw");
  ExpectClose(db, want_db, 1e-5, 1e-5, "dbias");
}

TEST_F(KernelsMatmul, RowSplitShape) { CheckMatmulShape(70, 20, 33, 1); }
TEST_F(KernelsMatmul, ColumnSplitShape) { CheckMatmulShape(37, 20, 53, 2); }
TEST_F(KernelsMatmul, SingleRow) { CheckMatmulShape(1, 9, 40, 3); }

TEST_F(KernelsMatmul, BiasGradientOverManyColumnSlices) {
  // OC spans several of the kernel's column slices (and a ragged last one).
  const int N = 3, C = 2, OC = 1100;
  VecF inp = RandomFloats((size_t)N * C, 1), w = RandomFloats((size_t)OC * C, 2), dout = RandomFloats((size_t)N * OC, 3);
  VecF dinp((size_t)N * C, 0.0f), dw((size_t)OC * C, 0.0f), db(OC, 1.0f);
  matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  VecD want(OC);
  for (int o = 0; o < OC; o++) want[o] = 1.0 + dout[o] + dout[OC + o] + dout[2 * OC + o];
  ExpectClose(db, want, 1e-6, 1e-6, "dbias");
}

// ---------------------------------------------------------------------------------------------

using KernelsAttention = KernelsTest;

void CheckAttentionForward(int B, int T, int C, int NH, uint32_t seed, float range) {
  VecF qkv = RandomFloats((size_t)B * T * 3 * C, seed, -range, range);
  VecF out((size_t)B * T * C, NAN), lse((size_t)B * NH * T, NAN);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  VecD ref_lse;
  VecD ref = RefAttention(ToD(qkv), B, T, C, NH, &ref_lse);
  ExpectClose(out, ref, 1e-4, 1e-5, "out");
  ExpectClose(lse, ref_lse, 1e-5, 1e-5, "lse");
}

TEST_F(KernelsAttention, ForwardMatchesReferenceSmall) { CheckAttentionForward(2, 5, 8, 2, 1, 1.0f); }

TEST_F(KernelsAttention, ForwardMatchesReferenceAcrossBlocks) {
  // T = 130: three row blocks of 64 (64, 64, 2); T = 45: blocks of 32 (32, 13).
  // Large scores stress the softmax.
  CheckAttentionForward(2, 130, 32, 2, 2, 3.0f);
  CheckAttentionForward(3, 45, 24, 3, 3, 3.0f);
}

TEST_F(KernelsAttention, FirstRowAttendsOnlyToItself) {
  const int B = 1, T = 3, C = 4, NH = 1;
  VecF qkv = RandomFloats((size_t)T * 3 * C, 3), out((size_t)T * C), lse(T);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  for (int i = 0; i < C; i++) EXPECT_FLOAT_EQ(out[i], qkv[2 * C + i]);  // o_0 = v_0
  double s00 = 0;
  for (int i = 0; i < C; i++) s00 += qkv[i] * qkv[C + i];
  EXPECT_NEAR(lse[0], s00 / std::sqrt((double)C), 1e-6);  // lse_0 = scaled q_0 . k_0
}

TEST_F(KernelsAttention, ReferenceBackwardMatchesNumeric) {
  // Validates the double analytic reference used by the larger test below.
  const int B = 2, T = 5, C = 8, NH = 2;
  VecD qkv = ToD(RandomFloats((size_t)B * T * 3 * C, 4));
  VecF doutf = RandomFloats((size_t)B * T * C, 5);
  auto loss = [&] { return Dot(RefAttention(qkv, B, T, C, NH), doutf); };
  const VecD g = NumGrad(qkv, loss);
  ExpectClose(RefAttentionBackward(qkv, ToD(doutf), B, T, C, NH), g, 1e-6, 1e-7, "ref dqkv");
}

void CheckAttentionBackward(int B, int T, int C, int NH, uint32_t seed, float range, bool numeric) {
  VecF qkv = RandomFloats((size_t)B * T * 3 * C, seed, -range, range);
  VecF dout = RandomFloats((size_t)B * T * C, seed + 1);
  VecF out((size_t)B * T * C), lse((size_t)B * NH * T);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  VecF dqkv = RandomFloats(qkv.size(), seed + 2), dqkv0 = dqkv;  // accumulates onto existing content
  attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
  VecD want;
  if (numeric) {
    VecD q = ToD(qkv);
    want = NumGrad(q, [&] { return Dot(RefAttention(q, B, T, C, NH), dout); });
  } else {
    want = RefAttentionBackward(ToD(qkv), ToD(dout), B, T, C, NH);
  }
  for (size_t i = 0; i < want.size(); i++) want[i] += dqkv0[i];
  ExpectClose(dqkv, want, 1e-4, 1e-4, "dqkv");
}

TEST_F(KernelsAttention, BackwardMatchesNumeric) { CheckAttentionBackward(2, 5, 8, 2, 6, 1.0f, true); }

TEST_F(KernelsAttention, BackwardMatchesReferenceAcrossBlocks) {
  CheckAttentionBackward(2, 130, 32, 2, 7, 2.0f, false);
  CheckAttentionBackward(3, 45, 24, 3, 8, 2.0f, false);
}

TEST_F(KernelsAttention, BackwardAccumulates) {
  const int B = 1, T = 70, C = 16, NH = 2;
  VecF qkv = RandomFloats((size_t)B * T * 3 * C, 8), dout = RandomFloats((size_t)B * T * C, 9);
  VecF out((size_t)B * T * C), lse((size_t)B * NH * T);
  attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  VecF once(qkv.size(), 0.0f), twice(qkv.size(), 0.0f);
  attention_backward(once.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
  attention_backward(twice.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
  attention_backward(twice.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
  VecD want(once.begin(), once.end());
  for (auto& x : want) x *= 2;
  ExpectClose(twice, want, 1e-6, 1e-7, "dqkv twice");
}

// The two ways the fp32 attention runs (Fp32Attention: OpenBLAS sgemm row blocks, our register
// tiles), each against the double reference, at head sizes that take every width of the value
// tiles (hs 16, 32, 48, 64, and 80 = 64 + 16) and sequence lengths that end inside a tile of 8
// query rows, a group of 4 key columns and a 16-lane softmax group (1, 7, 45, 67, 130); at T = 600 the
// tiled way's backward is the sgemm one (kTiledAttentionBackwardMaxT).
class KernelsAttentionWays : public KernelsTest, public ::testing::WithParamInterface<Fp32Attention> {
 protected:
  void SetUp() override {
    KernelsTest::SetUp();
    saved_way_ = CurrentFp32Attention();
    SetFp32Attention(GetParam());
  }
  void TearDown() override {
    SetFp32Attention(saved_way_);
    KernelsTest::TearDown();
  }
  Fp32Attention saved_way_ = Fp32Attention::kSgemm;
};

TEST_P(KernelsAttentionWays, ForwardAndBackwardMatchTheReference) {
  struct Shape {
    int B, T, C, NH;
  };
  for (const Shape& s : {Shape{1, 1, 16, 1}, Shape{2, 7, 32, 2}, Shape{1, 45, 48, 1}, Shape{2, 130, 64, 2},
                         Shape{1, 67, 80, 1}, Shape{1, 256, 128, 2}, Shape{1, 600, 32, 2}}) {
    SCOPED_TRACE("B " + std::to_string(s.B) + " T " + std::to_string(s.T) + " C " + std::to_string(s.C) + " NH " +
                 std::to_string(s.NH));
    CheckAttentionForward(s.B, s.T, s.C, s.NH, 20 + s.T, 3.0f);
    CheckAttentionBackward(s.B, s.T, s.C, s.NH, 30 + s.T, 2.0f, false);
  }
}

// The tiled kernel: each (b, h) is one thread's work in a fixed order, so its results are the
// same bits on any thread count (the sgemm kernel's are too); and it is another kernel than the
// sgemm one (the setting takes effect: other bits, the same values to rounding).
TEST_F(KernelsTest, TiledAttentionIsTheSameOnAnyThreadCountAndDiffersFromSgemmOnlyByRounding) {
  const Fp32Attention saved = CurrentFp32Attention();
  const int B = 2, T = 130, C = 64, NH = 2;
  const VecF qkv = RandomFloats((size_t)B * T * 3 * C, 41, -2, 2), dout = RandomFloats((size_t)B * T * C, 42);
  auto run = [&](Fp32Attention way, int threads) {
    SetFp32Attention(way);
    SetComputeThreads(threads);
    VecF out((size_t)B * T * C), lse((size_t)B * NH * T), dqkv(qkv.size(), 0.0f);
    attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
    attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
    out.insert(out.end(), dqkv.begin(), dqkv.end());
    return out;
  };
  const VecF tiled1 = run(Fp32Attention::kTiled, 1), tiled2 = run(Fp32Attention::kTiled, 2);
  const VecF sgemm = run(Fp32Attention::kSgemm, 2);
  SetFp32Attention(saved);
  EXPECT_TRUE(BitwiseEqual(tiled1, tiled2));
  EXPECT_FALSE(BitwiseEqual(tiled2, sgemm));
  ExpectClose(tiled2, sgemm, 1e-5, 1e-5, "tiled vs sgemm");
}

INSTANTIATE_TEST_SUITE_P(BothWays, KernelsAttentionWays,
                         ::testing::Values(Fp32Attention::kSgemm, Fp32Attention::kTiled),
                         [](const ::testing::TestParamInfo<Fp32Attention>& info) {
                           return std::string(Fp32AttentionName(info.param));
                         });

// ---------------------------------------------------------------------------------------------

using KernelsGelu = KernelsTest;

TEST_F(KernelsGelu, ForwardMatchesReference) {
  VecF x = RandomFloats(40000, 1, -8, 8);  // several elementwise chunks; saturated tails included
  x[0] = 0.0f;
  x[1] = -30.0f;
  x[2] = 30.0f;
  VecF out(x.size());
  gelu_forward(out.data(), x.data(), x.size());
  VecD ref(x.size());
  for (size_t i = 0; i < x.size(); i++) ref[i] = RefGelu(x[i]);
  ExpectClose(out, ref, 1e-5, 1e-6, "gelu");
}

TEST_F(KernelsGelu, BackwardMatchesNumericAndAccumulates) {
  const size_t n = 33;
  VecF x = RandomFloats(n, 2, -5, 5), dout = RandomFloats(n, 3);
  VecF dinp = RandomFloats(n, 4), dinp0 = dinp;
  gelu_backward(dinp.data(), x.data(), dout.data(), n);
  VecD want(n);
  for (size_t i = 0; i < n; i++) {
    const double h = 1e-6;
    want[i] = dinp0[i] + dout[i] * (RefGelu(x[i] + h) - RefGelu(x[i] - h)) / (2 * h);
  }
  ExpectClose(dinp, want, 1e-4, 1e-5, "dinp");
}

// ---------------------------------------------------------------------------------------------

using KernelsResidual = KernelsTest;

TEST_F(KernelsResidual, ForwardAndBackward) {
  const size_t n = 20001;
  VecF a = RandomFloats(n, 1), b = RandomFloats(n, 2), out(n, NAN), dout = RandomFloats(n, 3);
  residual_forward(out.data(), a.data(), b.data(), n);
  for (size_t i = 0; i < n; i++) ASSERT_EQ(out[i], a[i] + b[i]) << i;
  VecF da = a, db = b;  // accumulate onto existing content
  residual_backward(da.data(), db.data(), dout.data(), n);
  for (size_t i = 0; i < n; i++) {
    ASSERT_EQ(da[i], a[i] + dout[i]) << i;
    ASSERT_EQ(db[i], b[i] + dout[i]) << i;
  }
}

// The fused kernel gives bitwise what residual_forward then layernorm_forward give (so fusing
// it into the model changes no CPU result), at C that is and is not a multiple of the SIMD width.
TEST_F(KernelsResidual, FusedLayernormBitwiseEqualsTheTwoKernels) {
  for (int C : {37, 64, 768}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    const int N = 45;
    const size_t NC = (size_t)N * C;
    VecF a = RandomFloats(NC, 1, -3, 3), b = RandomFloats(NC, 2, -3, 3);
    VecF w = RandomFloats(C, 3), bias = RandomFloats(C, 4);
    VecF res(NC, NAN), ln(NC, NAN), mean(N, NAN), rstd(N, NAN);
    residual_forward(res.data(), a.data(), b.data(), NC);
    layernorm_forward(ln.data(), mean.data(), rstd.data(), res.data(), w.data(), bias.data(), N, C);
    VecF fres(NC, NAN), fln(NC, NAN), fmean(N, NAN), frstd(N, NAN);
    residual_layernorm_forward(fres.data(), fln.data(), fmean.data(), frstd.data(), a.data(), b.data(), w.data(),
                               bias.data(), N, C);
    EXPECT_EQ(0, std::memcmp(res.data(), fres.data(), NC * sizeof(float))) << "res";
    EXPECT_EQ(0, std::memcmp(ln.data(), fln.data(), NC * sizeof(float))) << "ln";
    EXPECT_EQ(0, std::memcmp(mean.data(), fmean.data(), N * sizeof(float))) << "mean";
    EXPECT_EQ(0, std::memcmp(rstd.data(), frstd.data(), N * sizeof(float))) << "rstd";
    // and it is a LayerNorm of a + b: row 0 against a double reference
    double m = 0, v = 0;
    for (int i = 0; i < C; i++) m += (double)a[i] + b[i];
    m /= C;
    for (int i = 0; i < C; i++) v += ((double)a[i] + b[i] - m) * ((double)a[i] + b[i] - m);
    const double r = 1.0 / std::sqrt(v / C + 1e-5);
    for (int i = 0; i < C; i++) ASSERT_NEAR(fln[i], ((double)a[i] + b[i] - m) * r * w[i] + bias[i], 1e-4) << i;
  }
}

// ---------------------------------------------------------------------------------------------

using KernelsCrossEntropy = KernelsTest;

TEST_F(KernelsCrossEntropy, LossMatchesReference) {
  const int N = 6, V = 1000, Vp = 1024;
  VecF logits = RandomFloats((size_t)N * Vp, 1, -10, 10);
  auto tgt = RandomTokens(N, V, 2);
  VecF copy = logits, losses(N, NAN);
  const double total = crossentropy_softmax(copy.data(), losses.data(), tgt.data(), N, V, Vp, 0.0f);
  const VecD ref = RefCrossEntropy(ToD(logits), tgt, N, V, Vp);
  ExpectClose(losses, ref, 1e-5, 1e-5, "losses");
  double sum = 0;
  for (double l : ref) sum += l;
  EXPECT_NEAR(total, sum, 1e-4);
  EXPECT_TRUE(BitwiseEqual(copy, logits)) << "dloss_scale == 0 must leave logits untouched";
}

TEST_F(KernelsCrossEntropy, GradientMatchesNumeric) {
  const int N = 6, V = 10, Vp = 16;
  const float scale = 1.0f / N;
  VecF lf = RandomFloats((size_t)N * Vp, 3, -3, 3);
  auto tgt = RandomTokens(N, V, 4);
  VecD l = ToD(lf);
  auto loss = [&] {
    double s = 0;
    for (double x : RefCrossEntropy(l, tgt, N, V, Vp)) s += x;
    return scale * s;
  };
  const VecD g = NumGrad(l, loss);  // padded columns: exactly 0
  VecF grad = lf, losses(N);
  crossentropy_softmax(grad.data(), losses.data(), tgt.data(), N, V, Vp, scale);
  ExpectClose(grad, g, 1e-4, 1e-6, "dlogits");
  ExpectClose(losses, RefCrossEntropy(ToD(lf), tgt, N, V, Vp), 1e-5, 1e-5, "losses");
  for (int n = 0; n < N; n++)
    for (int v = V; v < Vp; v++) ASSERT_EQ(grad[(size_t)n * Vp + v], 0.0f) << n << "," << v;
}

TEST_F(KernelsCrossEntropy, PaddedColumnsIgnored) {
  const int N = 5, V = 10, Vp = 16;
  VecF logits = RandomFloats((size_t)N * Vp, 5, -2, 2);
  auto tgt = RandomTokens(N, V, 6);
  VecF huge = logits;
  for (int n = 0; n < N; n++)
    for (int v = V; v < Vp; v++) {
      logits[(size_t)n * Vp + v] = 0.0f;
      huge[(size_t)n * Vp + v] = 1e30f;
    }
  VecF l1(N), l2(N);
  const double t1 = crossentropy_softmax(logits.data(), l1.data(), tgt.data(), N, V, Vp, 1.0f);
  const double t2 = crossentropy_softmax(huge.data(), l2.data(), tgt.data(), N, V, Vp, 1.0f);
  EXPECT_TRUE(BitwiseEqual(l1, l2));
  EXPECT_EQ(t1, t2);
  EXPECT_TRUE(BitwiseEqual(logits, huge)) << "gradients must not depend on padded logits";
  for (int n = 0; n < N; n++) {
    double rowsum = 0;
    for (int v = 0; v < Vp; v++) rowsum += huge[(size_t)n * Vp + v];
    EXPECT_NEAR(rowsum, 0.0, 1e-6) << "softmax - onehot sums to 0 over the row";
    for (int v = V; v < Vp; v++) EXPECT_EQ(huge[(size_t)n * Vp + v], 0.0f);
  }
}

TEST_F(KernelsCrossEntropy, ExtremeLogitsStayFinite) {
  const int N = 2, V = 300, Vp = 384;
  VecF logits = RandomFloats((size_t)N * Vp, 7, -1, 1);
  logits[5] = 500.0f;           // row 0: one dominant logit (target elsewhere)
  logits[Vp + 7] = -500.0f;     // row 1: target far below the rest
  std::vector<int32_t> tgt = {9, 7};
  VecF losses(N);
  VecD ref = RefCrossEntropy(ToD(logits), tgt, N, V, Vp);
  crossentropy_softmax(logits.data(), losses.data(), tgt.data(), N, V, Vp, 1.0f);
  ExpectClose(losses, ref, 1e-5, 1e-3, "losses");
  for (float g : logits) ASSERT_TRUE(std::isfinite(g));
  EXPECT_NEAR(logits[5], 1.0f, 1e-6);  // softmax ~ onehot at the dominant column
  EXPECT_NEAR(logits[9], -1.0f, 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Determinism: the same inputs twice give bitwise the same outputs with 2 threads, at sizes
// where the work is actually split between the threads.

using KernelsDeterminism = KernelsTest;

TEST_F(KernelsDeterminism, AllKernelsBitwiseReproducibleWithTwoThreads) {
  ASSERT_EQ(ComputeThreads(), 2);
  const int B = 2, T = 130, C = 64, NH = 4, V = 1000, Vp = 1024, OC = 1100, N = B * T;
  auto run = [&] {
    std::vector<VecF> r;
    auto tok = RandomTokens(N, 50, 1);
    VecF wte = RandomFloats((size_t)50 * C, 2), wpe = RandomFloats((size_t)T * C, 3), x((size_t)N * C);
    encoder_forward(x.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    VecF dwte((size_t)50 * C, 0.0f), dwpe((size_t)T * C, 0.0f);
    VecF dx = RandomFloats((size_t)N * C, 4);
    encoder_backward(dwte.data(), dwpe.data(), dx.data(), tok.data(), B, T, C);
    r.push_back(dwte);
    r.push_back(dwpe);

    VecF w = RandomFloats(C, 5), b = RandomFloats(C, 6), ln((size_t)N * C), mean(N), rstd(N);
    layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    VecF dln((size_t)N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
    layernorm_backward(dln.data(), dw.data(), db.data(), dx.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                       C);
    r.insert(r.end(), {ln, dln, dw, db});

    VecF mw = RandomFloats((size_t)OC * C, 7), mb = RandomFloats(OC, 8), mo((size_t)N * OC);
    matmul_forward(mo.data(), ln.data(), mw.data(), mb.data(), N, C, OC);
    VecF mdi((size_t)N * C, 0.0f), mdw((size_t)OC * C, 0.0f), mdb(OC, 0.0f);
    VecF mdo = RandomFloats((size_t)N * OC, 9);
    matmul_backward(mdi.data(), mdw.data(), mdb.data(), mdo.data(), ln.data(), mw.data(), N, C, OC);
    r.insert(r.end(), {mo, mdi, mdw, mdb});

    VecF qkv = RandomFloats((size_t)N * 3 * C, 10, -2, 2), ao((size_t)N * C), lse((size_t)B * NH * T);
    attention_forward(ao.data(), lse.data(), qkv.data(), B, T, C, NH);
    VecF dqkv(qkv.size(), 0.0f);
    attention_backward(dqkv.data(), dx.data(), qkv.data(), ao.data(), lse.data(), B, T, C, NH);
    r.insert(r.end(), {ao, lse, dqkv});

    VecF g((size_t)N * C), dg((size_t)N * C, 0.0f);
    gelu_forward(g.data(), qkv.data(), g.size());
    gelu_backward(dg.data(), qkv.data(), dx.data(), g.size());
    r.insert(r.end(), {g, dg});

    VecF logits = RandomFloats((size_t)64 * Vp, 11, -5, 5), losses(64);
    auto tgt = RandomTokens(64, V, 12);
    const double total = crossentropy_softmax(logits.data(), losses.data(), tgt.data(), 64, V, Vp, 0.5f);
    r.insert(r.end(), {logits, losses, VecF{(float)total, (float)(total - (float)total)}});
    return r;
  };
  const auto r1 = run();
  const auto r2 = run();
  ASSERT_EQ(r1.size(), r2.size());
  for (size_t i = 0; i < r1.size(); i++) EXPECT_TRUE(BitwiseEqual(r1[i], r2[i])) << "output #" << i;
}

TEST_F(KernelsDeterminism, ThreadCountChangesResultsOnlyByRounding) {
  const int N = 64, C = 384;
  VecF x = RandomFloats((size_t)N * C, 1), w = RandomFloats(C, 2), dout = RandomFloats((size_t)N * C, 3);
  VecF mean(N), rstd(N), out((size_t)N * C);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), w.data(), N, C);
  VecF dw1(C, 0.0f), db1(C, 0.0f), dw2(C, 0.0f), db2(C, 0.0f), di((size_t)N * C, 0.0f);
  SetComputeThreads(1);
  layernorm_backward(di.data(), dw1.data(), db1.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                     C);
  SetComputeThreads(2);
  layernorm_backward(di.data(), dw2.data(), db2.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                     C);
  ExpectClose(dw2, dw1, 1e-5, 1e-5, "dw 2 vs 1 threads");
  ExpectClose(db2, db1, 1e-5, 1e-5, "db 2 vs 1 threads");
}

// The optimizer's one pass (adamw_mixed) is bitwise the three-call sequence it fuses:
// widen the gradient to fp32 (convert), adamw_update, narrow the master to the stored dtype
// (convert), for every gradient dtype and stored form, at several steps, scales and decays,
// on lengths that leave vector tails.
TEST(KernelsAdamWMixed, BitwiseTheConvertAdamWConvertSequence) {
  SetComputeThreads(2);
  AdamWConfig cfg;
  for (const size_t n : {size_t{1}, size_t{37}, size_t{4099}})
    for (const DType gd : {DType::kF32, DType::kBF16})
      for (const int store : {0, 1, 2}) {  // 0: stored is the master (fp32), 1: separate fp32, 2: bf16
        const DType sd = store == 2 ? DType::kBF16 : DType::kF32;
        SCOPED_TRACE("n=" + std::to_string(n) + " grad " + DTypeName(gd) + " store " + std::to_string(store));
        VecF master = RandomFloats(n, 1, -2, 2), m = RandomFloats(n, 2, -0.1f, 0.1f),
             v = RandomFloats(n, 3, 0.0f, 0.01f), g32 = RandomFloats(n, 4, -3, 3);
        master[0] = 0.0f;  // a zero parameter and gradient
        g32[0] = 0.0f;
        std::vector<uint16_t> g16(n);
        convert(g32.data(), DType::kF32, g16.data(), DType::kBF16, n);
        const void* grad = gd == DType::kBF16 ? static_cast<const void*>(g16.data()) : g32.data();
        VecF m1 = master, mm1 = m, v1 = v, m2 = master, mm2 = m, v2 = v, s32a(n), s32b(n);
        std::vector<uint16_t> s16a(n), s16b(n);
        for (int t = 1; t <= 3; t++) {
          const float lr = 1e-3f * t, wd = t == 2 ? 0.0f : 0.1f, scale = t == 3 ? 0.37f : 1.0f;
          // the three-call sequence
          VecF gw(n);
          convert(grad, gd, gw.data(), DType::kF32, n);
          adamw_update(m1.data(), gw.data(), mm1.data(), v1.data(), n, lr, wd, cfg, t, scale);
          if (store == 1) convert(m1.data(), DType::kF32, s32a.data(), DType::kF32, n);
          if (store == 2) convert(m1.data(), DType::kF32, s16a.data(), DType::kBF16, n);
          // the one pass
          void* stored = store == 0 ? static_cast<void*>(m2.data())
                                    : store == 1 ? static_cast<void*>(s32b.data()) : static_cast<void*>(s16b.data());
          adamw_mixed(m2.data(), stored, sd, grad, gd, mm2.data(), v2.data(), n, lr, wd, cfg, t, scale);
        }
        EXPECT_EQ(0, std::memcmp(m1.data(), m2.data(), n * sizeof(float))) << "master";
        EXPECT_EQ(0, std::memcmp(mm1.data(), mm2.data(), n * sizeof(float))) << "m";
        EXPECT_EQ(0, std::memcmp(v1.data(), v2.data(), n * sizeof(float))) << "v";
        if (store == 1) EXPECT_EQ(0, std::memcmp(s32a.data(), s32b.data(), n * sizeof(float))) << "stored fp32";
        if (store == 2) EXPECT_EQ(0, std::memcmp(s16a.data(), s16b.data(), n * sizeof(uint16_t))) << "stored bf16";
        EXPECT_NE(m1[n - 1], master[n - 1]);  // the parameters did move
      }
}

// The gradient norm's sum of squares: the same bits on 1, 2 and 3 threads (its blocks do not
// depend on the thread count), within rounding of a long-double sum, fp32 and bf16, over
// several blocks with a tail and below one block.
TEST_F(KernelsThreads, SumSquaresIsTheSameOnAnyThreadCountAndMatchesALongDoubleSum) {
  for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{3 * 32768 + 5}}) {
    VecF x = RandomFloats(n, 11);
    std::vector<uint16_t> xb(n);
    for (size_t i = 0; i < n; i++) xb[i] = FloatToBf16(x[i]);
    long double ref = 0, refb = 0;
    for (size_t i = 0; i < n; i++) {
      ref += (long double)x[i] * x[i];
      refb += (long double)Bf16ToFloat(xb[i]) * Bf16ToFloat(xb[i]);
    }
    double got[3], gotb[3];
    for (int t = 1; t <= 3; t++) {
      SetComputeThreads(t);
      got[t - 1] = sum_squares(x.data(), DType::kF32, n);
      gotb[t - 1] = sum_squares(xb.data(), DType::kBF16, n);
    }
    for (int t = 1; t < 3; t++) {
      EXPECT_EQ(got[t], got[0]) << "n=" << n << " threads=" << t + 1;
      EXPECT_EQ(gotb[t], gotb[0]) << "n=" << n << " threads=" << t + 1;
    }
    EXPECT_NEAR(got[0], (double)ref, 1e-12 * (double)ref) << "n=" << n;
    EXPECT_NEAR(gotb[0], (double)refb, 1e-12 * (double)refb) << "n=" << n;
  }
}

}  // namespace
}  // namespace shardgpt
