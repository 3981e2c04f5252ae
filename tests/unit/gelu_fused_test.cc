// --gelu fused on the CPU device: Kernels::matmul_gelu_forward / matmul_dgelu_backward, the
// CPU twins of the CUDA backend's cuBLASLt GELU epilogues, against the separate kernels they
// replace (matmul_forward + gelu_forward; matmul_backward into a zeroed buffer + gelu_backward),
// and the GPT trained with them.
//
// What must hold: at fp32 activations the fused calls ARE the separate kernels (same
// operations on the same values: bitwise); at bf16 activations the GELU reads the matmul's
// unrounded fp32 result where the separate kernel reads it rounded to bf16, so out and dinp
// differ from the separate kernels' by about one bf16 rounding step (2^-8 of the largest value:
// the tolerance below is twice that), while pre, dw and dbias are the separate kernels'. The
// backward WRITES dinp (whatever it held before). The model with --gelu fused:
// tests/unit/gpt_bf16_act_test.cc (GptBf16Act.GeluFused*).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "base/bf16.h"
#include "model/device.h"
#include "model/kernels_cpu.h"
#include "tests/common/random_data.h"

namespace shardgpt {
namespace {

// An activation tensor in host memory (the CPU device's), stored in `dtype`.
struct Act {
  DType dtype;
  std::vector<float> f;
  std::vector<uint16_t> h;
  Act(DType d, const std::vector<float>& v) : dtype(d) {
    if (d == DType::kF32) f = v;
    else h.resize(v.size()), FloatToBf16(v.data(), h.data(), v.size());
  }
  void* p() { return dtype == DType::kF32 ? static_cast<void*>(f.data()) : static_cast<void*>(h.data()); }
  std::vector<float> Values() const {
    if (dtype == DType::kF32) return f;
    std::vector<float> v(h.size());
    Bf16ToFloat(h.data(), v.data(), h.size());
    return v;
  }
};

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 0;
  for (float w : want) scale = std::max(scale, (double)std::fabs(w));
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); i++)
    if (!(std::fabs((double)got[i] - want[i]) <= tol * scale) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
  EXPECT_EQ(bad, 0u) << what << ": beyond " << tol << " x " << scale;
}

const double kOneBf16Step = std::ldexp(1.0, -8);

class GeluFusedKernels : public ::testing::TestWithParam<std::tuple<DType, MatmulPrecision>> {
 protected:
  void SetUp() override {
    SetComputeThreads(2);
    k().set_activation_dtype(act());
    k().set_matmul_precision(std::get<1>(GetParam()));
  }
  void TearDown() override {
    k().set_activation_dtype(DType::kF32);
    k().set_matmul_precision(MatmulPrecision::kExact);
  }
  static Kernels& k() { return CpuDevice().kernels(); }
  static DType act() { return std::get<0>(GetParam()); }
  static bool f32() { return act() == DType::kF32; }
  // Equal where the fused and separate paths do the same operations, else within `tol`.
  static void ExpectSame(const std::vector<float>& got, const std::vector<float>& want, bool bitwise, double tol,
                         const char* what) {
    if (bitwise) EXPECT_EQ(got, want) << what;
    else ExpectNear(got, want, tol, what);
  }
};

TEST_P(GeluFusedKernels, ForwardIsTheMatmulAndTheGeluOfItsUnroundedResult) {
  const int N = 37, C = 48, OC = 4 * 24;  // a ragged N: the kernels' row splits and tails
  for (bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "with bias" : "without bias");
    const std::vector<float> w = RandomFloats((size_t)OC * C, 2), b = RandomFloats(OC, 3);
    Act inp(act(), RandomFloats((size_t)N * C, 1, -2, 2)), out(act(), std::vector<float>((size_t)N * OC, 7.0f));
    Act pre = out, sep_pre = out, sep_out = out;
    k().matmul_gelu_forward(out.p(), pre.p(), inp.p(), w.data(), bias ? b.data() : nullptr, N, C, OC);
    k().matmul_forward(sep_pre.p(), inp.p(), w.data(), bias ? b.data() : nullptr, N, C, OC);
    k().gelu_forward(sep_out.p(), sep_pre.p(), (size_t)N * OC);
    // pre: the same product rounded once (bf16 products go through oneDNN with a bf16 or an
    // fp32 destination: the same sums, possibly another blocking)
    const bool same_pre = f32() || std::get<1>(GetParam()) == MatmulPrecision::kExact;
    ExpectSame(pre.Values(), sep_pre.Values(), same_pre, kOneBf16Step, "pre");
    ExpectSame(out.Values(), sep_out.Values(), f32(), 2 * kOneBf16Step, "out");
    if (!f32()) EXPECT_NE(out.Values(), sep_out.Values()) << "the GELU read the rounded pre, not the fp32 result";
  }
}

TEST_P(GeluFusedKernels, BackwardWritesDinpAndAccumulatesDwAndDbias) {
  const int N = 29, C = 4 * 24, OC = 24;  // the fc projection's shape: C = 4 x OC
  const std::vector<float> w = RandomFloats((size_t)OC * C, 5);
  Act dout(act(), RandomFloats((size_t)N * OC, 6)), inp(act(), RandomFloats((size_t)N * C, 7));
  Act pre(act(), RandomFloats((size_t)N * C, 8, -3, 3));
  const std::vector<float> dw0 = RandomFloats((size_t)OC * C, 9), db0 = RandomFloats(OC, 10);
  // fused, into a dinp holding garbage (it must be overwritten)
  Act dinp(act(), RandomFloats((size_t)N * C, 11, -100, 100));
  std::vector<float> dw = dw0, db = db0;
  k().matmul_dgelu_backward(dinp.p(), dw.data(), db.data(), dout.p(), inp.p(), pre.p(), w.data(), N, C, OC);
  // separate: matmul_backward into a zeroed d(gelu out), then gelu_backward into a zeroed dinp
  Act dgelu(act(), std::vector<float>((size_t)N * C, 0.0f)), sep_dinp = dgelu;
  std::vector<float> sep_dw = dw0, sep_db = db0;
  k().matmul_backward(dgelu.p(), sep_dw.data(), sep_db.data(), dout.p(), inp.p(), w.data(), N, C, OC);
  k().gelu_backward(sep_dinp.p(), pre.p(), dgelu.p(), (size_t)N * C);
  ExpectSame(dinp.Values(), sep_dinp.Values(), f32(), 2 * kOneBf16Step, "dinp");
  EXPECT_EQ(dw, sep_dw);  // the same weight-gradient call, accumulated onto dw0
  EXPECT_EQ(db, sep_db);
  EXPECT_NE(dw, dw0);
  // writes: another starting dinp, the same result
  Act dinp2(act(), std::vector<float>((size_t)N * C, -1.0f));
  k().matmul_dgelu_backward(dinp2.p(), nullptr, nullptr, dout.p(), inp.p(), pre.p(), w.data(), N, C, OC);
  EXPECT_EQ(dinp2.Values(), dinp.Values());
}

INSTANTIATE_TEST_SUITE_P(
    ActAndProducts, GeluFusedKernels,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16),
                       ::testing::Values(MatmulPrecision::kExact, MatmulPrecision::kBf16)),
    [](const ::testing::TestParamInfo<std::tuple<DType, MatmulPrecision>>& p) {
      return std::string(std::get<0>(p.param) == DType::kF32 ? "Fp32Act" : "Bf16Act") +
             (std::get<1>(p.param) == MatmulPrecision::kExact ? "Fp32Products" : "Bf16Products");
    });

}  // namespace
}  // namespace shardgpt
