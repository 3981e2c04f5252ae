// Tests of the CPU model kernels on bf16 activations (Kernels::set_activation_dtype(kBF16),
// model/kernels_cpu.h's bf16 overloads), through the CPU device's kernel set, at both matmul
// precisions (kExact: fp32 products; kBf16: the bf16 products of kernels_cpu_bf16.h).
//
// Each kernel runs twice on the same bf16-representable inputs: with fp32 activations (the
// reference) and with bf16 activations. The bf16-activation kernels do the fp32 maths on the
// widened (exact) inputs and round each output once, so each output must be within the
// rounding of the reference: |got - ref| <= 2^-8 |ref| (bf16 keeps 8 significant bits: round to
// nearest is within half an ulp, 2^-8 relative) plus 1e-6 |ref| + 1e-7 max|ref| for fp32
// summation-order differences between the two builds of a loop. Accumulated gradients start
// from non-zero bf16 values (dinp = bf16(fp32(dinp) + contribution)). residual_layernorm's
// LayerNorm reads the rounded residual, so its ln output is compared with the fp32 LayerNorm of
// that rounded residual. A test also checks that an output really is bf16 (a value the fp32
// reference holds with more than 8 significant bits is not kept exactly).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "base/bf16.h"
#include "model/device.h"
#include "model/kernels.h"
#include "model/kernels_cpu_bf16.h"
#include "tests/common/random_data.h"

namespace shardgpt {
namespace {

using VecF = std::vector<float>;
using VecH = std::vector<uint16_t>;

// Uniform in [lo, hi), rounded to bf16: exactly representable at both activation dtypes.
VecF Bf16Values(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  VecF v = RandomFloats(n, seed, lo, hi);
  for (float& x : v) x = RoundToBf16(x);
  return v;
}
VecH Bits(const VecF& v) {
  VecH h(v.size());
  FloatToBf16(v.data(), h.data(), v.size());
  return h;
}
VecF Widen(const VecH& h) {
  VecF v(h.size());
  Bf16ToFloat(h.data(), v.data(), h.size());
  return v;
}

void ExpectRoundingOf(const VecH& got_bits, const VecF& ref, const char* what) {
  const VecF got = Widen(got_bits);
  ASSERT_EQ(got.size(), ref.size()) << what;
  double mx = 0;
  for (float r : ref) mx = std::max(mx, std::fabs((double)r));
  int bad = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double tol = (std::ldexp(1.0, -8) + 1e-6) * std::fabs((double)ref[i]) + 1e-7 * mx;
    if (!(std::fabs((double)got[i] - ref[i]) <= tol) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: bf16 " << got[i] << " vs fp32 " << ref[i] << " (tol " << tol << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " outside the bf16 rounding";
}

class Bf16Activations : public ::testing::TestWithParam<MatmulPrecision> {
 protected:
  void SetUp() override { k_.set_matmul_precision(GetParam()); }
  void TearDown() override {
    k_.set_activation_dtype(DType::kF32);
    k_.set_matmul_precision(MatmulPrecision::kExact);
  }
  void F32() { k_.set_activation_dtype(DType::kF32); }
  void Bf16() { k_.set_activation_dtype(DType::kBF16); }
  Kernels& k_ = CpuDevice().kernels();
};

TEST_P(Bf16Activations, Encoder) {
  const int B = 2, T = 5, C = 24, V = 11;
  const std::vector<int32_t> tok = RandomTokens(B * T, V, 1);
  const VecF wte = Bf16Values(V * C, 2), wpe = Bf16Values(T * C, 3), dout = Bf16Values(B * T * C, 4);
  VecF out(B * T * C), dwte(V * C, 0.5f), dwpe(T * C, 0.25f);
  VecF dwte16 = dwte, dwpe16 = dwpe;
  VecH out16(B * T * C);
  F32(), k_.encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  k_.encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
  const VecH dout16 = Bits(dout);
  Bf16(), k_.encoder_forward(out16.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  k_.encoder_backward(dwte16.data(), dwpe16.data(), dout16.data(), tok.data(), B, T, C);
  ExpectRoundingOf(out16, out, "out");
  EXPECT_EQ(dwte16, dwte);  // fp32 parameter gradients of the same fp32 sums
  EXPECT_EQ(dwpe16, dwpe);
}

TEST_P(Bf16Activations, LayernormForwardBackward) {
  const int N = 9, C = 40;
  const VecF x = Bf16Values(N * C, 5, -2, 2), w = Bf16Values(C, 6), b = Bf16Values(C, 7), dout = Bf16Values(N * C, 8);
  const VecF dinp0 = Bf16Values(N * C, 9);
  VecF out(N * C), mean(N), rstd(N), dinp = dinp0, dw(C, 0.125f), db(C, 0.0f);
  F32(), k_.layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  k_.layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                        C);
  VecH out16(N * C), dinp16 = Bits(dinp0);
  const VecH x16 = Bits(x), dout16 = Bits(dout);
  VecF mean16(N), rstd16(N), dw16(C, 0.125f), db16(C, 0.0f);
  Bf16(), k_.layernorm_forward(out16.data(), mean16.data(), rstd16.data(), x16.data(), w.data(), b.data(), N, C);
  k_.layernorm_backward(dinp16.data(), dw16.data(), db16.data(), dout16.data(), x16.data(), w.data(), mean16.data(),
                        rstd16.data(), N, C);
  ExpectRoundingOf(out16, out, "out");
  ExpectRoundingOf(dinp16, dinp, "dinp");
  for (int i = 0; i < N; i++) {  // fp32 statistics of the same values
    EXPECT_NEAR(mean16[i], mean[i], 1e-6);
    EXPECT_NEAR(rstd16[i], rstd[i], 1e-5 * rstd[i]);
  }
  for (int i = 0; i < C; i++) {
    EXPECT_NEAR(dw16[i], dw[i], 1e-5 * (1 + std::fabs(dw[i])));
    EXPECT_NEAR(db16[i], db[i], 1e-5 * (1 + std::fabs(db[i])));
  }
}

TEST_P(Bf16Activations, ResidualAndResidualLayernorm) {
  const int N = 6, C = 32;
  const size_t n = (size_t)N * C;
  const VecF a = Bf16Values(n, 10), b = Bf16Values(n, 11), w = Bf16Values(C, 12), bias = Bf16Values(C, 13);
  VecF res(n);
  F32(), k_.residual_forward(res.data(), a.data(), b.data(), n);
  const VecH a16 = Bits(a), b16 = Bits(b);
  VecH res16(n), fused_res16(n), ln16(n);
  VecF mean16(N), rstd16(N);
  Bf16(), k_.residual_forward(res16.data(), a16.data(), b16.data(), n);
  k_.residual_layernorm_forward(fused_res16.data(), ln16.data(), mean16.data(), rstd16.data(), a16.data(), b16.data(),
                                w.data(), bias.data(), N, C);
  ExpectRoundingOf(res16, res, "residual out");
  EXPECT_EQ(fused_res16, res16);  // the same sums, rounded the same way
  // the fused LayerNorm reads the rounded residual: the fp32 LayerNorm of that, rounded
  const VecF rounded = Widen(res16);
  VecF ln(n), mean(N), rstd(N);
  F32(), k_.layernorm_forward(ln.data(), mean.data(), rstd.data(), rounded.data(), w.data(), bias.data(), N, C);
  ExpectRoundingOf(ln16, ln, "ln out");
}

TEST_P(Bf16Activations, Gelu) {
  const size_t n = 3 * 16384 + 77;  // more than one chunk, a ragged tail
  const VecF x = Bf16Values(n, 14, -4, 4), dout = Bf16Values(n, 15), dinp0 = Bf16Values(n, 16);
  VecF out(n), dinp = dinp0;
  F32(), k_.gelu_forward(out.data(), x.data(), n);
  k_.gelu_backward(dinp.data(), x.data(), dout.data(), n);
  const VecH x16 = Bits(x), dout16 = Bits(dout);
  VecH out16(n), dinp16 = Bits(dinp0);
  Bf16(), k_.gelu_forward(out16.data(), x16.data(), n);
  k_.gelu_backward(dinp16.data(), x16.data(), dout16.data(), n);
  ExpectRoundingOf(out16, out, "gelu out");
  ExpectRoundingOf(dinp16, dinp, "gelu dinp");
  // the outputs are really bf16: the fp32 reference has values that bf16 cannot hold
  int inexact = 0;
  for (float v : out) inexact += RoundToBf16(v) != v;
  EXPECT_GT(inexact, 0);
}

void CheckMatmul(Kernels& k_) {
  auto F32 = [&] { k_.set_activation_dtype(DType::kF32); };
  auto Bf16 = [&] { k_.set_activation_dtype(DType::kBF16); };
  const int N = 37, C = 48, OC = 40;
  const VecF inp = Bf16Values(N * C, 17), w = Bf16Values(OC * C, 18), bias = Bf16Values(OC, 19);
  const VecF dout = Bf16Values(N * OC, 20), dinp0 = Bf16Values(N * C, 21);
  VecF out(N * OC), dinp = dinp0, dw(OC * C, 0.5f), dbias(OC, 0.25f);
  F32(), k_.matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  k_.matmul_backward(dinp.data(), dw.data(), dbias.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  const VecH inp16 = Bits(inp), dout16 = Bits(dout);
  VecH out16(N * OC), dinp16 = Bits(dinp0);
  VecF dw16(OC * C, 0.5f), dbias16(OC, 0.25f);
  Bf16(), k_.matmul_forward(out16.data(), inp16.data(), w.data(), bias.data(), N, C, OC);
  k_.matmul_backward(dinp16.data(), dw16.data(), dbias16.data(), dout16.data(), inp16.data(), w.data(), N, C, OC);
  ExpectRoundingOf(out16, out, "matmul out");
  ExpectRoundingOf(dinp16, dinp, "matmul dinp");
  for (size_t i = 0; i < dw.size(); i++) ASSERT_NEAR(dw16[i], dw[i], 1e-5 * (1 + std::fabs(dw[i]))) << i;
  for (int i = 0; i < OC; i++) ASSERT_NEAR(dbias16[i], dbias[i], 1e-5 * (1 + std::fabs(dbias[i]))) << i;
  // the LM head's calls: dinp only, then dw only (no bias)
  VecH dinp_only = Bits(dinp0);
  k_.matmul_backward(dinp_only.data(), nullptr, nullptr, dout16.data(), inp16.data(), w.data(), N, C, OC);
  ExpectRoundingOf(dinp_only, dinp, "matmul dinp only");
}

TEST_P(Bf16Activations, Matmul) { CheckMatmul(k_); }

// The bf16 products' other way (inputs rounded, fp32 OpenBLAS), which runs on every CPU.
TEST_P(Bf16Activations, MatmulEmulatedBf16Gemm) {
  const Bf16Gemm saved = CurrentBf16Gemm();
  SetBf16Gemm(Bf16Gemm::kEmulated);
  CheckMatmul(k_);
  SetBf16Gemm(saved);
}

TEST_P(Bf16Activations, Attention) {
  const int B = 2, T = 70, C = 32, NH = 2;  // T > one row block
  const size_t NC = (size_t)B * T * C;
  const VecF qkv = Bf16Values(3 * NC, 22), dout = Bf16Values(NC, 23), dqkv0 = Bf16Values(3 * NC, 24);
  VecF out(NC), lse(B * NH * T), dqkv = dqkv0;
  F32(), k_.attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  // the backward of both runs reads the same (bf16) forward output
  const VecF out_r = [&] { VecF r = out; for (float& x : r) x = RoundToBf16(x); return r; }();
  k_.attention_backward(dqkv.data(), dout.data(), qkv.data(), out_r.data(), lse.data(), B, T, C, NH);
  const VecH qkv16 = Bits(qkv), dout16 = Bits(dout);
  VecH out16(NC), dqkv16 = Bits(dqkv0);
  VecF lse16(B * NH * T);
  Bf16(), k_.attention_forward(out16.data(), lse16.data(), qkv16.data(), B, T, C, NH);
  ExpectRoundingOf(out16, out, "attention out");
  for (size_t i = 0; i < lse.size(); i++) ASSERT_NEAR(lse16[i], lse[i], 1e-6 * (1 + std::fabs(lse[i]))) << i;
  const VecH out_r16 = Bits(out_r);
  k_.attention_backward(dqkv16.data(), dout16.data(), qkv16.data(), out_r16.data(), lse.data(), B, T, C, NH);
  ExpectRoundingOf(dqkv16, dqkv, "attention dqkv");
}

TEST_P(Bf16Activations, CrossentropySoftmax) {
  const int N = 7, V = 300, Vp = 384;
  const VecF logits = Bf16Values(N * Vp, 25, -6, 6);
  const std::vector<int32_t> tgt = RandomTokens(N, V, 26);
  VecF x = logits, losses(N);
  F32();
  const double sum = k_.crossentropy_softmax(x.data(), losses.data(), tgt.data(), N, V, Vp, 0.5f);
  VecH x16 = Bits(logits);
  VecF losses16(N);
  Bf16();
  const double sum16 = k_.crossentropy_softmax(x16.data(), losses16.data(), tgt.data(), N, V, Vp, 0.5f);
  EXPECT_NEAR(sum16, sum, 1e-5 * std::fabs(sum));
  for (int i = 0; i < N; i++) EXPECT_NEAR(losses16[i], losses[i], 1e-5 * (1 + losses[i]));
  ExpectRoundingOf(x16, x, "dlogits");
  for (int n = 0; n < N; n++)
    for (int i = V; i < Vp; i++) ASSERT_EQ(x16[(size_t)n * Vp + i], 0) << "padded column " << i;
  // the loss-only form leaves the logits alone; the device-side form adds the mean loss
  VecH y16 = Bits(logits);
  double acc = 1.0;
  k_.crossentropy_softmax_acc(y16.data(), losses16.data(), tgt.data(), N, V, Vp, 0.0f, &acc);
  EXPECT_EQ(y16, Bits(logits));
  EXPECT_NEAR(acc, 1.0 + sum / N, 1e-5 * (1 + sum / N));
}

INSTANTIATE_TEST_SUITE_P(Precision, Bf16Activations,
                         ::testing::Values(MatmulPrecision::kExact, MatmulPrecision::kBf16),
                         [](const ::testing::TestParamInfo<MatmulPrecision>& p) {
                           return p.param == MatmulPrecision::kExact ? "Fp32Products" : "Bf16Products";
                         });

}  // namespace
}  // namespace shardgpt
