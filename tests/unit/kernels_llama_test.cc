// Tests of the Llama block's CPU kernels (model/kernels_cpu_llama.h): RMSNorm, RoPE, SwiGLU and
// grouped-query kv_repeat, fp32 and bf16.
//
// Method: every kernel has a straightforward double-precision reference here, written from the
// header's formulas (not from the kernel code). Forward outputs are compared with it; backward
// kernels with the reference's analytic derivative and/or central finite differences (double)
// of L = sum(dout * out); RoPE's backward as the adjoint of its forward (<rope(x), y> =
// <x, rope_backward(y)>) and as its inverse. Every backward starts from a non-zero gradient (it
// must add). Sizes are odd on purpose (N = 7, C = 40, hs = 10, F = 24), and RoPE runs B = 2
// sequences of T > 1 so that positions restart per sequence. The bf16 overloads are compared
// with the fp32 ones on the same (bf16-representable) inputs, within two bf16 ulps.
#include "base/bf16.h"
#include "model/kernels_cpu.h"
#include "model/kernels_cpu_llama.h"
#include "tests/common/random_data.h"

#include <gtest/gtest.h>

#include "test_util.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

namespace shardgpt {
namespace {

using VecF = std::vector<float>;
using VecD = std::vector<double>;
using VecH = std::vector<uint16_t>;  // bf16 bits

VecD ToD(const VecF& v) { return VecD(v.begin(), v.end()); }

template <typename A, typename B>
double Dot(const A& a, const B& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += (double)a[i] * (double)b[i];
  return s;
}

using testutil::BitwiseEqual;
using testutil::ExpectClose;

// bf16 helpers: values rounded to bf16 (so that both overloads read the same numbers).
VecF RoundBf16(VecF v) {
  for (auto& x : v) x = RoundToBf16(x);
  return v;
}
VecH ToBf16(const VecF& v) {
  VecH h(v.size());
  for (size_t i = 0; i < v.size(); i++) h[i] = FloatToBf16(v[i]);
  return h;
}
VecF FromBf16(const VecH& h) {
  VecF v(h.size());
  for (size_t i = 0; i < h.size(); i++) v[i] = Bf16ToFloat(h[i]);
  return v;
}
VecF RandomBf16Floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  return RoundBf16(RandomFloats(n, seed, lo, hi));
}

// The bf16 result within `ulps` bf16 ulps (2^-7 relative to the leading power of two) of the
// fp32 kernel's result on the same inputs.
void ExpectWithinBf16Ulps(const VecH& got, const VecF& want, double ulps, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double w = want[i], g = Bf16ToFloat(got[i]);
    const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(w), 1e-30)) - 7);
    if (!(std::fabs(g - w) <= ulps * ulp)) {
      if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: bf16 " << g << " fp32 " << w;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements beyond " << ulps << " bf16 ulps";
}

// Central differences (double) of loss() with respect to x[i] (perturbed in place).
double NumGradAt(VecD& x, size_t i, const std::function<double()>& loss, double h = 1e-6) {
  const double x0 = x[i];
  x[i] = x0 + h;
  const double lp = loss();
  x[i] = x0 - h;
  const double lm = loss();
  x[i] = x0;
  return (lp - lm) / (2 * h);
}

class KernelsLlamaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = ComputeThreads();
    SetComputeThreads(2);
  }
  void TearDown() override { SetComputeThreads(saved_); }
  int saved_ = 1;
};

// ---------------------------------------------------------------------------------------------
// Double references.

// y = x / sqrt(mean(x^2) + eps) * w
VecD RefRmsnorm(const VecD& x, const VecD& w, int N, int C, double eps, VecD* rstd = nullptr) {
  VecD y(x.size());
  if (rstd) rstd->assign(N, 0.0);
  for (int n = 0; n < N; n++) {
    double ss = 0;
    for (int c = 0; c < C; c++) ss += x[(size_t)n * C + c] * x[(size_t)n * C + c];
    const double r = 1.0 / std::sqrt(ss / C + eps);
    if (rstd) (*rstd)[n] = r;
    for (int c = 0; c < C; c++) y[(size_t)n * C + c] = x[(size_t)n * C + c] * r * w[c];
  }
  return y;
}

// The header's fp32 inv_freq and angle (as transformers), then cos/sin in double.
struct RopeAngles {
  VecD c, s;  // [T][hs/2]
};
RopeAngles RefRopeAngles(int T, int hs, float theta, bool fp32_angle = true) {
  const int h2 = hs / 2;
  RopeAngles a{VecD((size_t)T * h2), VecD((size_t)T * h2)};
  for (int t = 0; t < T; t++)
    for (int i = 0; i < h2; i++) {
      double angle;
      if (fp32_angle) {
        const float inv_freq = 1.0f / std::pow(theta, (float)(2 * i) / (float)hs);
        angle = (double)((float)t * inv_freq);
      } else {
        angle = (double)t / std::pow((double)theta, 2.0 * i / hs);
      }
      a.c[(size_t)t * h2 + i] = std::cos(angle);
      a.s[(size_t)t * h2 + i] = std::sin(angle);
    }
  return a;
}

// Rotate-half on the NH + KV query and key heads of each row, by +angle (sign 1) or -angle (-1).
VecD RefRope(const VecD& x, int B, int T, int NH, int KV, int hs, const RopeAngles& a, double sign = 1.0) {
  VecD y(x);
  const int W = (NH + 2 * KV) * hs, h2 = hs / 2;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < NH + KV; h++) {
        const size_t o = ((size_t)b * T + t) * W + (size_t)h * hs;
        for (int i = 0; i < h2; i++) {
          const double c = a.c[(size_t)t * h2 + i], s = sign * a.s[(size_t)t * h2 + i];
          const double x0 = x[o + i], x1 = x[o + i + h2];
          y[o + i] = x0 * c - x1 * s;
          y[o + i + h2] = x1 * c + x0 * s;
        }
      }
  return y;
}

double Sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

// out[n,j] = silu(gate) * up
VecD RefSwiglu(const VecD& gu, int N, int F) {
  VecD out((size_t)N * F);
  for (int n = 0; n < N; n++)
    for (int j = 0; j < F; j++) {
      const double g = gu[(size_t)n * 2 * F + j], u = gu[(size_t)n * 2 * F + F + j];
      out[(size_t)n * F + j] = g * Sigmoid(g) * u;
    }
  return out;
}

// Column of qkv[n] (width (NH + 2KV) hs) that query head h's key (part 1) or value (part 2)
// element i of the repeated row comes from; part 0: the query itself.
size_t KvSource(int part, int h, int i, int NH, int KV, int hs) {
  const int kvh = h / (NH / KV);
  if (part == 0) return (size_t)h * hs + i;
  return (size_t)(NH + (part - 1) * KV + kvh) * hs + i;
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

using KernelsLlamaRmsnorm = KernelsLlamaTest;

TEST_F(KernelsLlamaRmsnorm, ForwardMatchesReference) {
  const int N = 7, C = 40;
  const float eps = 1e-5f;
  VecF x = RandomFloats((size_t)N * C, 1, -2, 3), w = RandomFloats(C, 2, 0.5f, 1.5f);
  VecF out((size_t)N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  VecD rr;
  VecD ref = RefRmsnorm(ToD(x), ToD(w), N, C, eps, &rr);
  ExpectClose(out, ref, 1e-5, 1e-6, "out");
  ExpectClose(rstd, rr, 1e-6, 0, "rstd");
}

TEST_F(KernelsLlamaRmsnorm, EpsDominatesAZeroRow) {
  const int C = 40;
  VecF x(C, 0.0f), w(C, 1.0f), out(C, 1.0f), rstd(1);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), 1, C, 1e-6f);
  EXPECT_NEAR(rstd[0], 1.0 / std::sqrt((double)1e-6f), 1e-3);
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

TEST_F(KernelsLlamaRmsnorm, BackwardMatchesNumericAndAccumulates) {
  const int N = 7, C = 40;
  const float eps = 1e-5f;
  VecF xf = RandomFloats((size_t)N * C, 3, -2, 2), wf = RandomFloats(C, 4, 0.5f, 1.5f);
  VecF dout = RandomFloats((size_t)N * C, 5);
  VecD x = ToD(xf), w = ToD(wf);
  auto loss = [&] { return Dot(RefRmsnorm(x, w, N, C, eps), dout); };
  VecD gx(x.size()), gw(C);
  for (size_t i = 0; i < x.size(); i++) gx[i] = NumGradAt(x, i, loss);
  for (int c = 0; c < C; c++) gw[c] = NumGradAt(w, c, loss);

  VecF out((size_t)N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), xf.data(), wf.data(), N, C, eps);
  VecF dinp = RandomFloats((size_t)N * C, 6), dinp0 = dinp;  // accumulates onto existing content
  VecF dw = RandomFloats(C, 7), dw0 = dw;
  rmsnorm_backward(dinp.data(), dw.data(), dout.data(), xf.data(), wf.data(), rstd.data(), N, C);
  VecD want_dinp(gx), want_dw(gw);
  for (size_t i = 0; i < want_dinp.size(); i++) want_dinp[i] += dinp0[i];
  for (int c = 0; c < C; c++) want_dw[c] += dw0[c];
  ExpectClose(dinp, want_dinp, 1e-4, 1e-4, "dinp");
  ExpectClose(dw, want_dw, 1e-4, 1e-4, "dw");

  // A second call adds the same again.
  rmsnorm_backward(dinp.data(), dw.data(), dout.data(), xf.data(), wf.data(), rstd.data(), N, C);
  for (size_t i = 0; i < want_dinp.size(); i++) want_dinp[i] += gx[i];
  for (int c = 0; c < C; c++) want_dw[c] += gw[c];
  ExpectClose(dinp, want_dinp, 1e-4, 1e-4, "dinp twice");
  ExpectClose(dw, want_dw, 1e-4, 1e-4, "dw twice");
}

TEST_F(KernelsLlamaRmsnorm, Bf16MatchesFp32) {
  const int N = 7, C = 40;
  const float eps = 1e-5f;
  VecF x = RandomBf16Floats((size_t)N * C, 8, -2, 2), w = RandomFloats(C, 9, 0.5f, 1.5f);
  VecF dout = RandomBf16Floats((size_t)N * C, 10), dinp = RandomBf16Floats((size_t)N * C, 11);
  VecF dw = RandomFloats(C, 12);
  VecH dinph = ToBf16(dinp);  // the same starting gradient

  VecF out((size_t)N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  VecF dw32 = dw;
  rmsnorm_backward(dinp.data(), dw32.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);

  VecH xh = ToBf16(x), outh((size_t)N * C), douth = ToBf16(dout);
  VecF rstdh(N), dwh = dw;
  rmsnorm_forward(outh.data(), rstdh.data(), xh.data(), w.data(), N, C, eps);
  ExpectWithinBf16Ulps(outh, out, 2, "out");
  ExpectClose(rstdh, rstd, 1e-6, 0, "rstd");
  rmsnorm_backward(dinph.data(), dwh.data(), douth.data(), xh.data(), w.data(), rstdh.data(), N, C);
  ExpectWithinBf16Ulps(dinph, dinp, 2, "dinp");
  ExpectClose(dwh, dw32, 1e-5, 1e-6, "dw");
}

// ---------------------------------------------------------------------------------------------
// RoPE

using KernelsLlamaRope = KernelsLlamaTest;

constexpr int kB = 2, kT = 5, kNH = 4, kKV = 2, kHs = 10;
constexpr int kW = (kNH + 2 * kKV) * kHs;
constexpr float kTheta = 10000.0f;

TEST_F(KernelsLlamaRope, ForwardMatchesFormula) {
  for (float theta : {kTheta, 500000.0f}) {
    SCOPED_TRACE(theta);
    VecF x = RandomFloats((size_t)kB * kT * kW, 20, -2, 2), y = x;
    rope_forward(y.data(), kB, kT, kNH, kKV, kHs, theta);
    VecD ref = RefRope(ToD(x), kB, kT, kNH, kKV, kHs, RefRopeAngles(kT, kHs, theta));
    ExpectClose(y, ref, 1e-6, 1e-6, "rope");
    for (int n = 0; n < kB * kT; n++) {
      // value heads untouched (bitwise)
      const size_t v0 = (size_t)n * kW + (size_t)(kNH + kKV) * kHs;
      EXPECT_EQ(0, std::memcmp(&y[v0], &x[v0], sizeof(float) * kKV * kHs)) << "row " << n;
      // position 0 (the first row of each sequence: positions restart per sequence) is the identity
      const int moved = std::memcmp(&y[(size_t)n * kW], &x[(size_t)n * kW], sizeof(float) * kW);
      EXPECT_EQ(n % kT == 0, moved == 0) << "row " << n;
    }
    // the second sequence is rotated as the first: same input rows give the same output rows
    VecF x2 = x;
    std::memcpy(&x2[(size_t)kT * kW], &x2[0], sizeof(float) * kT * kW);
    rope_forward(x2.data(), kB, kT, kNH, kKV, kHs, theta);
    EXPECT_EQ(0, std::memcmp(&x2[(size_t)kT * kW], &x2[0], sizeof(float) * kT * kW));
  }
}

// At large positions the fp32 angle (t * inv_freq rounded to fp32, as transformers) differs from
// the exact one by up to ~1e-4 rad: the kernel follows the fp32 angle.
TEST_F(KernelsLlamaRope, AngleIsFp32AtLargePositions) {
  const int T = 4096, NH = 1, KV = 1, hs = 10, W = (NH + 2 * KV) * hs;
  VecF x = RandomFloats((size_t)T * W, 21, -1, 1), y = x;
  rope_forward(y.data(), 1, T, NH, KV, hs, kTheta);
  VecD ref32 = RefRope(ToD(x), 1, T, NH, KV, hs, RefRopeAngles(T, hs, kTheta, true));
  VecD ref64 = RefRope(ToD(x), 1, T, NH, KV, hs, RefRopeAngles(T, hs, kTheta, false));
  ExpectClose(y, ref32, 1e-6, 2e-6, "fp32 angle");
  double far = 0;
  for (size_t i = 0; i < y.size(); i++) far = std::max(far, std::fabs(ref32[i] - ref64[i]));
  EXPECT_GT(far, 1e-5);  // the check above tells the two apart
}

TEST_F(KernelsLlamaRope, BackwardIsAdjointAndInverse) {
  VecF x = RandomFloats((size_t)kB * kT * kW, 22, -2, 2), y = RandomFloats((size_t)kB * kT * kW, 23, -2, 2);
  VecF rx = x, by = y;
  rope_forward(rx.data(), kB, kT, kNH, kKV, kHs, kTheta);
  rope_backward(by.data(), kB, kT, kNH, kKV, kHs, kTheta);
  const double lhs = Dot(rx, y), rhs = Dot(x, by);
  EXPECT_NEAR(lhs, rhs, 1e-5 * (std::fabs(lhs) + 1.0));
  // backward against the formula (rotation by -a)
  VecD ref = RefRope(ToD(y), kB, kT, kNH, kKV, kHs, RefRopeAngles(kT, kHs, kTheta), -1.0);
  ExpectClose(by, ref, 1e-6, 1e-6, "rope_backward");
  // value heads of the gradient untouched
  for (int n = 0; n < kB * kT; n++) {
    const size_t v0 = (size_t)n * kW + (size_t)(kNH + kKV) * kHs;
    EXPECT_EQ(0, std::memcmp(&by[v0], &y[v0], sizeof(float) * kKV * kHs)) << "row " << n;
  }
  // backward(forward(x)) = x
  rope_backward(rx.data(), kB, kT, kNH, kKV, kHs, kTheta);
  ExpectClose(rx, x, 0, 1e-6, "backward(forward(x))");
}

TEST_F(KernelsLlamaRope, Bf16MatchesFp32) {
  VecF x = RandomBf16Floats((size_t)kB * kT * kW, 24, -2, 2);
  for (bool backward : {false, true}) {
    SCOPED_TRACE(backward ? "backward" : "forward");
    VecF y = x;
    VecH yh = ToBf16(x);
    if (backward) {
      rope_backward(y.data(), kB, kT, kNH, kKV, kHs, kTheta);
      rope_backward(yh.data(), kB, kT, kNH, kKV, kHs, kTheta);
    } else {
      rope_forward(y.data(), kB, kT, kNH, kKV, kHs, kTheta);
      rope_forward(yh.data(), kB, kT, kNH, kKV, kHs, kTheta);
    }
    ExpectWithinBf16Ulps(yh, y, 2, "rope bf16");
    // value heads and position 0 keep their bits
    for (int n = 0; n < kB * kT; n++) {
      const size_t v0 = (size_t)n * kW + (size_t)(kNH + kKV) * kHs;
      const VecH xh = ToBf16(x);
      EXPECT_EQ(0, std::memcmp(&yh[v0], &xh[v0], 2 * kKV * kHs)) << "row " << n;
      if (n % kT == 0) {
        EXPECT_EQ(0, std::memcmp(&yh[(size_t)n * kW], &xh[(size_t)n * kW], 2 * kW)) << n;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

using KernelsLlamaSwiglu = KernelsLlamaTest;

TEST_F(KernelsLlamaSwiglu, ForwardMatchesReference) {
  const int N = 7, F = 24;
  VecF gu = RandomFloats((size_t)N * 2 * F, 30, -8, 8);
  gu[0] = 0.0f;
  gu[1] = -90.0f;  // past exp's clamp: silu -> -0
  gu[2] = 90.0f;   // silu -> g
  VecF out((size_t)N * F);
  swiglu_forward(out.data(), gu.data(), N, F);
  ExpectClose(out, RefSwiglu(ToD(gu), N, F), 1e-5, 1e-6, "out");
}

TEST_F(KernelsLlamaSwiglu, BackwardMatchesDerivativeAndAccumulates) {
  const int N = 7, F = 24;
  VecF gu = RandomFloats((size_t)N * 2 * F, 31, -6, 6), dout = RandomFloats((size_t)N * F, 32);
  // analytic, in double: d silu(g)/dg = s (1 + g (1 - s)), s = sigmoid(g)
  VecD want((size_t)N * 2 * F);
  for (int n = 0; n < N; n++)
    for (int j = 0; j < F; j++) {
      const double g = gu[(size_t)n * 2 * F + j], u = gu[(size_t)n * 2 * F + F + j], d = dout[(size_t)n * F + j];
      const double s = Sigmoid(g);
      want[(size_t)n * 2 * F + j] = d * u * (s + g * s * (1 - s));
      want[(size_t)n * 2 * F + F + j] = d * g * s;
    }
  VecF dgu = RandomFloats((size_t)N * 2 * F, 33), dgu0 = dgu;
  swiglu_backward(dgu.data(), gu.data(), dout.data(), N, F);
  VecD want_acc(want);
  for (size_t i = 0; i < want_acc.size(); i++) want_acc[i] += dgu0[i];
  ExpectClose(dgu, want_acc, 1e-5, 2e-6, "dgate_up");

  // finite differences of L = sum(dout * swiglu(gate_up)) at one gate and one up element
  VecD x = ToD(gu);
  auto loss = [&] { return Dot(RefSwiglu(x, N, F), dout); };
  for (size_t i : {(size_t)3 * 2 * F + 5, (size_t)3 * 2 * F + F + 5}) {
    const double fd = NumGradAt(x, i, loss);
    EXPECT_NEAR(want[i], fd, 1e-6 * (1 + std::fabs(fd))) << i;
    EXPECT_NEAR(dgu[i] - dgu0[i], fd, 1e-5 * (1 + std::fabs(fd))) << i;
  }
}

TEST_F(KernelsLlamaSwiglu, Bf16MatchesFp32) {
  const int N = 7, F = 24;
  VecF gu = RandomBf16Floats((size_t)N * 2 * F, 34, -6, 6), dout = RandomBf16Floats((size_t)N * F, 35);
  VecF dgu = RandomBf16Floats((size_t)N * 2 * F, 36);
  VecF out((size_t)N * F);
  VecH guh = ToBf16(gu), douth = ToBf16(dout), dguh = ToBf16(dgu), outh((size_t)N * F);
  swiglu_forward(out.data(), gu.data(), N, F);
  swiglu_forward(outh.data(), guh.data(), N, F);
  ExpectWithinBf16Ulps(outh, out, 2, "out");
  swiglu_backward(dgu.data(), gu.data(), dout.data(), N, F);
  swiglu_backward(dguh.data(), guh.data(), douth.data(), N, F);
  ExpectWithinBf16Ulps(dguh, dgu, 2, "dgate_up");
}

// ---------------------------------------------------------------------------------------------
// kv_repeat

using KernelsLlamaKvRepeat = KernelsLlamaTest;

// KV = NH (plain multi-head), 3 and 2 (groups of 2 and 3), 1 (multi-query).
const int kKvChoices[] = {6, 3, 2, 1};

TEST_F(KernelsLlamaKvRepeat, ForwardIsExact) {
  const int N = 7, NH = 6, hs = 10, C = NH * hs;
  for (int KV : kKvChoices) {
    SCOPED_TRACE(KV);
    const int W = (NH + 2 * KV) * hs;
    VecF qkv = RandomFloats((size_t)N * W, 40 + KV, -3, 3);
    VecF out((size_t)N * 3 * C, NAN);
    kv_repeat_forward(out.data(), qkv.data(), N, NH, KV, hs);
    VecF want((size_t)N * 3 * C);
    for (int n = 0; n < N; n++)
      for (int part = 0; part < 3; part++)
        for (int h = 0; h < NH; h++)
          for (int i = 0; i < hs; i++)
            want[(size_t)n * 3 * C + (size_t)part * C + (size_t)h * hs + i] =
                qkv[(size_t)n * W + KvSource(part, h, i, NH, KV, hs)];
    EXPECT_TRUE(BitwiseEqual(out, want));
    if (KV == NH) {
      EXPECT_TRUE(BitwiseEqual(out, qkv)) << "KV == NH: a plain copy";
    }
    VecH outh((size_t)N * 3 * C);
    kv_repeat_forward(outh.data(), ToBf16(qkv).data(), N, NH, KV, hs);
    EXPECT_TRUE(BitwiseEqual(outh, ToBf16(want))) << "bf16";
  }
}

TEST_F(KernelsLlamaKvRepeat, BackwardSumsGroupsAndAccumulates) {
  const int N = 7, NH = 6, hs = 10, C = NH * hs;
  for (int KV : kKvChoices) {
    SCOPED_TRACE(KV);
    const int W = (NH + 2 * KV) * hs;
    VecF dout = RandomFloats((size_t)N * 3 * C, 50 + KV), dqkv = RandomFloats((size_t)N * W, 60 + KV);
    const VecF dqkv0 = dqkv;
    kv_repeat_backward(dqkv.data(), dout.data(), N, NH, KV, hs);
    // reference: the adjoint of the forward's gather, in double
    VecD want = ToD(dqkv0);
    for (int n = 0; n < N; n++)
      for (int part = 0; part < 3; part++)
        for (int h = 0; h < NH; h++)
          for (int i = 0; i < hs; i++)
            want[(size_t)n * W + KvSource(part, h, i, NH, KV, hs)] +=
                dout[(size_t)n * 3 * C + (size_t)part * C + (size_t)h * hs + i];
    ExpectClose(dqkv, want, 1e-6, 1e-6, "dqkv");
    if (KV == NH) {  // a plain element-wise add
      VecF sum(dqkv0);
      for (size_t i = 0; i < sum.size(); i++) sum[i] += dout[i];
      EXPECT_TRUE(BitwiseEqual(dqkv, sum));
    }
    // bf16: the fp32 kernel's result on the same values, within two bf16 ulps
    VecF doutr = RoundBf16(dout), dq32 = RoundBf16(dqkv0);
    VecH dqh = ToBf16(dq32);
    kv_repeat_backward(dq32.data(), doutr.data(), N, NH, KV, hs);
    kv_repeat_backward(dqh.data(), ToBf16(doutr).data(), N, NH, KV, hs);
    ExpectWithinBf16Ulps(dqh, dq32, 2, "dqkv bf16");
  }
}

// KV = 1: every query head's key gradient lands in the single key head.
TEST_F(KernelsLlamaKvRepeat, MultiQueryBackwardSumsAllHeads) {
  const int N = 1, NH = 4, KV = 1, hs = 2, C = NH * hs, W = (NH + 2 * KV) * hs;
  VecF dout((size_t)3 * C, 0.0f), dqkv(W, 0.0f);
  for (int h = 0; h < NH; h++) {
    dout[C + h * hs] = 1.0f + h;       // dk head h, element 0
    dout[2 * C + h * hs + 1] = 10.0f;  // dv head h, element 1
  }
  kv_repeat_backward(dqkv.data(), dout.data(), N, NH, KV, hs);
  EXPECT_EQ(dqkv[C + 0], 1.0f + 2.0f + 3.0f + 4.0f);
  EXPECT_EQ(dqkv[C + 1], 0.0f);
  EXPECT_EQ(dqkv[C + hs + 0], 0.0f);
  EXPECT_EQ(dqkv[C + hs + 1], 40.0f);
}

}  // namespace
}  // namespace shardgpt
