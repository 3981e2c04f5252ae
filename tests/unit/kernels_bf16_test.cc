// Tests of the bf16 matmul kernels (model/kernels_cpu_bf16.h) against their fp32 twins, of the
// CPU detection and of the compute-precision choice (model/compute_precision.h).
//
// Each kernel runs on every available way of computing bf16 products: oneDNN (skipped, with the
// reason, on CPUs where oneDNN cannot run bf16, i.e. without AVX-512) and the emulation (inputs
// rounded to bf16, fp32 OpenBLAS), which runs everywhere.
//
// Stated tolerances. Rounding an input to bf16 changes it by at most 2^-9 relative (8
// significant bits, round to nearest), so a product of two rounded inputs is within
// 2^-8 (1 + 2^-10) of the exact product, and it is exact in fp32. Hence, with
// A(i) = sum_k |a_ik b_kj| the absolute sum of the products of one output:
//   matmuls, against a double reference on the bf16-rounded inputs:  |got - ref| <= 1e-5 A + 1e-6
//     (fp32 accumulation only; this is what proves "bf16 inputs, fp32 accumulation");
//   matmuls, against the fp32 kernel:  |got - fp32| <= 2^-8 (1 + 2^-10) A + 1e-5 A + 1e-6;
//   attention (inputs in [-1, 1], hs <= 32), against the fp32 kernel: out and lse within 1e-2,
//     dqkv within 2e-2 absolute (score errors <= 2^-8 * scale * sum|q k| pass through the
//     softmax; the observed maxima here are 1.2e-3 to 3.9e-3), plus an exact check that every
//     operand of the score/value products is rounded (AttentionRoundsEveryOperand).
// And the bf16 result must differ from the fp32 one (the roundings really happened).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/bf16.h"
#include "model/compute_precision.h"
#include "model/device.h"
#include "model/kernels_cpu.h"
#include "model/kernels_cpu_bf16.h"
#include "tests/common/random_data.h"

namespace shardgpt {
namespace {

using VecF = std::vector<float>;
using VecD = std::vector<double>;

VecF Rounded(const VecF& v) {
  VecF r(v.size());
  for (size_t i = 0; i < v.size(); i++) r[i] = RoundToBf16(v[i]);
  return r;
}

double MaxAbsDiff(const VecF& a, const VecF& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); i++) d = std::max(d, std::fabs((double)a[i] - b[i]));
  return d;
}

// |got - want| <= atol + rtol * scale[i] element-wise (scale: the absolute product sums).
void ExpectWithin(const VecF& got, const VecD& want, const VecD& scale, double rtol, double atol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double err = std::fabs((double)got[i] - want[i]);
    if (!(err <= atol + rtol * scale[i]) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i] << " (bound "
                    << atol + rtol * scale[i] << ")";
  }
  EXPECT_EQ(bad, 0) << what;
}

// C[M,N] = acc + op(A) op(B) in double, and the absolute product sums; A is [M,K] (lda K) or,
// when ta, [K,M]; B is [K,N] or, when tb, [N,K].
void RefGemm(int M, int N, int K, const VecF& A, bool ta, const VecF& B, bool tb, const VecF* acc, VecD* C,
             VecD* abs_sum) {
  C->assign((size_t)M * N, 0.0), abs_sum->assign((size_t)M * N, 0.0);
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = acc ? (*acc)[(size_t)i * N + j] : 0.0, a = acc ? std::fabs(s) : 0.0;
      for (int k = 0; k < K; k++) {
        const double p = (double)A[ta ? (size_t)k * M + i : (size_t)i * K + k] *
                         (double)B[tb ? (size_t)j * K + k : (size_t)k * N + j];
        s += p, a += std::fabs(p);
      }
      (*C)[(size_t)i * N + j] = s, (*abs_sum)[(size_t)i * N + j] = a;
    }
}

constexpr double kBf16Rel = 1.0 / 256 * (1.0 + 1.0 / 1024);  // 2^-8 (1 + 2^-10)
constexpr double kAccRel = 1e-5;                              // fp32 accumulation

// Runs each test once per way of computing bf16 products.
class Bf16Kernels : public ::testing::TestWithParam<Bf16Gemm> {
 protected:
  void SetUp() override {
    saved_threads_ = ComputeThreads(), saved_gemm_ = CurrentBf16Gemm();
    SetComputeThreads(2);
    if (!SetBf16Gemm(GetParam()))
      GTEST_SKIP() << "oneDNN cannot run bf16 matmuls on this CPU (it needs AVX-512); the emulated kernels are "
                      "tested instead";
  }
  void TearDown() override {
    SetComputeThreads(saved_threads_);
    SetBf16Gemm(saved_gemm_);
  }
  int saved_threads_ = 1;
  Bf16Gemm saved_gemm_ = Bf16Gemm::kEmulated;
};

// Forward and backward at one shape: tight against bf16-input references, within the bf16
// bound of the fp32 kernel, different from it, accumulating onto existing gradients.
void CheckMatmul(int N, int C, int OC, uint32_t seed, bool with_bias) {
  VecF inp = RandomFloats((size_t)N * C, seed), w = RandomFloats((size_t)OC * C, seed + 1);
  VecF bias = RandomFloats(OC, seed + 2), dout = RandomFloats((size_t)N * OC, seed + 3);
  const float* b = with_bias ? bias.data() : nullptr;
  // forward: out = inp w^T + bias
  VecF out((size_t)N * OC, NAN), out32((size_t)N * OC);
  matmul_forward_bf16(out.data(), inp.data(), w.data(), b, N, C, OC);
  matmul_forward(out32.data(), inp.data(), w.data(), b, N, C, OC);
  VecF bias_rows((size_t)N * OC, 0.0f);
  if (with_bias)
    for (int n = 0; n < N; n++) std::memcpy(&bias_rows[(size_t)n * OC], bias.data(), OC * sizeof(float));
  VecD ref, abs_sum, ref32, abs32;
  RefGemm(N, OC, C, Rounded(inp), false, Rounded(w), true, &bias_rows, &ref, &abs_sum);
  ExpectWithin(out, ref, abs_sum, kAccRel, 1e-6, "out vs bf16-input reference");
  RefGemm(N, OC, C, inp, false, w, true, &bias_rows, &ref32, &abs32);
  ExpectWithin(out, VecD(out32.begin(), out32.end()), abs32, kBf16Rel + kAccRel, 1e-6, "out vs fp32 kernel");
  EXPECT_GT(MaxAbsDiff(out, out32), 1e-5) << "out: bf16 inputs must change the result";

  // backward, accumulating onto random gradients
  VecF dinp0 = RandomFloats((size_t)N * C, seed + 4), dw0 = RandomFloats((size_t)OC * C, seed + 5), db0 = RandomFloats(OC, seed + 6);
  VecF dinp = dinp0, dw = dw0, db = db0, dinp32 = dinp0, dw32 = dw0, db32 = db0;
  matmul_backward_bf16(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  matmul_backward(dinp32.data(), dw32.data(), db32.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  // dinp = dinp0 + dout w;  dw = dw0 + dout^T inp
  RefGemm(N, C, OC, Rounded(dout), false, Rounded(w), false, &dinp0, &ref, &abs_sum);
  ExpectWithin(dinp, ref, abs_sum, kAccRel, 1e-6, "dinp vs bf16-input reference");
  RefGemm(N, C, OC, dout, false, w, false, &dinp0, &ref32, &abs32);
  ExpectWithin(dinp, VecD(dinp32.begin(), dinp32.end()), abs32, kBf16Rel + kAccRel, 1e-6, "dinp vs fp32 kernel");
  RefGemm(OC, C, N, Rounded(dout), true, Rounded(inp), false, &dw0, &ref, &abs_sum);
  ExpectWithin(dw, ref, abs_sum, kAccRel, 1e-6, "dw vs bf16-input reference");
  RefGemm(OC, C, N, dout, true, inp, false, &dw0, &ref32, &abs32);
  ExpectWithin(dw, VecD(dw32.begin(), dw32.end()), abs32, kBf16Rel + kAccRel, 1e-6, "dw vs fp32 kernel");
  EXPECT_GT(MaxAbsDiff(dinp, dinp32), 1e-5) << "dinp: bf16 inputs must change the result";
  EXPECT_GT(MaxAbsDiff(dw, dw32), 1e-5) << "dw: bf16 inputs must change the result";
  // the bias gradient stays fp32: the fp32 kernel's bits (same per-column order)
  EXPECT_EQ(0, std::memcmp(db.data(), db32.data(), OC * sizeof(float))) << "dbias must be the fp32 sum";

  // null dinp and dbias: only dw changes
  VecF dw_only = dw0;
  matmul_backward_bf16(nullptr, dw_only.data(), nullptr, dout.data(), inp.data(), w.data(), N, C, OC);
  RefGemm(OC, C, N, Rounded(dout), true, Rounded(inp), false, &dw0, &ref, &abs_sum);
  ExpectWithin(dw_only, ref, abs_sum, kAccRel, 1e-6, "dw (null dinp, dbias)");
}

TEST_P(Bf16Kernels, MatmulRowSplitShape) { CheckMatmul(70, 20, 33, 1, true); }
TEST_P(Bf16Kernels, MatmulColumnSplitShape) { CheckMatmul(37, 20, 53, 2, true); }
TEST_P(Bf16Kernels, MatmulWithoutBias) { CheckMatmul(64, 48, 96, 3, false); }
TEST_P(Bf16Kernels, MatmulLongReduction) { CheckMatmul(40, 300, 24, 4, true); }  // sums of 300 products

// Attention against the fp32 kernel (forward: out, lse; backward: dqkv accumulated).
void CheckAttention(int B, int T, int C, int NH, uint32_t seed) {
  VecF qkv = RandomFloats((size_t)B * T * 3 * C, seed), dout = RandomFloats((size_t)B * T * C, seed + 1);
  VecF out((size_t)B * T * C, NAN), lse((size_t)B * NH * T, NAN), out32(out.size()), lse32(lse.size());
  attention_forward_bf16(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  attention_forward(out32.data(), lse32.data(), qkv.data(), B, T, C, NH);
  const VecD zeros_out(out.size(), 0.0), zeros_lse(lse.size(), 0.0);
  ExpectWithin(out, VecD(out32.begin(), out32.end()), zeros_out, 0, 1e-2, "attention out vs fp32");
  ExpectWithin(lse, VecD(lse32.begin(), lse32.end()), zeros_lse, 0, 1e-2, "attention lse vs fp32");
  EXPECT_GT(MaxAbsDiff(out, out32), 1e-5) << "attention out: bf16 inputs must change the result";
  VecF dqkv0 = RandomFloats(qkv.size(), seed + 2), dqkv = dqkv0, dqkv32 = dqkv0;
  attention_backward_bf16(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
  attention_backward(dqkv32.data(), dout.data(), qkv.data(), out32.data(), lse32.data(), B, T, C, NH);
  ExpectWithin(dqkv, VecD(dqkv32.begin(), dqkv32.end()), VecD(qkv.size(), 0.0), 0, 2e-2, "dqkv vs fp32");
  EXPECT_GT(MaxAbsDiff(dqkv, dqkv32), 1e-5) << "dqkv: bf16 inputs must change the result";
  std::printf("attention B%d T%d C%d NH%d: max |bf16 - fp32| out %.2e lse %.2e dqkv %.2e\n", B, T, C, NH,
              MaxAbsDiff(out, out32), MaxAbsDiff(lse, lse32), MaxAbsDiff(dqkv, dqkv32));
}

// T = 130: blocks of 64 (64, 64, 2); T = 45: blocks of 32 (32, 13).
TEST_P(Bf16Kernels, AttentionAcrossBlocks) {
  CheckAttention(2, 130, 64, 2, 5);
  CheckAttention(3, 45, 48, 3, 6);
}
TEST_P(Bf16Kernels, AttentionSmall) { CheckAttention(2, 5, 8, 2, 7); }

// Every operand of attention's products is rounded, seen exactly: with q = k = v = x0 in every
// component, x0 = 1 + 3*2^-10 (bf16: 1.0), the scores are constant, so P_ts = fl(1/(t+1));
// bf16 gives lse_t = hs * scale * 1 * 1 + log(t+1) (fp32: x0^2 instead of 1) and
// o_t = (t+1) * bf16(P_ts) * 1.0 (fp32: x0). One operand left unrounded changes these by >= 1e-3.
TEST_P(Bf16Kernels, AttentionRoundsEveryOperand) {
  const int T = 5, C = 16, hs = C;
  const float x0 = 1.0f + 3.0f / 1024;
  ASSERT_EQ(RoundToBf16(x0), 1.0f);
  VecF qkv((size_t)T * 3 * C, x0), out((size_t)T * C), lse(T);
  attention_forward_bf16(out.data(), lse.data(), qkv.data(), 1, T, C, 1);
  const double scale = 1.0 / std::sqrt((double)hs);
  for (int t = 0; t < T; t++) {
    EXPECT_NEAR(lse[t], hs * scale + std::log(t + 1.0), 1e-5) << "t " << t;
    const double p = RoundToBf16(1.0f / (float)(t + 1));
    for (int i = 0; i < C; i++) EXPECT_NEAR(out[(size_t)t * C + i], (t + 1) * p, 1e-6) << "t " << t;
  }
}

// The device's kernel set runs these kernels at kBf16 and the fp32 ones at kExact.
TEST_P(Bf16Kernels, CpuDeviceDispatchesByPrecision) {
  auto device = NewCpuDevice(false);
  Kernels& k = device->kernels();
  const int N = 33, C = 16, OC = 40;
  VecF inp = RandomFloats((size_t)N * C, 8), w = RandomFloats((size_t)OC * C, 9);
  VecF a((size_t)N * OC), b((size_t)N * OC), c((size_t)N * OC), d((size_t)N * OC);
  k.set_matmul_precision(MatmulPrecision::kBf16);
  k.matmul_forward(a.data(), inp.data(), w.data(), nullptr, N, C, OC);
  matmul_forward_bf16(b.data(), inp.data(), w.data(), nullptr, N, C, OC);
  k.set_matmul_precision(MatmulPrecision::kExact);
  k.matmul_forward(c.data(), inp.data(), w.data(), nullptr, N, C, OC);
  matmul_forward(d.data(), inp.data(), w.data(), nullptr, N, C, OC);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(c.data(), d.data(), c.size() * sizeof(float)));
  EXPECT_GT(MaxAbsDiff(a, c), 0.0);
}

// Both ways agree closely where both run (same roundings, other summation order; a P or dS
// element near a bf16 rounding boundary may round the other way, hence 1e-3 for attention).
TEST(Bf16Engines, OnednnAgreesWithEmulation) {
  if (!OnednnBf16Supported()) GTEST_SKIP() << "oneDNN cannot run bf16 matmuls on this CPU (it needs AVX-512)";
  const Bf16Gemm saved = CurrentBf16Gemm();
  const int N = 96, C = 64, OC = 160, B = 2, T = 70, AC = 32, NH = 2;
  VecF inp = RandomFloats((size_t)N * C, 10), w = RandomFloats((size_t)OC * C, 11), qkv = RandomFloats((size_t)B * T * 3 * AC, 12);
  VecF out[2], att[2], lse[2];
  for (int e = 0; e < 2; e++) {
    ASSERT_TRUE(SetBf16Gemm(e == 0 ? Bf16Gemm::kOnednn : Bf16Gemm::kEmulated));
    out[e].resize((size_t)N * OC), att[e].resize((size_t)B * T * AC), lse[e].resize((size_t)B * NH * T);
    matmul_forward_bf16(out[e].data(), inp.data(), w.data(), nullptr, N, C, OC);
    attention_forward_bf16(att[e].data(), lse[e].data(), qkv.data(), B, T, AC, NH);
  }
  SetBf16Gemm(saved);
  EXPECT_LT(MaxAbsDiff(out[0], out[1]), 1e-4);
  EXPECT_LT(MaxAbsDiff(att[0], att[1]), 1e-3);
  EXPECT_LT(MaxAbsDiff(lse[0], lse[1]), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Gemm, Bf16Kernels, ::testing::Values(Bf16Gemm::kOnednn, Bf16Gemm::kEmulated),
                         [](const ::testing::TestParamInfo<Bf16Gemm>& p) {
                           return std::string(p.param == Bf16Gemm::kOnednn ? "Onednn" : "Emulated");
                         });

// ---------------------------------------------------------------------------------------------

// The detection reads the same facts the kernel publishes as /proc/cpuinfo flags.
TEST(CpuFeatures, Bf16DotMatchesProcCpuinfo) {
  std::ifstream f("/proc/cpuinfo");
  if (!f) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string line, flags;
  while (std::getline(f, line))
    if (line.rfind("flags", 0) == 0) {
      flags = " " + line.substr(line.find(':') + 1) + " ";
      break;
    }
  ASSERT_FALSE(flags.empty()) << "no flags line in /proc/cpuinfo";
  const bool avx512_bf16 = flags.find(" avx512_bf16 ") != std::string::npos;
  const bool amx_bf16 = flags.find(" amx_bf16 ") != std::string::npos;
  EXPECT_EQ(CpuHasBf16Dot(), avx512_bf16 || amx_bf16);
  EXPECT_STREQ(CpuBf16DotName(), amx_bf16 ? "AMX-BF16" : avx512_bf16 ? "AVX512-BF16" : "");
  // oneDNN's bf16 matmul exists exactly where it has AVX-512 (avx512f and friends)
  if (CpuHasBf16Dot()) EXPECT_TRUE(OnednnBf16Supported());
  if (flags.find(" avx512f ") == std::string::npos) EXPECT_FALSE(OnednnBf16Supported());
  EXPECT_EQ(CurrentBf16Gemm() == Bf16Gemm::kOnednn, OnednnBf16Supported());
}

ComputeFacts Facts(bool cuda, bool dot, bool onednn) {
  ComputeFacts f;
  f.is_cuda = cuda, f.cpu_bf16_dot = dot, f.onednn_bf16 = onednn;
  f.cpu_bf16_dot_name = dot ? "AVX512-BF16" : "";
  return f;
}

bool Has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

TEST(ComputePrecision, Fp32StorageStaysExactAndSilent) {
  for (bool cuda : {false, true})
    for (bool dot : {false, true}) {
      ComputeChoice c = ChooseComputePrecision(DType::kF32, "", Facts(cuda, dot, dot));
      EXPECT_EQ(c.precision, MatmulPrecision::kExact);
      EXPECT_EQ(c.line, "");
    }
}

TEST(ComputePrecision, Bf16StorageUsesBf16WhereFast) {
  ComputeChoice c = ChooseComputePrecision(DType::kBF16, "", Facts(false, true, true));
  EXPECT_EQ(c.precision, MatmulPrecision::kBf16);
  EXPECT_TRUE(Has(c.line, "oneDNN") && Has(c.line, "AVX512-BF16")) << c.line;
  c = ChooseComputePrecision(DType::kBF16, "", Facts(true, false, false));
  EXPECT_EQ(c.precision, MatmulPrecision::kBf16);
  EXPECT_TRUE(Has(c.line, "tensor cores")) << c.line;
}

TEST(ComputePrecision, Bf16StorageKeepsFp32WithoutBf16DotAndSaysSo) {
  for (bool onednn : {false, true}) {  // AVX-512 without BF16: oneDNN would emulate, slower
    ComputeChoice c = ChooseComputePrecision(DType::kBF16, "", Facts(false, false, onednn));
    EXPECT_EQ(c.precision, MatmulPrecision::kExact);
    EXPECT_EQ(c.line.rfind("compute: fp32", 0), 0u) << c.line;
    EXPECT_TRUE(Has(c.line, "AVX512-BF16") && Has(c.line, "--compute-dtype bf16")) << c.line;
    EXPECT_EQ(c.line.find('\n'), std::string::npos);
  }
}

TEST(ComputePrecision, ComputeDtypeOverrides) {
  ComputeChoice c = ChooseComputePrecision(DType::kBF16, "fp32", Facts(false, true, true));
  EXPECT_EQ(c.precision, MatmulPrecision::kExact);
  EXPECT_TRUE(Has(c.line, "--compute-dtype fp32")) << c.line;
  c = ChooseComputePrecision(DType::kBF16, "fp32", Facts(true, false, false));
  EXPECT_EQ(c.precision, MatmulPrecision::kExact);
  c = ChooseComputePrecision(DType::kF32, "bf16", Facts(false, true, true));
  EXPECT_EQ(c.precision, MatmulPrecision::kBf16);
  c = ChooseComputePrecision(DType::kBF16, "bf16", Facts(false, false, true));
  EXPECT_EQ(c.precision, MatmulPrecision::kBf16);
  EXPECT_TRUE(Has(c.line, "emulated by oneDNN")) << c.line;
  c = ChooseComputePrecision(DType::kBF16, "bf16", Facts(false, false, false));
  EXPECT_EQ(c.precision, MatmulPrecision::kBf16);
  EXPECT_TRUE(Has(c.line, "emulated (inputs rounded to bf16")) << c.line;
}

TEST(ComputePrecision, DetectedFactsAreTheCpuDetection) {
  const ComputeFacts f = DetectComputeFacts(false);
  EXPECT_EQ(f.cpu_bf16_dot, CpuHasBf16Dot());
  EXPECT_EQ(f.cpu_bf16_dot_name, CpuBf16DotName());
  EXPECT_EQ(f.onednn_bf16, OnednnBf16Supported());
}

}  // namespace
}  // namespace shardgpt
