// Tests of the bf16 kernels' fast paths (model/kernels_cpu_bf16.h): the operand layouts each
// large product hands oneDNN (read back from the primitives' own descriptors, so a layout
// cannot change unseen), the weight gradient under both ways of getting dout^T, attention's
// batched oneDNN products (call counts, the same bits on any thread count), and the AVX512-BF16
// tile kernel against a double reference on bf16-rounded inputs, at every transpose
// combination, odd reductions and column tails. Each skips, with the reason, on CPUs that lack
// what it needs.
//
// Tolerance of the tile kernel: products of bf16 values are exact in fp32, so only the fp32
// accumulation rounds: |got - ref| <= 1e-5 * sum |a b| + 1e-6 (as kernels_bf16_test.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "base/bf16.h"
#include "model/device.h"
#include "model/kernels_cpu.h"
#include "model/kernels_cpu_bf16.h"
#include "tests/common/random_data.h"

namespace shardgpt {
namespace {

using VecF = std::vector<float>;

class Bf16FastPath : public ::testing::Test {
 protected:
  void SetUp() override { saved_gemm_ = CurrentBf16Gemm(); }
  void TearDown() override { SetBf16Gemm(saved_gemm_); }
  Bf16Gemm saved_gemm_ = Bf16Gemm::kEmulated;
};

// The forward and dinp products reach oneDNN with a dense row-major source (the forward's
// weights w[OC,C] are the [C,OC] operand as "ba"); the weight gradient's source is dout read
// transposed ("ba") under kTransposedSource and the dense transposed copy ("ab") under
// kTransposedCopy, for both the fp32- and the bf16-activation kernels, dinp or not.
class Bf16DwSources : public Bf16FastPath, public ::testing::WithParamInterface<Bf16DwSource> {
 protected:
  void SetUp() override {
    Bf16FastPath::SetUp();
    saved_source_ = CurrentBf16DwSource();
    SetBf16DwSource(GetParam());
  }
  void TearDown() override {
    SetBf16DwSource(saved_source_);
    Bf16FastPath::TearDown();
  }
  Bf16DwSource saved_source_ = Bf16DwSource::kTransposedCopy;
};

TEST_P(Bf16DwSources, OnednnOperandFormats) {
  if (!OnednnBf16Supported())
    GTEST_SKIP() << "oneDNN cannot run bf16 matmuls on this CPU (it needs AVX-512): no primitive to inspect";
  ASSERT_TRUE(SetBf16Gemm(Bf16Gemm::kOnednn));
  const int N = 48, C = 40, OC = 72;
  const char* dw_src = GetParam() == Bf16DwSource::kTransposedSource ? "ba" : "ab";
  VecF inp = RandomFloats((size_t)N * C, 1), w = RandomFloats((size_t)OC * C, 2), dout = RandomFloats((size_t)N * OC, 3);
  VecF out((size_t)N * OC), dinp((size_t)N * C, 0.0f), dw((size_t)OC * C, 0.0f);
  std::vector<uint16_t> inp16(inp.size()), dout16(dout.size()), out16(out.size()), dinp16(dinp.size(), 0);
  for (size_t i = 0; i < inp.size(); i++) inp16[i] = FloatToBf16(inp[i]);
  for (size_t i = 0; i < dout.size(); i++) dout16[i] = FloatToBf16(dout[i]);
  for (int act16 = 0; act16 < 2; act16++) {
    const std::string kernel = act16 ? "bf16 activations" : "fp32 activations";
    if (act16) {
      matmul_forward_bf16(out16.data(), inp16.data(), w.data(), nullptr, N, C, OC);
      matmul_backward_bf16(dinp16.data(), dw.data(), nullptr, dout16.data(), inp16.data(), w.data(), N, C, OC);
    } else {
      matmul_forward_bf16(out.data(), inp.data(), w.data(), nullptr, N, C, OC);
      matmul_backward_bf16(dinp.data(), dw.data(), nullptr, dout.data(), inp.data(), w.data(), N, C, OC);
    }
    const struct {
      Bf16Product product;
      const char* name;
      const char *src, *weights;
    } expected[] = {{Bf16Product::kForward, "forward", "ab", "ba"},
                    {Bf16Product::kBackwardData, "dinp", "ab", "ab"},
                    {Bf16Product::kBackwardWeights, "dw", dw_src, "ab"}};
    for (const auto& e : expected) {
      const OnednnOperandFormats f = LastOnednnFormats(e.product);
      EXPECT_EQ(e.src, f.src) << kernel << ", " << e.name << ": source format";
      EXPECT_EQ(e.weights, f.weights) << kernel << ", " << e.name << ": weights operand format";
    }
    // dw alone (the tied LM head's end-of-backward call) takes the same layout
    if (act16)
      matmul_backward_bf16(static_cast<uint16_t*>(nullptr), dw.data(), nullptr, dout16.data(), inp16.data(), w.data(),
                           N, C, OC);
    else
      matmul_backward_bf16(static_cast<float*>(nullptr), dw.data(), nullptr, dout.data(), inp.data(), w.data(), N, C,
                           OC);
    EXPECT_EQ(dw_src, LastOnednnFormats(Bf16Product::kBackwardWeights).src) << kernel << ": dw without dinp";
  }
}

// dw matches the bf16-input reference under either source, for both kernels, at shapes whose
// sides are not multiples of the 64x64 transpose tile (one tile, and several with tails).
TEST_P(Bf16DwSources, WeightGradientMatchesReference) {
  if (!OnednnBf16Supported()) GTEST_SKIP() << "oneDNN cannot run bf16 matmuls on this CPU (it needs AVX-512)";
  ASSERT_TRUE(SetBf16Gemm(Bf16Gemm::kOnednn));
  const int shapes[][3] = {{67, 19, 45}, {197, 24, 131}};
  for (const auto& sh : shapes) {
    const int N = sh[0], C = sh[1], OC = sh[2];
    VecF inp = RandomFloats((size_t)N * C, 4), w = RandomFloats((size_t)OC * C, 5);
    VecF dout = RandomFloats((size_t)N * OC, 6), dw0 = RandomFloats((size_t)OC * C, 7);
    std::vector<uint16_t> inp16(inp.size()), dout16(dout.size());
    for (size_t i = 0; i < inp.size(); i++) inp16[i] = FloatToBf16(inp[i]);
    for (size_t i = 0; i < dout.size(); i++) dout16[i] = FloatToBf16(dout[i]);
    for (int act16 = 0; act16 < 2; act16++) {
      VecF dw = dw0;
      if (act16)
        matmul_backward_bf16(static_cast<uint16_t*>(nullptr), dw.data(), nullptr, dout16.data(), inp16.data(),
                             w.data(), N, C, OC);
      else
        matmul_backward_bf16(static_cast<float*>(nullptr), dw.data(), nullptr, dout.data(), inp.data(), w.data(), N,
                             C, OC);
      int bad = 0;
      for (int o = 0; o < OC; o++)
        for (int c = 0; c < C; c++) {
          double ref = dw0[(size_t)o * C + c], mag = 0;
          for (int n = 0; n < N; n++) {
            const double p = (double)RoundToBf16(dout[(size_t)n * OC + o]) * RoundToBf16(inp[(size_t)n * C + c]);
            ref += p, mag += std::fabs(p);
          }
          if (std::fabs(dw[(size_t)o * C + c] - ref) > 1e-5 * mag + 1e-6 && bad++ < 5)
            ADD_FAILURE() << N << "x" << C << "x" << OC << (act16 ? " bf16 act" : " fp32 act") << ": dw[" << o << ","
                          << c << "] = " << dw[(size_t)o * C + c] << ", want " << ref;
        }
      EXPECT_EQ(0, bad);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Source, Bf16DwSources,
                         ::testing::Values(Bf16DwSource::kTransposedCopy, Bf16DwSource::kTransposedSource),
                         [](const ::testing::TestParamInfo<Bf16DwSource>& info) {
                           return std::string(info.param == Bf16DwSource::kTransposedSource ? "TransposedSource"
                                                                                            : "TransposedCopy");
                         });

// The default source follows the CPU: dout read transposed where oneDNN runs AMX-BF16 (its
// brgemm is as fast that way), the transposed copy elsewhere (docs/PRECISION.md).
TEST_F(Bf16FastPath, DefaultWeightGradientSourceFollowsTheCpu) {
  const Bf16DwSource saved = CurrentBf16DwSource();  // (the other tests restore what they set)
  const Bf16DwSource want = std::string(CpuBf16DotName()) == "AMX-BF16" ? Bf16DwSource::kTransposedSource
                                                                         : Bf16DwSource::kTransposedCopy;
  EXPECT_EQ(want, saved) << "default: " << Bf16DwSourceName(saved) << " on a CPU with "
                         << (CpuHasBf16Dot() ? CpuBf16DotName() : "no bf16 dot product");
}

// C = alpha op(A) op(B) + beta C on a strided C, against doubles on rounded inputs.
void CheckDot(bool ta, bool tb, int M, int N, int K, float alpha, float beta, uint32_t seed) {
  const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 7;
  VecF A = RandomFloats((size_t)(ta ? K : M) * lda, seed), B = RandomFloats((size_t)(tb ? N : K) * ldb, seed + 1);
  VecF C0 = RandomFloats((size_t)M * ldc, seed + 2), C = C0;
  if (beta == 0.0f)
    for (int i = 0; i < M; i++) C[(size_t)i * ldc] = NAN;  // not read when beta == 0
  gemm_bf16_dot(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  int bad = 0;
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      double acc = 0, mag = 0;
      for (int k = 0; k < K; k++) {
        const double a = RoundToBf16(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]);
        const double b = RoundToBf16(tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
        acc += a * b, mag += std::fabs(a * b);
      }
      const double ref = alpha * acc + (beta == 0.0f ? 0.0 : beta * C0[(size_t)i * ldc + j]);
      const double tol = 1e-5 * (std::fabs(alpha) * mag + std::fabs(beta * C0[(size_t)i * ldc + j])) + 1e-6;
      if (!(std::fabs(C[(size_t)i * ldc + j] - ref) <= tol) && bad++ < 5)
        ADD_FAILURE() << "ta" << ta << " tb" << tb << " " << M << "x" << N << "x" << K << ": C[" << i << "," << j
                      << "] = " << C[(size_t)i * ldc + j] << ", want " << ref;
    }
    for (int j = N; j < ldc; j++)  // the padding columns of C are left alone
      if (C[(size_t)i * ldc + j] != C0[(size_t)i * ldc + j] && bad++ < 5)
        ADD_FAILURE() << "C[" << i << "," << j << "] beyond N was written";
  }
  EXPECT_EQ(0, bad);
}

TEST_F(Bf16FastPath, DotTileKernelMatchesReference) {
  if (!Bf16DotKernelSupported()) GTEST_SKIP() << "this CPU has no AVX512-BF16 (vdpbf16ps): the tile kernel cannot run";
  const Bf16ProductCounts before = GetBf16ProductCounts();
  int calls = 0;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      CheckDot(ta, tb, 32, 64, 64, 0.125f, 0.0f, 10 + ta * 2 + tb), calls++;  // attention's tile, scaled scores
      CheckDot(ta, tb, 7, 37, 33, 1.0f, 1.0f, 20 + ta * 2 + tb), calls++;     // odd K, column tail, accumulate
      CheckDot(ta, tb, 5, 16, 1, -0.5f, 1.0f, 30 + ta * 2 + tb), calls++;     // K = 1
      CheckDot(ta, tb, 64, 130, 96, 1.0f, 0.0f, 40 + ta * 2 + tb), calls++;  // several register blocks
    }
  EXPECT_EQ(before.dot_kernel_calls + calls, GetBf16ProductCounts().dot_kernel_calls) << "each call is counted";
}

// The tile kernel's packing rounds exactly as base/bf16.h (RNE: ties to even, overflow to inf,
// NaN kept): with K = 1 and the other operand 1, C is each rounded value itself, bit for bit.
TEST_F(Bf16FastPath, DotTileKernelRoundsAsFloatToBf16) {
  if (!Bf16DotKernelSupported()) GTEST_SKIP() << "this CPU has no AVX512-BF16 (vdpbf16ps): the tile kernel cannot run";
  VecF v = RandomFloats(37, 80, -1e3f, 1e3f);
  const float special[] = {1.0f + 0x1p-8f, 1.0f + 0x3p-8f, -(1.0f + 0x1p-8f), 3.4e38f, -3.4e38f, 0.0f, -0.0f,
                           1.0f + 0x1p-8f + 0x1p-20f, 0x1.fffffep+127f, INFINITY, NAN};
  v.insert(v.end(), std::begin(special), std::end(special));
  const int n = static_cast<int>(v.size());
  const VecF one(n, 1.0f);
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      // C[n,1] = op(A)[n,1] * 1 (A varies: the A packing) and C[1,n] = 1 * op(B)[1,n] (B packing)
      VecF ca(n), cb(n);
      gemm_bf16_dot(ta, tb, n, 1, 1, 1.0f, v.data(), ta ? n : 1, one.data(), 1, 0.0f, ca.data(), 1);
      gemm_bf16_dot(ta, tb, 1, n, 1, 1.0f, one.data(), 1, v.data(), tb ? 1 : n, 0.0f, cb.data(), n);
      for (int i = 0; i < n; i++) {
        const float want = RoundToBf16(v[i]);
        for (const float got : {ca[i], cb[i]}) {
          if (std::isnan(want)) EXPECT_TRUE(std::isnan(got)) << "NaN in, NaN out";
          else EXPECT_EQ(want, got) << "ta" << ta << " tb" << tb << " x = " << v[i];
        }
      }
    }
}

// Under oneDNN, attention's products are batched: one oneDNN call per product per chunk of
// heads (here all B*NH = 4 heads fit one chunk), whatever T and its row blocks, so the
// thousands of per-tile products per step are gone; no tile-kernel calls.
TEST_F(Bf16FastPath, AttentionProductsAreBatchedOnOnednn) {
  if (!OnednnBf16Supported()) GTEST_SKIP() << "oneDNN cannot run bf16 matmuls on this CPU (it needs AVX-512)";
  ASSERT_TRUE(SetBf16Gemm(Bf16Gemm::kOnednn));
  const int B = 2, T = 40, C = 32, NH = 2;
  VecF qkv = RandomFloats((size_t)B * T * 3 * C, 50), dout = RandomFloats((size_t)B * T * C, 51);
  VecF out((size_t)B * T * C), lse((size_t)B * NH * T), dqkv(qkv.size(), 0.0f);
  ResetBf16ProductCounts();
  attention_forward_bf16(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  const Bf16ProductCounts fwd = GetBf16ProductCounts();
  attention_backward_bf16(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
  const Bf16ProductCounts all = GetBf16ProductCounts();
  EXPECT_EQ(2, fwd.onednn_calls) << "forward: S = q k^T and o = P v, each one call for all heads";
  EXPECT_EQ(2 + 5, all.onednn_calls) << "backward: S, dP, dq, dk, dv";
  EXPECT_EQ(all.onednn_calls, all.attention_calls) << "each counted as attention's";
  EXPECT_EQ(0, all.dot_kernel_calls);
  // and the results agree with the fp32 kernel within bf16's rounding (kernels_bf16_test.cc
  // checks this at more shapes)
  VecF out32(out.size()), lse32(lse.size());
  attention_forward(out32.data(), lse32.data(), qkv.data(), B, T, C, NH);
  double d = 0;
  for (size_t i = 0; i < out.size(); i++) d = std::max(d, (double)std::fabs(out[i] - out32[i]));
  EXPECT_LT(d, 1e-2);
  EXPECT_GT(d, 1e-5) << "bf16 inputs must change the result";
}

// Past kBatchedAttentionMaxT the batched kernel's 16 T^2 bytes of scratch per thread would be a
// T x T tensor in all but name (1 GB at T = 8192): longer sequences take the blocked tile kernel,
// whose scratch is O(T x block), with the same bf16-product semantics.
TEST_F(Bf16FastPath, LongSequencesTakeTheBlockedTileAttention) {
  if (!OnednnBf16Supported()) GTEST_SKIP() << "oneDNN cannot run bf16 matmuls on this CPU (it needs AVX-512)";
  ASSERT_TRUE(SetBf16Gemm(Bf16Gemm::kOnednn));
  const int B = 1, T = kBatchedAttentionMaxT + 1, C = 16, NH = 2;
  VecF qkv = RandomFloats((size_t)B * T * 3 * C, 52);
  VecF out((size_t)B * T * C), lse((size_t)B * NH * T), out32(out.size()), lse32(lse.size());
  ResetBf16ProductCounts();
  attention_forward_bf16(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  EXPECT_EQ(0, GetBf16ProductCounts().attention_calls) << "no batched products at T = " << T;
  attention_forward(out32.data(), lse32.data(), qkv.data(), B, T, C, NH);
  double d = 0;
  for (size_t i = 0; i < out.size(); i++) d = std::max(d, (double)std::fabs(out[i] - out32[i]));
  EXPECT_LT(d, 1e-2);
  EXPECT_GT(d, 1e-6) << "bf16 products must change the result";
  // one position shorter: batched
  ResetBf16ProductCounts();
  const int T2 = kBatchedAttentionMaxT;
  attention_forward_bf16(out.data(), lse.data(), qkv.data(), B, T2, C, NH);
  EXPECT_EQ(2 * B * NH, GetBf16ProductCounts().attention_calls) << "batched at T = " << T2 << " (one head per chunk)";
}

// The batched attention gives the same bits on 1, 2 and 3 threads (its head chunks and each
// head's single-threaded products do not depend on the thread count), and on bf16 activations
// it equals the fp32-activation kernel on the same values with the outputs rounded once.
TEST_F(Bf16FastPath, BatchedAttentionSameBitsOnAnyThreadsAndRoundsOnce) {
  if (!OnednnBf16Supported()) GTEST_SKIP() << "oneDNN cannot run bf16 matmuls on this CPU (it needs AVX-512)";
  ASSERT_TRUE(SetBf16Gemm(Bf16Gemm::kOnednn));
  const int B = 3, T = 130, C = 64, NH = 4;  // 12 heads: several chunks over the threads
  auto bf16_values = [](VecF v) {
    for (float& x : v) x = RoundToBf16(x);
    return v;
  };
  const VecF qkv = bf16_values(RandomFloats((size_t)B * T * 3 * C, 60, -2, 2));
  const VecF dout = bf16_values(RandomFloats((size_t)B * T * C, 61));
  const VecF dqkv0 = bf16_values(RandomFloats(qkv.size(), 62));
  auto run = [&](int threads) {
    const int saved = ComputeThreads();
    SetComputeThreads(threads);
    VecF out((size_t)B * T * C), lse((size_t)B * NH * T), dqkv = dqkv0;
    attention_forward_bf16(out.data(), lse.data(), qkv.data(), B, T, C, NH);
    out = bf16_values(out);  // what the next layer would read
    attention_backward_bf16(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH);
    SetComputeThreads(saved);
    return std::vector<VecF>{out, lse, dqkv};
  };
  const std::vector<VecF> r1 = run(1), r2 = run(2), r3 = run(3);
  for (int i = 0; i < 3; i++) {
    EXPECT_EQ(r1[i], r2[i]) << "output #" << i << ": 1 vs 2 threads";
    EXPECT_EQ(r1[i], r3[i]) << "output #" << i << ": 1 vs 3 threads";
  }
  auto bits = [](const VecF& v) {
    std::vector<uint16_t> r(v.size());
    for (size_t i = 0; i < v.size(); i++) r[i] = FloatToBf16(v[i]);
    return r;
  };
  std::vector<uint16_t> qkv16 = bits(qkv), dout16 = bits(dout), out16((size_t)B * T * C), dqkv16 = bits(dqkv0);
  VecF lse((size_t)B * NH * T);
  attention_forward_bf16(out16.data(), lse.data(), qkv16.data(), B, T, C, NH);
  EXPECT_EQ(bits(r2[0]), out16) << "o rounded once";
  EXPECT_EQ(r2[1], lse);
  attention_backward_bf16(dqkv16.data(), dout16.data(), qkv16.data(), out16.data(), lse.data(), B, T, C, NH);
  EXPECT_EQ(bits(r2[2]), dqkv16) << "dqkv: one fp32 sum added to each element, rounded once";
}

// The CPU device at bf16 precision runs attention's products in bf16 (batched oneDNN) by
// default where the CPU has bf16 dot-product instructions, and in fp32 when told
// (SetBf16AttentionProducts(false)): the oneDNN call count tells which ran, and the fp32
// products give exactly the fp32 kernel's result.
TEST_F(Bf16FastPath, DeviceAttentionProductsAreBf16WhereTheCpuHasThem) {
  if (!OnednnBf16Supported() || !CpuHasBf16Dot()) GTEST_SKIP() << "needs oneDNN bf16 on AVX512-BF16 or AMX-BF16";
  ASSERT_TRUE(SetBf16Gemm(Bf16Gemm::kOnednn));
  const int B = 2, T = 40, C = 32, NH = 2;
  std::unique_ptr<Device> dev = NewCpuDevice(false);
  Kernels& k = dev->kernels();
  k.set_matmul_precision(MatmulPrecision::kBf16);
  const VecF qkv = RandomFloats((size_t)B * T * 3 * C, 52);
  auto run = [&](int64_t* onednn_calls) {
    VecF out((size_t)B * T * C), lse((size_t)B * NH * T);
    ResetBf16ProductCounts();
    k.attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, NH);
    *onednn_calls = GetBf16ProductCounts().onednn_calls;
    return out;
  };
  VecF out32((size_t)B * T * C), lse32((size_t)B * NH * T);
  attention_forward(out32.data(), lse32.data(), qkv.data(), B, T, C, NH);
  int64_t calls = -1;
  ASSERT_TRUE(Bf16AttentionProducts()) << "default on this CPU";
  const VecF out16 = run(&calls);
  EXPECT_EQ(2, calls) << "default: the batched bf16 attention";
  EXPECT_NE(out16, out32);
  SetBf16AttentionProducts(false);
  const VecF outf = run(&calls);
  SetBf16AttentionProducts(true);
  EXPECT_EQ(0, calls);
  EXPECT_EQ(out32, outf) << "told: the fp32 attention kernel";
}

// The bf16 weight cache, on every way of computing bf16 products this CPU has: inside a window
// a weight is converted once (the forward) and reused (the backward's dinp), with results
// bitwise those of converting on every call; a weight changed at the same address is never
// served from an earlier window, nor outside any window.
class Bf16WeightCacheTest : public ::testing::TestWithParam<Bf16Gemm> {
 protected:
  void SetUp() override {
    saved_gemm_ = CurrentBf16Gemm();
    if (!SetBf16Gemm(GetParam()))
      GTEST_SKIP() << "oneDNN cannot run bf16 matmuls on this CPU (it needs AVX-512); the emulated way is tested";
  }
  void TearDown() override {
    SetBf16Gemm(saved_gemm_);
    SetBf16WeightReuse(true);
  }
  Bf16Gemm saved_gemm_ = Bf16Gemm::kEmulated;
};

constexpr int kN = 24, kC = 40, kOC = 56;

VecF Forward(const VecF& inp, const float* w, Bf16WeightCache* cache) {
  VecF out((size_t)kN * kOC);
  matmul_forward_bf16(out.data(), inp.data(), w, nullptr, kN, kC, kOC, cache);
  return out;
}
VecF Dinp(const VecF& dout, const VecF& inp, const float* w, Bf16WeightCache* cache) {
  VecF dinp((size_t)kN * kC, 0.0f);
  matmul_backward_bf16(dinp.data(), nullptr, nullptr, dout.data(), inp.data(), w, kN, kC, kOC, cache);
  return dinp;
}

TEST_P(Bf16WeightCacheTest, ConvertsOncePerWindowBitwiseAsEveryCall) {
  const VecF inp = RandomFloats((size_t)kN * kC, 60), w = RandomFloats((size_t)kOC * kC, 61);
  const VecF dout = RandomFloats((size_t)kN * kOC, 62);
  const VecF out_ref = Forward(inp, w.data(), nullptr), dinp_ref = Dinp(dout, inp, w.data(), nullptr);
  Bf16WeightCache cache;
  cache.Begin();
  ResetBf16ProductCounts();
  const VecF out = Forward(inp, w.data(), &cache), dinp = Dinp(dout, inp, w.data(), &cache);
  const VecF out2 = Forward(inp, w.data(), &cache);  // recompute / a further micro-batch
  const Bf16ProductCounts n = GetBf16ProductCounts();
  cache.End();
  EXPECT_EQ(1, n.weight_conversions);
  EXPECT_EQ(2, n.weight_reuses);
  EXPECT_EQ(out_ref, out);
  EXPECT_EQ(out_ref, out2);
  EXPECT_EQ(dinp_ref, dinp);
}

TEST_P(Bf16WeightCacheTest, ChangedWeightAtTheSameAddressIsNeverStale) {
  const VecF inp = RandomFloats((size_t)kN * kC, 63), dout = RandomFloats((size_t)kN * kOC, 64);
  VecF w = RandomFloats((size_t)kOC * kC, 65);
  const VecF w_new = RandomFloats(w.size(), 66);
  Bf16WeightCache cache;
  cache.Begin();
  const VecF out_old = Forward(inp, w.data(), &cache);
  cache.End();
  w = w_new;  // the same buffer (no reallocation: same size), new values
  const float* at = w.data();
  const VecF out_new_ref = Forward(inp, at, nullptr), dinp_new_ref = Dinp(dout, inp, at, nullptr);
  ASSERT_NE(out_old, out_new_ref);
  // outside any window: converted afresh
  EXPECT_EQ(out_new_ref, Forward(inp, at, &cache)) << "served after End";
  // a new window at the same address: converted afresh, then reused
  cache.Begin();
  EXPECT_EQ(out_new_ref, Forward(inp, at, &cache)) << "served from an earlier window";
  EXPECT_EQ(dinp_new_ref, Dinp(dout, inp, at, &cache));
  cache.End();
  // a Begin while open is a new window too
  cache.Begin();
  Forward(inp, at, &cache);
  for (float& x : w) x = -x;
  cache.Begin();
  EXPECT_EQ(Forward(inp, w.data(), nullptr), Forward(inp, w.data(), &cache)) << "served across a Begin";
  cache.End();
  // a prefix of a cached weight (same address, fewer elements) is its own entry
  cache.Begin();
  Forward(inp, w.data(), &cache);
  VecF out_prefix((size_t)kN * (kOC / 2)), ref_prefix(out_prefix.size());
  matmul_forward_bf16(ref_prefix.data(), inp.data(), w.data(), nullptr, kN, kC, kOC / 2, nullptr);
  matmul_forward_bf16(out_prefix.data(), inp.data(), w.data(), nullptr, kN, kC, kOC / 2, &cache);
  EXPECT_EQ(ref_prefix, out_prefix);
  cache.End();
}

// Floats noted as the widening of stored bf16 values (Kernels::note_bf16_source, the compute copy
// of bf16 storage) are served as those bf16 values, with no conversion and the same results;
// once their memory is freed (Forget) nothing derived from it is served: new weights at the same
// address are converted. Forget also drops a cached copy made from the freed memory.
TEST_P(Bf16WeightCacheTest, NotedBf16SourceIsServedAsIsAndForgottenWhenFreed) {
  const VecF inp = RandomFloats((size_t)kN * kC, 69), dout = RandomFloats((size_t)kN * kOC, 70);
  const size_t n = (size_t)kOC * kC;
  std::vector<uint16_t> stored(n);
  VecF widened(n);
  FloatToBf16(RandomFloats(n, 71).data(), stored.data(), n);
  Bf16ToFloat(stored.data(), widened.data(), n);
  const VecF out_ref = Forward(inp, widened.data(), nullptr), dinp_ref = Dinp(dout, inp, widened.data(), nullptr);
  Bf16WeightCache cache;
  cache.Begin();
  cache.NoteSource(widened.data(), stored.data(), n);
  ResetBf16ProductCounts();
  EXPECT_EQ(out_ref, Forward(inp, widened.data(), &cache));
  EXPECT_EQ(dinp_ref, Dinp(dout, inp, widened.data(), &cache));
  Bf16ProductCounts c = GetBf16ProductCounts();
  EXPECT_EQ(0, c.weight_conversions);
  EXPECT_EQ(2, c.weights_from_stored);
  // the buffer is freed and reused for other weights
  cache.Forget(widened.data(), n * sizeof(float));
  for (float& x : widened) x = RoundToBf16(-2.0f * x);
  const VecF out_new = Forward(inp, widened.data(), nullptr);
  ASSERT_NE(out_new, out_ref);
  ResetBf16ProductCounts();
  EXPECT_EQ(out_new, Forward(inp, widened.data(), &cache)) << "served from a source noted before the Free";
  EXPECT_EQ(1, GetBf16ProductCounts().weight_conversions);
  // that conversion is cached now; a Free of part of its memory drops it too
  cache.Forget(widened.data() + n / 2, sizeof(float));
  for (float& x : widened) x = -x;
  EXPECT_EQ(Forward(inp, widened.data(), nullptr), Forward(inp, widened.data(), &cache)) << "stale cached copy";
  cache.End();
  // End forgets every note: outside a window nothing is served
  cache.Begin();
  cache.NoteSource(widened.data(), stored.data(), n);
  cache.End();
  ResetBf16ProductCounts();
  Forward(inp, widened.data(), &cache);
  EXPECT_EQ(0, GetBf16ProductCounts().weights_from_stored);
}

TEST_P(Bf16WeightCacheTest, SwitchedOffConvertsEveryCall) {
  const VecF inp = RandomFloats((size_t)kN * kC, 67), w = RandomFloats((size_t)kOC * kC, 68);
  SetBf16WeightReuse(false);
  Bf16WeightCache cache;
  cache.Begin();
  EXPECT_FALSE(cache.open());
  ResetBf16ProductCounts();
  Forward(inp, w.data(), &cache), Forward(inp, w.data(), &cache);
  EXPECT_EQ(2, GetBf16ProductCounts().weight_conversions);
  EXPECT_EQ(0, GetBf16ProductCounts().weight_reuses);
  cache.End();
}

INSTANTIATE_TEST_SUITE_P(Gemm, Bf16WeightCacheTest, ::testing::Values(Bf16Gemm::kOnednn, Bf16Gemm::kEmulated),
                         [](const ::testing::TestParamInfo<Bf16Gemm>& i) {
                           return std::string(i.param == Bf16Gemm::kOnednn ? "Onednn" : "Emulated");
                         });

}  // namespace
}  // namespace shardgpt
