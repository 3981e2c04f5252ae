// GPU tests of the CUDA Llama kernels (model/cuda/llama_cuda.cu) against their CPU twins
// (model/kernels_cpu_llama.h through NewCpuDevice), forward and backward, at fp32 and bf16
// activations, on odd shapes (rows not a multiple of a warp's rows, C not a multiple of 32, head
// size 10, grouped-query KV = 2 and multi-query KV = 1); and a tiny llama model trained on the
// device against the CPU. Label gpu (a GPU) or gpu-emu (the CUDA emulation); skipped without either.
//
// Tolerances, normwise (max |gpu - cpu| <= tol * max |cpu|), as kernels_gpu_test.cc:
//   fp32 activations 1e-5: RMSNorm's sum of squares is fp32 on the GPU and double on the CPU;
//     RoPE's cosf / sinf / powf may differ from glibc's by an ulp; SwiGLU's expf against the
//     CPU's exp_fast (2 ulp);
//   bf16 activations 2^-8 + 1e-5: the same plus one bf16 rounding step of the output (both sides
//     round once; a 1e-5 difference can cross a rounding boundary);
//   rstd 1e-5 relative; the fp32 weight gradient dw 1e-5 (different summation orders);
//   kv_repeat forward and backward bitwise: copies of stored bits, and the same fp32 additions in
//     the same order, rounded once.
// RMSNorm and SwiGLU at 16-byte aligned tensors with C (F) a multiple of 8 (128-bit groups)
// and one element off alignment (single values): bitwise equal on the device.
// Backward kernels that accumulate run twice on non-zero gradients and are compared after each
// call (the maths, then the +=); rope_backward rotates in place and is compared once, and
// rope_backward(rope_forward(x)) is x within the same tolerance.
// Training: 8 steps of AdamW on a 2-layer llama (C 40, 4 heads of 10, F 24), fp32 activations
// and products: every loss within 1e-4 of the CPU's; bf16 activations and bf16 products:
// within 2% of the CPU's at the same settings; the loss falls either way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/bf16.h"
#include "model/cuda/cuda_device.h"
#include "model/device.h"
#include "model/gpt.h"
#include "model/optimizer.h"
#include "model/param_layout.h"
#include "tests/common/random_data.h"
#include "tests/gpu/gpu_and_cpu.h"

namespace shardgpt {
namespace {

const double kTolF32 = 1e-5;
const double kTolBf16Act = std::ldexp(1.0, -8) + 1e-5;

// Normwise error of gpu against cpu; fails beyond tol (also on NaN).
void ExpectNear(const std::vector<float>& gpu, const std::vector<float>& cpu, double tol, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double scale = 0, worst = 0;
  for (float c : cpu) scale = std::max(scale, (double)std::fabs(c));
  size_t bad = 0;
  for (size_t i = 0; i < gpu.size(); i++) {
    const double err = std::fabs((double)gpu[i] - cpu[i]);
    if (err > worst || std::isnan(err)) worst = err;
    if (!(err <= tol * scale) && ++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: gpu " << gpu[i] << " cpu " << cpu[i];
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << gpu.size() << " beyond " << tol << " x " << scale;
  EXPECT_GT(scale, 0.0) << what << ": an all-zero reference tests nothing";
}

// One activation tensor (fp32, or bf16 bits) on each device with the same contents; values are
// read back widened to fp32.
class Act {
 public:
  Act(Device& g, Device& c, DType dtype, const std::vector<float>& init)
      : g_(&g), c_(&c), dtype_(dtype), n_(init.size()), bytes_(n_ * DTypeSize(dtype)),
        gb_(&g, nullptr, MemKind::kActivations, bytes_, "gpu"), cb_(&c, nullptr, MemKind::kActivations, bytes_, "cpu") {
    Set(init);
  }
  void Set(const std::vector<float>& v) {
    std::vector<uint8_t> raw(bytes_);
    if (dtype_ == DType::kBF16) FloatToBf16(v.data(), reinterpret_cast<uint16_t*>(raw.data()), n_);
    else std::memcpy(raw.data(), v.data(), bytes_);
    g_->CopyToDevice(gb_.data(), raw.data(), bytes_);
    c_->CopyToDevice(cb_.data(), raw.data(), bytes_);
  }
  void* p(bool gpu) const { return gpu ? gb_.data() : cb_.data(); }
  std::vector<uint8_t> Raw(bool gpu) const {
    std::vector<uint8_t> raw(bytes_);
    (gpu ? g_ : c_)->CopyToHost(raw.data(), (gpu ? gb_ : cb_).data(), bytes_);
    return raw;
  }
  std::vector<float> Get(bool gpu) const {
    const std::vector<uint8_t> raw = Raw(gpu);
    std::vector<float> v(n_);
    if (dtype_ == DType::kBF16) Bf16ToFloat(reinterpret_cast<const uint16_t*>(raw.data()), v.data(), n_);
    else std::memcpy(v.data(), raw.data(), bytes_);
    return v;
  }

 private:
  Device *g_, *c_;
  DType dtype_;
  size_t n_, bytes_;
  DeviceBuffer gb_, cb_;
};

// An fp32 tensor (parameters, statistics, parameter gradients) on each device.
class F32 {
 public:
  F32(Device& g, Device& c, const std::vector<float>& init)
      : g_(&g), c_(&c), n_(init.size()), gb_(&g, nullptr, MemKind::kParams, n_ * 4, "gpu"),
        cb_(&c, nullptr, MemKind::kParams, n_ * 4, "cpu") {
    g.CopyToDevice(gb_.data(), init.data(), n_ * 4);
    c.CopyToDevice(cb_.data(), init.data(), n_ * 4);
  }
  float* p(bool gpu) const { return gpu ? gb_.as<float>() : cb_.as<float>(); }
  std::vector<float> Get(bool gpu) const {
    std::vector<float> v(n_);
    (gpu ? g_ : c_)->CopyToHost(v.data(), (gpu ? gb_ : cb_).data(), n_ * 4);
    return v;
  }

 private:
  Device *g_, *c_;
  size_t n_;
  DeviceBuffer gb_, cb_;
};

class GpuLlama : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    std::string skip;
    if (!OpenGpuAndCpu(&gpu_, &cpu_, &skip)) GTEST_SKIP() << skip;
    for (bool g : {true, false}) k(g).set_activation_dtype(GetParam());
  }
  void TearDown() override {
    if (gpu_) gpu_->kernels().set_activation_dtype(DType::kF32);
  }
  Kernels& k(bool g) { return g ? gpu_->kernels() : cpu_->kernels(); }
  Act A(size_t n, uint32_t seed, float lo = -1, float hi = 1) {
    return Act(*gpu_, *cpu_, GetParam(), RandomFloats(n, seed, lo, hi));
  }
  F32 F(const std::vector<float>& v) { return F32(*gpu_, *cpu_, v); }
  bool bf16() const { return GetParam() == DType::kBF16; }
  double Tol() const { return bf16() ? kTolBf16Act : kTolF32; }
  void Near(const Act& x, const std::string& what) { ExpectNear(x.Get(true), x.Get(false), Tol(), what); }
  void Bitwise(const Act& x, const std::string& what) { EXPECT_TRUE(x.Raw(true) == x.Raw(false)) << what; }

  std::unique_ptr<Device> gpu_, cpu_;
};

TEST_P(GpuLlama, RmsnormForwardAndBackward) {
  // (7, 40): fewer rows than a block's 8 warps, C not a multiple of 32 (128-bit groups);
  // (5, 36): C not a multiple of 8 (column by column); (300, 72): two chunks of the weight
  // gradient's partial sums
  for (auto [N, C] : {std::pair<int, int>{7, 40}, {5, 36}, {300, 72}}) {
    const std::string at = " N " + std::to_string(N) + " C " + std::to_string(C);
    const size_t n = (size_t)N * C;
    auto x = A(n, 1, -2, 2), out = A(n, 2), dout = A(n, 3), dinp = A(n, 4);
    auto w = F(RandomFloats(C, 5, 0.5f, 1.5f)), dw = F(RandomFloats(C, 6));
    auto rstd = F(std::vector<float>(N));
    for (bool g : {true, false}) k(g).rmsnorm_forward(out.p(g), rstd.p(g), x.p(g), w.p(g), N, C, 1e-5f);
    Near(out, "rmsnorm out" + at);
    ExpectNear(rstd.Get(true), rstd.Get(false), 1e-5, "rmsnorm rstd" + at);
    for (int call = 1; call <= 2; call++) {  // the maths, then the accumulation
      for (bool g : {true, false})
        k(g).rmsnorm_backward(dinp.p(g), dw.p(g), dout.p(g), x.p(g), w.p(g), rstd.p(g), N, C);
      Near(dinp, "rmsnorm dinp call " + std::to_string(call) + at);
      ExpectNear(dw.Get(true), dw.Get(false), 1e-5, "rmsnorm dw call " + std::to_string(call) + at);
    }
  }
}

TEST_P(GpuLlama, RopeForwardAndBackward) {
  struct Shape {
    int B, T, NH, KV, hs;
    float theta;
  };
  for (const Shape& s : {Shape{2, 5, 4, 2, 10, 10000.0f}, Shape{2, 5, 4, 1, 10, 10000.0f},
                         Shape{1, 70, 2, 2, 16, 500000.0f}}) {
    const std::string at = " B " + std::to_string(s.B) + " T " + std::to_string(s.T) + " KV " + std::to_string(s.KV) +
                           " hs " + std::to_string(s.hs);
    const size_t n = (size_t)s.B * s.T * (s.NH + 2 * s.KV) * s.hs;
    const std::vector<float> init = RandomFloats(n, 7);
    auto qkv = Act(*gpu_, *cpu_, GetParam(), init);
    for (bool g : {true, false}) k(g).rope_forward(qkv.p(g), s.B, s.T, s.NH, s.KV, s.hs, s.theta);
    Near(qkv, "rope forward" + at);
    // the value heads are untouched (bitwise)
    const std::vector<uint8_t> raw = qkv.Raw(true);
    Act orig(*gpu_, *cpu_, GetParam(), init);
    const std::vector<uint8_t> before = orig.Raw(true);
    const size_t es = bf16() ? 2 : 4, W = (size_t)(s.NH + 2 * s.KV) * s.hs, v0 = (size_t)(s.NH + s.KV) * s.hs;
    size_t changed_v = 0;
    for (size_t r = 0; r < (size_t)s.B * s.T; r++)
      changed_v += std::memcmp(&raw[(r * W + v0) * es], &before[(r * W + v0) * es], s.KV * s.hs * es) != 0;
    EXPECT_EQ(changed_v, 0u) << "value heads changed" + at;
    // backward: the inverse rotation, in place (writes)
    auto dqkv = A(n, 8);
    for (bool g : {true, false}) k(g).rope_backward(dqkv.p(g), s.B, s.T, s.NH, s.KV, s.hs, s.theta);
    Near(dqkv, "rope backward" + at);
    // backward undoes forward on the device
    k(true).rope_backward(qkv.p(true), s.B, s.T, s.NH, s.KV, s.hs, s.theta);
    ExpectNear(qkv.Get(true), orig.Get(true), bf16() ? 3 * std::ldexp(1.0, -8) : kTolF32, "rope round trip" + at);
  }
}

TEST_P(GpuLlama, SwigluForwardAndBackward) {
  for (int F : {24, 20}) {  // 128-bit groups, and column by column
    const int N = 7;
    SCOPED_TRACE("F " + std::to_string(F));
    auto gate_up = A((size_t)N * 2 * F, 9, -4, 4), out = A((size_t)N * F, 10), dout = A((size_t)N * F, 11);
    auto dgate_up = A((size_t)N * 2 * F, 12);
    for (bool g : {true, false}) k(g).swiglu_forward(out.p(g), gate_up.p(g), N, F);
    Near(out, "swiglu out");
    for (int call = 1; call <= 2; call++) {
      for (bool g : {true, false}) k(g).swiglu_backward(dgate_up.p(g), gate_up.p(g), dout.p(g), N, F);
      Near(dgate_up, "swiglu dgate_up call " + std::to_string(call));
    }
  }
}

// RMSNorm and SwiGLU move 128-bit groups where C (F) is a multiple of 8 and the tensors are
// 16-byte aligned, else single values: the same tensors one element off alignment (the scalar
// path) give bitwise the aligned results (the vector path).
TEST_P(GpuLlama, VectorAndScalarPathsAgreeBitwise) {
  const int N = 9, C = 40, F = 24;
  const size_t es = bf16() ? 2 : 4;
  // the aligned tensor, and the same values at element 1 of a buffer one longer (misaligned)
  auto pair = [&](size_t n, uint32_t seed) {
    const std::vector<float> v = RandomFloats(n, seed, -2, 2);
    std::vector<float> shifted(1, 0.0f);
    shifted.insert(shifted.end(), v.begin(), v.end());
    return std::make_pair(Act(*gpu_, *cpu_, GetParam(), v), Act(*gpu_, *cpu_, GetParam(), shifted));
  };
  auto off = [&](const Act& a) { return static_cast<void*>(static_cast<char*>(a.p(true)) + es); };
  auto same = [&](const Act& aligned, const Act& shifted, const std::string& what) {
    const std::vector<float> a = aligned.Get(true), b = shifted.Get(true);
    EXPECT_EQ(a, std::vector<float>(b.begin() + 1, b.end())) << what;
  };
  const size_t n = (size_t)N * C;
  auto x = pair(n, 20), out = pair(n, 21), dout = pair(n, 22), dinp = pair(n, 23);
  auto w = F32(*gpu_, *cpu_, RandomFloats(C, 24)), dw1 = F32(*gpu_, *cpu_, std::vector<float>(C)),
       dw2 = F32(*gpu_, *cpu_, std::vector<float>(C));
  auto r1 = F32(*gpu_, *cpu_, std::vector<float>(N)), r2 = F32(*gpu_, *cpu_, std::vector<float>(N));
  k(true).rmsnorm_forward(out.first.p(true), r1.p(true), x.first.p(true), w.p(true), N, C, 1e-5f);
  k(true).rmsnorm_forward(off(out.second), r2.p(true), off(x.second), w.p(true), N, C, 1e-5f);
  same(out.first, out.second, "rmsnorm out");
  EXPECT_EQ(r1.Get(true), r2.Get(true)) << "rmsnorm rstd";
  k(true).rmsnorm_backward(dinp.first.p(true), dw1.p(true), dout.first.p(true), x.first.p(true), w.p(true),
                           r1.p(true), N, C);
  k(true).rmsnorm_backward(off(dinp.second), dw2.p(true), off(dout.second), off(x.second), w.p(true), r2.p(true),
                           N, C);
  same(dinp.first, dinp.second, "rmsnorm dinp");
  EXPECT_EQ(dw1.Get(true), dw2.Get(true)) << "rmsnorm dw";
  auto gu = pair((size_t)N * 2 * F, 25), sw = pair((size_t)N * F, 26), dsw = pair((size_t)N * F, 27),
       dgu = pair((size_t)N * 2 * F, 28);
  k(true).swiglu_forward(sw.first.p(true), gu.first.p(true), N, F);
  k(true).swiglu_forward(off(sw.second), off(gu.second), N, F);
  same(sw.first, sw.second, "swiglu out");
  k(true).swiglu_backward(dgu.first.p(true), gu.first.p(true), dsw.first.p(true), N, F);
  k(true).swiglu_backward(off(dgu.second), off(gu.second), off(dsw.second), N, F);
  same(dgu.first, dgu.second, "swiglu dgate_up");
}

TEST_P(GpuLlama, KvRepeatForwardAndBackwardBitwise) {
  const int N = 10, NH = 4, hs = 10, C = NH * hs;
  for (int KV : {2, 1, 4}) {  // grouped-query, multi-query, multi-head
    const std::string at = " KV " + std::to_string(KV);
    const int W = (NH + 2 * KV) * hs;
    auto qkv = A((size_t)N * W, 13), out = A((size_t)N * 3 * C, 14);
    for (bool g : {true, false}) k(g).kv_repeat_forward(out.p(g), qkv.p(g), N, NH, KV, hs);
    Bitwise(out, "kv_repeat forward" + at);
    // spot check against the definition: query head 3's key is kv head 3 / (NH / KV)'s
    const std::vector<float> o = out.Get(true), q = qkv.Get(true);
    const int j = 3 / (NH / KV);
    EXPECT_EQ(o[(size_t)1 * 3 * C + C + 3 * hs + 7], q[(size_t)1 * W + C + j * hs + 7]) << at;
    EXPECT_EQ(o[(size_t)1 * 3 * C + 2 * C + 3 * hs + 7], q[(size_t)1 * W + C + (KV + j) * hs + 7]) << at;
    auto dout = A((size_t)N * 3 * C, 15), dqkv = A((size_t)N * W, 16);
    for (int call = 1; call <= 2; call++) {
      for (bool g : {true, false}) k(g).kv_repeat_backward(dqkv.p(g), dout.p(g), N, NH, KV, hs);
      Bitwise(dqkv, "kv_repeat backward call " + std::to_string(call) + at);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Act, GpuLlama, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& p) {
                           return p.param == DType::kBF16 ? "Bf16" : "Fp32";
                         });

// ------------------------------------------------------------------------------------------------
// A tiny llama trained on the device and on the CPU.

// The model's parameters, gradients and AdamW moments in one device's memory.
class DeviceParams : public UnitHooks {
 public:
  DeviceParams(Device& d, const ParamLayout& layout, const std::vector<float>& init)
      : layout_(layout), n_(layout.total_numel()), p_(&d, nullptr, MemKind::kParams, n_ * 4, "params"),
        g_(&d, nullptr, MemKind::kGrads, n_ * 4, "grads"), m_(&d, nullptr, MemKind::kOptimizer, n_ * 4, "m"),
        v_(&d, nullptr, MemKind::kOptimizer, n_ * 4, "v") {
    d.CopyToDevice(p_.data(), init.data(), n_ * 4);
    d.Zero(g_.data(), n_ * 4), d.Zero(m_.data(), n_ * 4), d.Zero(v_.data(), n_ * 4);
  }
  const float* PreForward(int u) override { return p_.as<float>() + layout_.units()[u].offset; }
  void PostForward(int) override {}
  UnitBuffers PreBackward(int u) override {
    const size_t o = layout_.units()[u].offset;
    return UnitBuffers{p_.as<float>() + o, g_.as<float>() + o};
  }
  void PostBackward(int) override {}
  void Step(Device& d, int t) {
    d.kernels().adamw_mixed(p_.as<float>(), p_.data(), DType::kF32, g_.data(), DType::kF32, m_.as<float>(),
                            v_.as<float>(), n_, 3e-3f, 0.0f, AdamWConfig(), t, nullptr, 1.0f);
    d.Zero(g_.data(), n_ * 4);
  }

 private:
  const ParamLayout& layout_;
  size_t n_;
  DeviceBuffer p_, g_, m_, v_;
};

GPTConfig TinyLlama(int KV, bool tied) {
  GPTConfig c{2, 4, 40, 16, 64};  // 2 layers, 4 heads of 10, C 40, T <= 16, V 64
  c.arch = Arch::kLlama;
  c.n_kv_head = KV, c.ffn_hidden = 24, c.tie_embeddings = tied;
  return c;
}

std::vector<float> TrainOn(Device& d, const GPTConfig& c, DType act, MatmulPrecision precision, int steps) {
  const int B = 2, T = 13;
  d.kernels().set_activation_dtype(act);
  d.kernels().set_matmul_precision(precision);
  ParamLayout layout(c);
  std::vector<float> init(layout.total_numel());
  InitParameters(layout, 4, init.data());
  DeviceParams p(d, layout, init);
  const auto x = RandomTokens(B * T, c.vocab_size, 12), y = RandomTokens(B * T, c.vocab_size, 13);
  std::vector<float> losses;
  {
    GPT model(c, B, T, d);
    for (int step = 1; step <= steps; step++) {
      losses.push_back(model.Forward(p, x.data(), y.data(), B, T, 1.0f));
      model.Backward(p);
      p.Step(d, step);
    }
  }
  d.kernels().set_activation_dtype(DType::kF32);
  d.kernels().set_matmul_precision(MatmulPrecision::kExact);
  return losses;
}

class GpuLlamaTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string skip;
    if (!OpenGpuAndCpu(&gpu_, &cpu_, &skip)) GTEST_SKIP() << skip;
  }
  std::unique_ptr<Device> gpu_, cpu_;
};

TEST_F(GpuLlamaTrain, Fp32LossesMatchTheCpu) {
  constexpr int kSteps = 8;
  for (auto [KV, tied] : {std::pair<int, bool>{2, false}, {1, true}}) {
    const GPTConfig c = TinyLlama(KV, tied);
    ASSERT_TRUE(c.Validate().ok()) << c.Validate().message();
    const auto gpu = TrainOn(*gpu_, c, DType::kF32, MatmulPrecision::kExact, kSteps);
    const auto cpu = TrainOn(*cpu_, c, DType::kF32, MatmulPrecision::kExact, kSteps);
    double worst = 0;
    for (int s = 0; s < kSteps; s++) {
      EXPECT_NEAR(gpu[s], cpu[s], 1e-4) << "KV " << KV << " step " << s + 1;
      worst = std::max(worst, (double)std::fabs(gpu[s] - cpu[s]));
    }
    std::printf("llama KV %d %s, fp32: largest loss gap device vs CPU over %d steps %.3g (loss %.4f -> %.4f)\n", KV,
                tied ? "tied" : "untied", kSteps, worst, gpu[0], gpu[kSteps - 1]);
    EXPECT_LT(gpu[kSteps - 1], gpu[0] - 0.1f) << "KV " << KV;
  }
}

TEST_F(GpuLlamaTrain, Bf16LossesCloseToTheCpu) {
  constexpr int kSteps = 8;
  const GPTConfig c = TinyLlama(2, false);
  const auto gpu = TrainOn(*gpu_, c, DType::kBF16, MatmulPrecision::kBf16, kSteps);
  const auto cpu = TrainOn(*cpu_, c, DType::kBF16, MatmulPrecision::kBf16, kSteps);
  double worst = 0;
  for (int s = 0; s < kSteps; s++) {
    EXPECT_NEAR(gpu[s], cpu[s], 0.02 * cpu[s]) << "step " << s + 1;
    worst = std::max(worst, (double)std::fabs(gpu[s] - cpu[s]) / cpu[s]);
  }
  std::printf("llama bf16 activations and products: largest relative loss gap device vs CPU over %d steps %.3g "
              "(loss %.4f -> %.4f)\n", kSteps, worst, gpu[0], gpu[kSteps - 1]);
  EXPECT_LT(gpu[kSteps - 1], gpu[0] - 0.1f);
}

}  // namespace
}  // namespace shardgpt
