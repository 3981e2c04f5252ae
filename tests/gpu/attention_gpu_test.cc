// GPU tests of the bf16 tensor-core primitive (model/cuda/mma.cuh) and of the tensor-core causal
// attention (model/cuda/attention_tc_cuda.cu), against CPU references on identical inputs.
// Under the CUDA emulation (label gpu-emu) the mma is the emulated one; on a GPU (label gpu) it
// is the hardware instruction. Without a usable GPU every test is SKIPPED, never passed.
//
// Tolerances (normwise as in kernels_gpu_test.cc: max |gpu - ref| <= tol * max |ref|):
//   mma vs a double-precision product: exact products, 17 fp32 additions: |err| <= 17 u sum|terms|
//     with u = 2^-24 (the worst-case bound of recursive fp32 summation).
//   layout tests: integer data, every value exact: bitwise.
//   attention vs the bf16 CPU twin (model/kernels_cpu_bf16.h, same bf16 rounding of q, k, v, dO):
//     out 1e-2 (kTolBf16): the two sides round different quantities to bf16 before the product
//       with v (the GPU the running exp(S - m), the CPU the normalised P), so every term carries
//       its own rounding error of up to 2^-9 relative; 1e-2 normwise is ~2.5 bf16 units (under
//       the emulation: 2-3e-3).
//     dqkv 1e-3: both sides recompute the same P from the same lse and round the same dS and P
//       to bf16; they differ only where fp32 summation order or exp's last bit moves a value
//       across a bf16 rounding boundary (a 2^-8 error in a few terms of a sum; under the
//       emulation <= 5e-5, most of it from the GPU's exp2f of log2-scaled scores against the
//       CPU's exp; a GPU's mma may sum in another order).
//     lse 1e-5: fp32 only (same bf16 inputs to q k^T, fp32 sums in another order, exp2f vs the
//       CPU's exp polynomial; under the emulation: 1e-7).
//   The tensor-core path is checked to be the one running: CudaTcAttentionCalls counts its
//   forward and backward calls, it differs from the fp32 twin by more than 1e-4 normwise (bf16
//   rounding of the inputs) and agrees with the bf16 twin. The twin and reproducibility tests
//   run at fp32 and at bf16 activations (the cp.async loads of bf16 tensors).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/bf16.h"
#include "model/cuda/cuda_device.h"
#include "model/device.h"
#include "model/kernels_cpu.h"
#include "model/kernels_cpu_bf16.h"
#include "tests/common/random_data.h"
#include "tests/gpu/gpu_and_cpu.h"
#include "tests/gpu/mma_test_kernels.h"

namespace shardgpt {
namespace {

constexpr double kTolBf16 = 1e-2;
constexpr double kTolLse = 1e-5;
constexpr double kTolGrad = 1e-3;

bool NoGpu(std::string* why) { return CudaVisibleDeviceCount(why) == 0; }

// max |a - b| / max |b|
double Normwise(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); i++) {
    const double e = std::fabs((double)a[i] - (double)b[i]);
    err = std::isnan(e) ? INFINITY : std::max(err, e);
    scale = std::max(scale, std::fabs((double)b[i]));
  }
  return err / scale;
}

// ---------------------------------------------------------------------------------------------
// mma.sync m16n8k16 bf16

class MmaTest : public ::testing::TestWithParam<mma_test::Source> {
 protected:
  void SetUp() override {
    std::string why;
    if (NoGpu(&why)) GTEST_SKIP() << "no usable GPU: " << why;
  }
  std::vector<float> Run(const std::vector<uint16_t>& A, const std::vector<uint16_t>& B, const std::vector<float>& C) {
    std::vector<float> D(128, NAN);
    const std::string err = mma_test::RunMma(GetParam(), A.data(), B.data(), C.data(), D.data());
    EXPECT_EQ(err, "");
    return D;
  }
};

std::vector<uint16_t> Bf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); i++) b[i] = FloatToBf16(v[i]);
  return b;
}

TEST_P(MmaTest, MatchesTheCpuProductOfRandomBf16) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    const auto A = Bf16(RandomFloats(256, 10 + seed, -4.0f, 4.0f));
    const auto B = Bf16(RandomFloats(128, 20 + seed, -4.0f, 4.0f));
    const auto C = RandomFloats(128, 30 + seed, -8.0f, 8.0f);
    const auto D = Run(A, B, C);
    for (int i = 0; i < 16; i++)
      for (int n = 0; n < 8; n++) {
        double ref = C[i * 8 + n], mag = std::fabs(ref);
        for (int k = 0; k < 16; k++) {
          const double p = (double)Bf16ToFloat(A[i * 16 + k]) * Bf16ToFloat(B[k * 8 + n]);
          ref += p, mag += std::fabs(p);
        }
        EXPECT_LE(std::fabs(D[i * 8 + n] - ref), 17 * std::ldexp(mag, -24))
            << "D[" << i << "][" << n << "] = " << D[i * 8 + n] << ", expected " << ref;
      }
  }
}

// Integer data (exact in bf16 up to 256 and in fp32): each test makes every output element
// name the input element it must have come from.
TEST_P(MmaTest, LayoutPutsEveryElementInItsPlace) {
  std::vector<uint16_t> A(256), B(128);
  std::vector<float> C(128, 0.0f);
  // A[i][k] = 16 i + k, B = [I_8; 0]: D[i][n] = A[i][n] (A's columns 0..7);
  // B = [0; I_8]: D[i][n] = A[i][n + 8] (columns 8..15).
  for (int i = 0; i < 256; i++) A[i] = FloatToBf16((float)i);
  for (int half = 0; half < 2; half++) {
    for (int k = 0; k < 16; k++)
      for (int n = 0; n < 8; n++) B[k * 8 + n] = FloatToBf16(k == n + 8 * half ? 1.0f : 0.0f);
    const auto D = Run(A, B, C);
    for (int i = 0; i < 16; i++)
      for (int n = 0; n < 8; n++)
        EXPECT_EQ(D[i * 8 + n], (float)(16 * i + n + 8 * half)) << "A columns " << 8 * half << "..: D[" << i << "][" << n << "]";
  }
  // A = [I_16], B[k][n] = 8 k + n: D = B (every element of B).
  for (int i = 0; i < 16; i++)
    for (int k = 0; k < 16; k++) A[i * 16 + k] = FloatToBf16(i == k ? 1.0f : 0.0f);
  for (int i = 0; i < 128; i++) B[i] = FloatToBf16((float)i);
  auto D = Run(A, B, C);
  for (int i = 0; i < 128; i++) EXPECT_EQ(D[i], (float)i) << "B element " << i;
  // A = 0: D = C (every element of C, non-integer too).
  for (auto& a : A) a = 0;
  for (int i = 0; i < 128; i++) C[i] = 1000.5f + i;
  D = Run(A, B, C);
  for (int i = 0; i < 128; i++) EXPECT_EQ(D[i], C[i]) << "C element " << i;
}

INSTANTIATE_TEST_SUITE_P(Fragments, MmaTest,
                         ::testing::Values(mma_test::Source::kRegisters, mma_test::Source::kLoadBkn,
                                           mma_test::Source::kLoadBnk, mma_test::Source::kLoadBknHi,
                                           mma_test::Source::kLoadBnkHi),
                         [](const ::testing::TestParamInfo<mma_test::Source>& i) {
                           switch (i.param) {
                             case mma_test::Source::kRegisters: return std::string("Registers");
                             case mma_test::Source::kLoadBkn: return std::string("LoadBkn");
                             case mma_test::Source::kLoadBnk: return std::string("LoadBnk");
                             case mma_test::Source::kLoadBknHi: return std::string("LoadBknHi");
                             default: return std::string("LoadBnkHi");
                           }
                         });

// ---------------------------------------------------------------------------------------------
// tensor-core attention

class TcAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_bf16_attention_ = Bf16AttentionProducts();  // before any skip: TearDown restores it
    std::string skip;
    if (!OpenGpuAndCpu(&gpu_, &cpu_, &skip)) GTEST_SKIP() << skip;
    // the CPU twin of the tensor-core kernels: the CPU device's bf16-product attention (its
    // default at kBf16 only where the CPU has bf16 dot-product instructions)
    SetBf16AttentionProducts(true);
  }
  void TearDown() override { SetBf16AttentionProducts(saved_bf16_attention_); }
  bool saved_bf16_attention_ = false;
  // A buffer on `d` holding v, in dtype `act` (bf16: v rounded).
  DeviceBuffer Upload(Device& d, const std::vector<float>& v, const char* what, DType act = DType::kF32) {
    const bool bf = act == DType::kBF16;
    DeviceBuffer b(&d, nullptr, MemKind::kParams, v.size() * (bf ? 2 : 4), what);
    if (bf) {
      std::vector<uint16_t> h(v.size());
      FloatToBf16(v.data(), h.data(), v.size());
      d.CopyToDevice(b.data(), h.data(), h.size() * 2);
    } else {
      d.CopyToDevice(b.data(), v.data(), v.size() * 4);
    }
    return b;
  }
  // b's values (widened where act is bf16).
  std::vector<float> Read(Device& d, const DeviceBuffer& b, DType act = DType::kF32) {
    if (act == DType::kBF16) {
      std::vector<uint16_t> h(b.bytes() / 2);
      d.CopyToHost(h.data(), b.data(), b.bytes());
      std::vector<float> v(h.size());
      Bf16ToFloat(h.data(), v.data(), h.size());
      return v;
    }
    std::vector<float> v(b.bytes() / 4);
    d.CopyToHost(v.data(), b.data(), b.bytes());
    return v;
  }
  struct Result {
    std::vector<float> out, lse, dqkv1, dqkv2;  // dqkv after one and two backward calls
    TcAttentionCalls tc;                        // of the run: tensor-core forwards and backwards
  };
  // Forward, then backward twice into one zeroed dqkv (the second checks the +=), on device d
  // at precision p with activations (qkv, out, dout, dqkv) in dtype act; lse fp32. The backward
  // reads `fwd_out`/`fwd_lse` when given (so that two devices' backwards see the same forward),
  // else this device's own forward.
  Result Run(Device& d, MatmulPrecision p, int B, int T, int C, int NH, const std::vector<float>& qkv,
             const std::vector<float>& dout, const Result* fwd = nullptr, DType act = DType::kF32) {
    Kernels& k = d.kernels();
    k.set_matmul_precision(p);
    k.set_activation_dtype(act);
    const TcAttentionCalls tc0 = CudaTcAttentionCalls(d);
    auto q = Upload(d, qkv, "qkv", act), g = Upload(d, dout, "dout", act);
    auto out = Upload(d, std::vector<float>((size_t)B * T * C), "out", act);
    DeviceBuffer lse(&d, nullptr, MemKind::kParams, (size_t)B * NH * T * 4, "lse");
    k.attention_forward(out.data(), lse.as<float>(), q.data(), B, T, C, NH);
    Result r;
    r.out = Read(d, out, act), r.lse = Read(d, lse);
    if (fwd) out = Upload(d, fwd->out, "out", act), lse = Upload(d, fwd->lse, "lse");
    auto dqkv = Upload(d, std::vector<float>(qkv.size(), 0.0f), "dqkv", act);
    k.attention_backward(dqkv.data(), g.data(), q.data(), out.data(), lse.as<float>(), B, T, C, NH);
    r.dqkv1 = Read(d, dqkv, act);
    k.attention_backward(dqkv.data(), g.data(), q.data(), out.data(), lse.as<float>(), B, T, C, NH);
    r.dqkv2 = Read(d, dqkv, act);
    const TcAttentionCalls tc1 = CudaTcAttentionCalls(d);
    r.tc = {tc1.forwards - tc0.forwards, tc1.backwards - tc0.backwards};
    k.set_matmul_precision(MatmulPrecision::kExact);
    k.set_activation_dtype(DType::kF32);
    return r;
  }
  // The run went through the tensor-core kernels: one forward, two backwards.
  static void ExpectTensorCores(const Result& r) {
    EXPECT_EQ(r.tc.forwards, 1u) << "the forward did not run the tensor-core kernel";
    EXPECT_EQ(r.tc.backwards, 2u) << "the backwards did not run the tensor-core kernels";
  }
  std::unique_ptr<Device> gpu_, cpu_;
};

struct Shape {
  int B, T, NH, hs;
};
std::string Name(const Shape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
         " hs=" + std::to_string(s.hs);
}

const Shape kTwinShapes[] = {Shape{2, 80, 2, 64}, Shape{1, 128, 1, 64}, Shape{1, 70, 2, 128}, Shape{1, 17, 1, 64},
                              Shape{1, 200, 1, 64}};

// Against the bf16 CPU twin; T a multiple of the 64-row tile and not (causal tails), B, NH > 1,
// and T = 200: four tiles, so the double-buffered loop refills a buffer it used before.
TEST_F(TcAttentionTest, MatchesTheBf16CpuTwin) {
  for (const Shape& s : kTwinShapes) {
    SCOPED_TRACE(Name(s));
    const int C = s.NH * s.hs;
    const auto qkv = RandomFloats((size_t)s.B * s.T * 3 * C, 7, -1.5f, 1.5f);
    const auto dout = RandomFloats((size_t)s.B * s.T * C, 8);
    const Result cpu = Run(*cpu_, MatmulPrecision::kBf16, s.B, s.T, C, s.NH, qkv, dout);
    const Result gpu = Run(*gpu_, MatmulPrecision::kBf16, s.B, s.T, C, s.NH, qkv, dout, &cpu);
    ExpectTensorCores(gpu);
    EXPECT_LE(Normwise(gpu.out, cpu.out), kTolBf16) << "out";
    EXPECT_LE(Normwise(gpu.lse, cpu.lse), kTolLse) << "lse";
    EXPECT_LE(Normwise(gpu.dqkv1, cpu.dqkv1), kTolGrad) << "dqkv";
    EXPECT_LE(Normwise(gpu.dqkv2, cpu.dqkv2), kTolGrad) << "dqkv, second call (+=)";
    for (size_t i = 0; i < gpu.dqkv1.size(); i++)
      ASSERT_EQ(gpu.dqkv2[i], 2 * gpu.dqkv1[i]) << "the second backward adds the same values (exact doubling)";
    // The tensor cores really ran: bf16 rounding shows against the fp32 twin.
    const Result f32 = Run(*cpu_, MatmulPrecision::kExact, s.B, s.T, C, s.NH, qkv, dout);
    EXPECT_GT(Normwise(gpu.out, f32.out), 1e-4) << "out looks like fp32 products";
    EXPECT_LT(Normwise(gpu.out, f32.out), 3e-2) << "out is not attention";
    std::printf("[ info ] %s: normwise vs bf16 twin out %.2e lse %.2e dqkv %.2e; vs fp32 twin out %.2e dqkv %.2e\n",
                Name(s).c_str(), Normwise(gpu.out, cpu.out), Normwise(gpu.lse, cpu.lse),
                Normwise(gpu.dqkv1, cpu.dqkv1), Normwise(gpu.out, f32.out), Normwise(gpu.dqkv1, f32.dqkv1));
  }
}

// The same at bf16 activations (the kernels' cp.async loads of bf16 q, k, v and dO; out and
// dqkv = bf16(dqkv + gradient) rounded in registers), against the CPU twin at bf16 activations
// (the same rounding of its fp32 results): the tolerances above plus one bf16 rounding (2^-8)
// of out and dqkv, where the two sides' fp32 values fall either side of a rounding boundary.
// Both backwards read the CPU's (bf16) forward.
TEST_F(TcAttentionTest, MatchesTheBf16CpuTwinAtBf16Activations) {
  const double ulp = std::ldexp(1.0, -8);
  for (const Shape& s : kTwinShapes) {
    SCOPED_TRACE(Name(s));
    const int C = s.NH * s.hs;
    const auto qkv = RandomFloats((size_t)s.B * s.T * 3 * C, 7, -1.5f, 1.5f);
    const auto dout = RandomFloats((size_t)s.B * s.T * C, 8);
    const Result cpu = Run(*cpu_, MatmulPrecision::kBf16, s.B, s.T, C, s.NH, qkv, dout, nullptr, DType::kBF16);
    const Result gpu = Run(*gpu_, MatmulPrecision::kBf16, s.B, s.T, C, s.NH, qkv, dout, &cpu, DType::kBF16);
    ExpectTensorCores(gpu);
    EXPECT_LE(Normwise(gpu.out, cpu.out), kTolBf16 + ulp) << "out";
    EXPECT_LE(Normwise(gpu.lse, cpu.lse), kTolLse) << "lse";
    EXPECT_LE(Normwise(gpu.dqkv1, cpu.dqkv1), kTolGrad + ulp) << "dqkv";
    EXPECT_LE(Normwise(gpu.dqkv2, cpu.dqkv2), kTolGrad + ulp) << "dqkv, second call (+=)";
    EXPECT_NE(gpu.dqkv2, gpu.dqkv1) << "the second backward added nothing";
    std::printf("[ info ] %s, bf16 activations: normwise vs bf16 twin out %.2e lse %.2e dqkv %.2e (second %.2e)\n",
                Name(s).c_str(), Normwise(gpu.out, cpu.out), Normwise(gpu.lse, cpu.lse),
                Normwise(gpu.dqkv1, cpu.dqkv1), Normwise(gpu.dqkv2, cpu.dqkv2));
  }
}

// Two runs on the GPU (the emulation shuffles block and thread order per launch): the same bits,
// at fp32 and at bf16 activations.
TEST_F(TcAttentionTest, BitwiseReproducible) {
  const Shape s{2, 100, 2, 64};
  const int C = s.NH * s.hs;
  const auto qkv = RandomFloats((size_t)s.B * s.T * 3 * C, 17, -1.5f, 1.5f);
  const auto dout = RandomFloats((size_t)s.B * s.T * C, 18);
  auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
  };
  for (DType act : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(act == DType::kBF16 ? "bf16 activations" : "fp32 activations");
    const Result a = Run(*gpu_, MatmulPrecision::kBf16, s.B, s.T, C, s.NH, qkv, dout, nullptr, act);
    const Result b = Run(*gpu_, MatmulPrecision::kBf16, s.B, s.T, C, s.NH, qkv, dout, nullptr, act);
    ExpectTensorCores(a);
    ExpectTensorCores(b);
    EXPECT_TRUE(same(a.out, b.out)) << "out";
    EXPECT_TRUE(same(a.lse, b.lse)) << "lse";
    EXPECT_TRUE(same(a.dqkv1, b.dqkv1)) << "dqkv";
    EXPECT_TRUE(same(a.dqkv2, b.dqkv2)) << "dqkv, second call";
  }
}

// Head sizes without a tensor-core kernel, and kExact, keep the fp32 kernels (fp32 products).
TEST_F(TcAttentionTest, OtherHeadSizesAndExactStayFp32) {
  for (const auto& [s, p] : {std::pair{Shape{1, 40, 2, 32}, MatmulPrecision::kBf16},
                             std::pair{Shape{1, 40, 2, 64}, MatmulPrecision::kExact}}) {
    SCOPED_TRACE(Name(s));
    const int C = s.NH * s.hs;
    const auto qkv = RandomFloats((size_t)s.B * s.T * 3 * C, 27, -1.5f, 1.5f);
    const auto dout = RandomFloats((size_t)s.B * s.T * C, 28);
    const Result cpu = Run(*cpu_, MatmulPrecision::kExact, s.B, s.T, C, s.NH, qkv, dout);
    const Result gpu = Run(*gpu_, p, s.B, s.T, C, s.NH, qkv, dout, &cpu);
    EXPECT_EQ(gpu.tc.forwards + gpu.tc.backwards, 0u) << "a tensor-core kernel ran";
    EXPECT_LE(Normwise(gpu.out, cpu.out), 1e-5) << "out";
    EXPECT_LE(Normwise(gpu.dqkv1, cpu.dqkv1), 1e-5) << "dqkv";
  }
}

}  // namespace
}  // namespace shardgpt
