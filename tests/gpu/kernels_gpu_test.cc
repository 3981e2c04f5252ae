// GPU tests of the CUDA backend (model/cuda/): every CUDA kernel against its CPU twin
// (model/kernels_cpu.h through NewCpuDevice), on identical random inputs, forward and backward;
// the device's memory, copies, events and staging; out-of-memory errors; bitwise determinism.
//
// Without a usable GPU every test that needs one is SKIPPED (GTEST_SKIP, which CTest reports
// as "Not Run"/skipped through SKIP_REGULAR_EXPRESSION, never as passed). The one test that
// runs without a GPU checks the error a user gets in that case.
//
// Tolerances, all "normwise": max_i |gpu_i - cpu_i| <= tol * max_i |cpu_i| (the error relative
// to the tensor's largest magnitude, so values that cancel to ~0 do not need a relative bound):
//   kTolF32  = 1e-5  fp32 kernels and kExact matmuls (TF32 off): both sides sum in fp32 in
//                    different orders, and the CPU's exp/tanh are 2-ulp polynomials;
//   kTolBf16 = 1e-2  kBf16 matmuls (tensor cores on bf16-rounded inputs, 8-bit mantissas);
//   kTolAdam = 1e-6  AdamW on a GPU, the same float operations in the same order (a few ulp;
//                    FMA contraction may differ between nvcc and gcc); under the emulation
//                    bitwise (kEmulated);
//   sum_squares: 1e-12 relative (double accumulation in different orders).
// Bitwise equality where both sides do the same single rounding in the same order: encoder
// (forward and the ordered scatter), convert, accumulate.
// Backward kernels are called twice on zeroed gradients and compared after each call: the
// first call checks the maths, the second the accumulation (+=).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/bf16.h"
#include "model/cuda/cuda_device.h"
#include "model/device.h"
#include "model/device_factory.h"
#include "model/optimizer.h"
#include "tests/common/random_data.h"
#include "tests/gpu/gpu_and_cpu.h"

namespace shardgpt {
namespace {

constexpr double kTolF32 = 1e-5;
constexpr double kTolBf16 = 1e-2;
constexpr double kTolAdam = 1e-6;
// Under the emulation the kernels are compiled by the host compiler with the CPU twins' flags,
// so the twins that do the same float operations in the same order agree bit for bit there;
// on a GPU nvcc may contract them into FMAs differently, and such tests use kTolAdam.
#ifdef SHARDGPT_CUDA_EMULATION
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

// max |gpu - cpu| <= tol * max |cpu| (see the file comment); reports the first few violations.
void ExpectNear(const std::vector<float>& gpu, const std::vector<float>& cpu, double tol, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double scale = 0;
  for (float c : cpu) scale = std::max(scale, (double)std::fabs(c));
  const double bound = tol * scale;
  double worst = 0;
  size_t bad = 0;
  for (size_t i = 0; i < gpu.size(); i++) {
    const double err = std::fabs((double)gpu[i] - (double)cpu[i]);
    if (err > worst || std::isnan(err)) worst = err;
    if (!(err <= bound)) {  // also catches NaN
      if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: gpu " << gpu[i] << " cpu " << cpu[i];
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << gpu.size() << " beyond " << bound << " (tol " << tol
                     << " x max|cpu| " << scale << "), max abs err " << worst;
}

template <typename T>
void ExpectBitwise(const std::vector<T>& a, const std::vector<T>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); i++) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0 && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i] << " (bits differ)";
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << a.size() << " elements differ bitwise";
}

// One tensor on the GPU and on the CPU, filled with the same values.
template <typename T>
class Twin {
 public:
  Twin(Device& gpu, Device& cpu, const std::vector<T>& init, const std::string& what)
      : gpu_(&gpu),
        cpu_(&cpu),
        n_(init.size()),
        g_(&gpu, nullptr, MemKind::kParams, init.size() * sizeof(T), what),
        c_(&cpu, nullptr, MemKind::kParams, init.size() * sizeof(T), what) {
    Set(init);
  }
  Twin(Device& gpu, Device& cpu, size_t n, const std::string& what) : Twin(gpu, cpu, std::vector<T>(n), what) {}

  void Set(const std::vector<T>& v) {
    gpu_->CopyToDevice(g_.data(), v.data(), n_ * sizeof(T));
    cpu_->CopyToDevice(c_.data(), v.data(), n_ * sizeof(T));
  }
  T* p(bool on_gpu) const { return on_gpu ? g_.as<T>() : c_.as<T>(); }
  std::vector<T> Gpu() const { return Read(*gpu_, g_); }
  std::vector<T> Cpu() const { return Read(*cpu_, c_); }

 private:
  std::vector<T> Read(Device& d, const DeviceBuffer& b) const {
    std::vector<T> v(n_);
    d.CopyToHost(v.data(), b.data(), n_ * sizeof(T));
    return v;
  }
  Device* gpu_;
  Device* cpu_;
  size_t n_;
  DeviceBuffer g_, c_;
};

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string skip;
    if (!OpenGpuAndCpu(&gpu_, &cpu_, &skip)) GTEST_SKIP() << skip;
  }
  Device& dev(bool on_gpu) { return on_gpu ? *gpu_ : *cpu_; }
  Kernels& k(bool on_gpu) { return dev(on_gpu).kernels(); }
  template <typename T>
  Twin<T> Make(const std::vector<T>& init, const std::string& what) {
    return Twin<T>(*gpu_, *cpu_, init, what);
  }
  Twin<float> Zeros(size_t n, const std::string& what) { return Twin<float>(*gpu_, *cpu_, n, what); }

  std::unique_ptr<Device> gpu_, cpu_;
};

// ------------------------------------------------------------------------------------------------
// device

// Runs where there is no GPU (here it is the one test that does): the user-facing error.
TEST(CudaNoGpu, CreateFailsWithOneLine) {
  std::string error;
  if (CudaVisibleDeviceCount(&error) > 0) GTEST_SKIP() << "a GPU is visible; this checks the no-GPU error";
  EXPECT_FALSE(error.empty());
  auto dev = CreateCudaDevice(0, 1);
  ASSERT_FALSE(dev.ok());
  const std::string& msg = dev.status().message();
  EXPECT_EQ(msg.rfind("--device cuda: no usable GPU: ", 0), 0u) << msg;
  EXPECT_NE(msg.find(error), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  auto via_factory = CreateDevice("cuda", 0, 1);
  ASSERT_FALSE(via_factory.ok());
  EXPECT_EQ(via_factory.status().message(), msg);
  EXPECT_TRUE(CudaBackendBuilt());
}

TEST_F(GpuTest, DeviceBasics) {
  EXPECT_EQ(gpu_->name().rfind("cuda:0 (", 0), 0u) << gpu_->name();
  EXPECT_NE(gpu_->name().find(", bus "), std::string::npos) << gpu_->name();
  EXPECT_TRUE(gpu_->is_cuda());
  EXPECT_FALSE(gpu_->host_accessible());
  EXPECT_GT(gpu_->free_bytes(), 0u);

  const size_t n = 100003;
  DeviceBuffer a(gpu_.get(), nullptr, MemKind::kParams, n * 4, "a"), b(gpu_.get(), nullptr, MemKind::kGrads, n * 4, "b");
  std::vector<float> host(n, 1.0f);
  gpu_->CopyToHost(host.data(), a.data(), n * 4);
  EXPECT_EQ(host, std::vector<float>(n, 0.0f)) << "Allocate zero-fills";

  const auto x = RandomFloats(n, 1);
  gpu_->CopyToDevice(a.data(), x.data(), n * 4);
  gpu_->Copy(b.data(), a.data(), n * 4);
  gpu_->Zero(a.data(), 16);
  auto event = gpu_->RecordEvent();
  event->Synchronize();
  gpu_->Synchronize();
  std::vector<float> got_b(n), got_a(n);
  gpu_->CopyToHost(got_b.data(), b.data(), n * 4);
  gpu_->CopyToHost(got_a.data(), a.data(), n * 4);
  EXPECT_EQ(got_b, x);
  EXPECT_EQ(std::vector<float>(got_a.begin(), got_a.begin() + 4), std::vector<float>(4, 0.0f));
  EXPECT_EQ(std::vector<float>(got_a.begin() + 4, got_a.end()), std::vector<float>(x.begin() + 4, x.end()));

  // Staging from another thread, through pinned memory, after an event.
  float* pinned = static_cast<float*>(gpu_->AllocateHost(n * 4));
  ASSERT_NE(pinned, nullptr);
  auto ready = gpu_->RecordEvent();
  std::thread comm([&] {
    ready->Synchronize();
    gpu_->StageToHost(pinned, b.data(), n * 4);
    for (size_t i = 0; i < n; i++) pinned[i] *= 2.0f;
    gpu_->StageToDevice(a.data(), pinned, n * 4);
  });
  comm.join();
  gpu_->CopyToHost(got_a.data(), a.data(), n * 4);
  for (size_t i = 0; i < n; i++) ASSERT_EQ(got_a[i], 2.0f * x[i]) << i;
  gpu_->FreeHost(pinned);
}

TEST_F(GpuTest, OutOfMemoryNamesTheBuffer) {
  try {
    void* p = gpu_->Allocate(size_t{1} << 60, "absurd test buffer");
    gpu_->Free(p);
    FAIL() << "allocating 2^60 bytes succeeded";
  } catch (const DeviceOutOfMemory& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("absurd test buffer"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(size_t{1} << 60)), std::string::npos) << msg;
    EXPECT_NE(msg.find("free"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--zero-stage"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--micro-batch"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  // The device still works afterwards.
  DeviceBuffer ok(gpu_.get(), nullptr, MemKind::kParams, 1024, "after oom");
  gpu_->Synchronize();
}

// ------------------------------------------------------------------------------------------------
// model kernels

TEST_F(GpuTest, Encoder) {
  const int B = 3, T = 64, C = 96, V = 50;
  auto tok = RandomTokens((size_t)B * T, V, 2);
  for (int t = 0; t < 8; t++) tok[t] = tok[T + t] = 7;  // plenty of repeats
  auto tokens = Make(tok, "tokens");
  auto wte = Make(RandomFloats((size_t)V * C, 3), "wte");
  auto wpe = Make(RandomFloats((size_t)T * C, 4), "wpe");
  auto out = Zeros((size_t)B * T * C, "out");
  for (bool g : {true, false}) k(g).encoder_forward(out.p(g), tokens.p(g), wte.p(g), wpe.p(g), B, T, C);
  ExpectBitwise(out.Gpu(), out.Cpu(), "encoder out");

  auto dout = Make(RandomFloats((size_t)B * T * C, 5), "dout");
  auto dwte = Zeros((size_t)V * C, "dwte");
  auto dwpe = Zeros((size_t)T * C, "dwpe");
  for (int call = 1; call <= 2; call++) {
    for (bool g : {true, false}) k(g).encoder_backward(dwte.p(g), dwpe.p(g), dout.p(g), tokens.p(g), B, T, C);
    // Same additions in the same order as the CPU twin: bitwise equal.
    ExpectBitwise(dwte.Gpu(), dwte.Cpu(), "encoder dwte, call " + std::to_string(call));
    ExpectBitwise(dwpe.Gpu(), dwpe.Cpu(), "encoder dwpe, call " + std::to_string(call));
  }
}

// C: in registers (C % 8 == 0, C <= 2048: 96, 768, 264 with a partial last group of 256
// columns, 1600 with 8 groups a lane) and from memory (45, 2056).
TEST_F(GpuTest, Layernorm) {
  for (auto [N, C] : {std::pair{70, 96}, std::pair{600, 768}, std::pair{41, 264}, std::pair{9, 1600},
                      std::pair{20, 45}, std::pair{5, 2056}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C));
    auto inp = Make(RandomFloats((size_t)N * C, 10, -2.0f, 3.0f), "inp");
    auto w = Make(RandomFloats(C, 11), "w");
    auto b = Make(RandomFloats(C, 12), "b");
    auto out = Zeros((size_t)N * C, "out"), mean = Zeros(N, "mean"), rstd = Zeros(N, "rstd");
    for (bool g : {true, false}) k(g).layernorm_forward(out.p(g), mean.p(g), rstd.p(g), inp.p(g), w.p(g), b.p(g), N, C);
    ExpectNear(out.Gpu(), out.Cpu(), kTolF32, "layernorm out");
    ExpectNear(mean.Gpu(), mean.Cpu(), kTolF32, "layernorm mean");
    ExpectNear(rstd.Gpu(), rstd.Cpu(), kTolF32, "layernorm rstd");

    auto dout = Make(RandomFloats((size_t)N * C, 13), "dout");
    auto dinp = Zeros((size_t)N * C, "dinp"), dw = Zeros(C, "dw"), db = Zeros(C, "db");
    for (int call = 1; call <= 2; call++) {
      for (bool g : {true, false})
        k(g).layernorm_backward(dinp.p(g), dw.p(g), db.p(g), dout.p(g), inp.p(g), w.p(g), mean.p(g), rstd.p(g), N, C);
      const std::string c = ", call " + std::to_string(call);
      ExpectNear(dinp.Gpu(), dinp.Cpu(), kTolF32, "layernorm dinp" + c);
      ExpectNear(dw.Gpu(), dw.Cpu(), kTolF32, "layernorm dw" + c);
      ExpectNear(db.Gpu(), db.Cpu(), kTolF32, "layernorm db" + c);
    }
  }
}

// The fused residual + LayerNorm against its CPU twin, and bitwise against the GPU's own
// residual_forward + layernorm_forward (the model fuses them in the forward, and kBlock's
// re-forward runs layernorm_forward alone on the saved res3: the two must agree bit for bit).
TEST_F(GpuTest, ResidualLayernormFused) {
  for (auto [N, C] : {std::pair{70, 96}, std::pair{37, 45}, std::pair{300, 768}, std::pair{20, 264},
                      std::pair{9, 1600}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C));
    const size_t NC = (size_t)N * C;
    auto a = Make(RandomFloats(NC, 14, -2.0f, 3.0f), "a");
    auto b = Make(RandomFloats(NC, 15, -2.0f, 2.0f), "b");
    auto w = Make(RandomFloats(C, 16), "w");
    auto bias = Make(RandomFloats(C, 17), "bias");
    auto res = Zeros(NC, "res"), ln = Zeros(NC, "ln"), mean = Zeros(N, "mean"), rstd = Zeros(N, "rstd");
    for (bool g : {true, false})
      k(g).residual_layernorm_forward(res.p(g), ln.p(g), mean.p(g), rstd.p(g), a.p(g), b.p(g), w.p(g), bias.p(g), N,
                                      C);
    ExpectBitwise(res.Gpu(), res.Cpu(), "fused res");
    ExpectNear(ln.Gpu(), ln.Cpu(), kTolF32, "fused ln");
    ExpectNear(mean.Gpu(), mean.Cpu(), kTolF32, "fused mean");
    ExpectNear(rstd.Gpu(), rstd.Cpu(), kTolF32, "fused rstd");
    auto res2 = Zeros(NC, "res2"), ln2 = Zeros(NC, "ln2"), mean2 = Zeros(N, "mean2"), rstd2 = Zeros(N, "rstd2");
    k(true).residual_forward(res2.p(true), a.p(true), b.p(true), NC);
    k(true).layernorm_forward(ln2.p(true), mean2.p(true), rstd2.p(true), res2.p(true), w.p(true), bias.p(true), N, C);
    ExpectBitwise(res.Gpu(), res2.Gpu(), "fused res vs residual_forward");
    ExpectBitwise(ln.Gpu(), ln2.Gpu(), "fused ln vs layernorm_forward");
    ExpectBitwise(mean.Gpu(), mean2.Gpu(), "fused mean vs layernorm_forward");
    ExpectBitwise(rstd.Gpu(), rstd2.Gpu(), "fused rstd vs layernorm_forward");
  }
}

// The register path of LayerNorm (C % 8 == 0, C <= 2048) loads with 128-bit accesses only
// when every pointer is 16-byte aligned, else with scalar loads of the same columns: from
// tensors one float off alignment it gives bitwise the aligned results (forward, residual +
// LayerNorm, backward), and they match the CPU twin. dw and db: the 128-bit column sums
// (aligned) are bitwise the scalar kernel's (misaligned).
TEST_F(GpuTest, LayernormMisalignedIsBitwiseAligned) {
  const int N = 21, C = 264;
  const size_t NC = (size_t)N * C;
  const auto x = RandomFloats(NC, 30, -2.0f, 3.0f), a = RandomFloats(NC, 31), dout = RandomFloats(NC, 32);
  const auto dinp0 = RandomFloats(NC, 33), w = RandomFloats(C, 34), b = RandomFloats(C, 35);
  std::vector<float> out[2], res[2], ln[2], dinp[2], stats[2], dwb[2];  // [offset], the GPU's
  for (int off : {0, 1}) {
    SCOPED_TRACE("offset " + std::to_string(off));
    auto at = [&](const std::vector<float>& v, const std::string& what) {
      std::vector<float> s(off, 0.0f);
      s.insert(s.end(), v.begin(), v.end());
      return Make(s, what);
    };
    auto tail = [&](std::vector<float> v) { return std::vector<float>(v.begin() + off, v.end()); };
    auto tx = at(x, "x"), ta = at(a, "a"), td = at(dout, "dout"), tdx = at(dinp0, "dinp"), tw = at(w, "w"),
         tb = at(b, "b");
    auto tout = at(std::vector<float>(NC), "out"), tres = at(std::vector<float>(NC), "res"),
         tln = at(std::vector<float>(NC), "ln");
    auto mean = Zeros(N, "mean"), rstd = Zeros(N, "rstd"), mean2 = Zeros(N, "mean2"), rstd2 = Zeros(N, "rstd2");
    auto dw = Zeros(C, "dw"), db = Zeros(C, "db");
    for (bool g : {true, false}) {
      k(g).layernorm_forward(tout.p(g) + off, mean.p(g), rstd.p(g), tx.p(g) + off, tw.p(g) + off, tb.p(g) + off, N, C);
      k(g).residual_layernorm_forward(tres.p(g) + off, tln.p(g) + off, mean2.p(g), rstd2.p(g), tx.p(g) + off,
                                      ta.p(g) + off, tw.p(g) + off, tb.p(g) + off, N, C);
      k(g).layernorm_backward(tdx.p(g) + off, dw.p(g), db.p(g), td.p(g) + off, tx.p(g) + off, tw.p(g) + off,
                              mean.p(g), rstd.p(g), N, C);
    }
    ExpectNear(tail(tout.Gpu()), tail(tout.Cpu()), kTolF32, "out");
    ExpectNear(tail(tln.Gpu()), tail(tln.Cpu()), kTolF32, "fused ln");
    ExpectNear(tail(tdx.Gpu()), tail(tdx.Cpu()), kTolF32, "dinp");
    out[off] = tail(tout.Gpu()), res[off] = tail(tres.Gpu()), ln[off] = tail(tln.Gpu()), dinp[off] = tail(tdx.Gpu());
    ExpectNear(dw.Gpu(), dw.Cpu(), kTolF32, "dw");
    ExpectNear(db.Gpu(), db.Cpu(), kTolF32, "db");
    dwb[off] = dw.Gpu();
    const auto dbv = db.Gpu();
    dwb[off].insert(dwb[off].end(), dbv.begin(), dbv.end());
    stats[off] = mean.Gpu();
    for (auto* t : {&rstd, &mean2, &rstd2}) {
      const auto v = t->Gpu();
      stats[off].insert(stats[off].end(), v.begin(), v.end());
    }
  }
  ExpectBitwise(out[1], out[0], "out");
  ExpectBitwise(res[1], res[0], "res");
  ExpectBitwise(ln[1], ln[0], "fused ln");
  ExpectBitwise(dinp[1], dinp[0], "dinp");
  ExpectBitwise(stats[1], stats[0], "mean, rstd");
  ExpectBitwise(dwb[1], dwb[0], "dw, db");  // the 128-bit column sums are the scalar ones
}

struct MatmulCase {
  int N, C, OC;
  bool bias, dinp;
  int offset;  // floats added to every pointer: 0 (256-byte aligned) or 1 (4-byte aligned)
};

void RunMatmul(Device& gpu, Device& cpu, const MatmulCase& mc, MatmulPrecision precision, double tol) {
  const int N = mc.N, C = mc.C, OC = mc.OC, o = mc.offset;
  SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC) +
               (mc.bias ? " bias" : " no bias") + (mc.dinp ? "" : " no dinp") + " offset " + std::to_string(o));
  auto make = [&](std::vector<float> v, const char* what) {
    v.insert(v.begin(), o, 0.0f);
    return Twin<float>(gpu, cpu, v, what);
  };
  auto inp = make(RandomFloats((size_t)N * C, 20), "inp");
  auto w = make(RandomFloats((size_t)OC * C, 21), "w");
  auto bias = make(RandomFloats(OC, 22), "bias");
  auto out = make(std::vector<float>((size_t)N * OC), "out");
  gpu.kernels().set_matmul_precision(precision);
  auto kern = [&](bool g) -> Kernels& { return (g ? gpu : cpu).kernels(); };
  for (bool g : {true, false})
    kern(g).matmul_forward(out.p(g) + o, inp.p(g) + o, w.p(g) + o, mc.bias ? bias.p(g) + o : nullptr, N, C, OC);
  ExpectNear(out.Gpu(), out.Cpu(), tol, "matmul out");

  auto dout = make(RandomFloats((size_t)N * OC, 23), "dout");
  auto dinp = make(std::vector<float>((size_t)N * C), "dinp");
  auto dw = make(std::vector<float>((size_t)OC * C), "dw");
  auto dbias = make(std::vector<float>(OC), "dbias");
  for (int call = 1; call <= 2; call++) {
    for (bool g : {true, false})
      kern(g).matmul_backward(mc.dinp ? dinp.p(g) + o : nullptr, dw.p(g) + o, mc.bias ? dbias.p(g) + o : nullptr,
                              dout.p(g) + o, inp.p(g) + o, w.p(g) + o, N, C, OC);
    const std::string c = ", call " + std::to_string(call);
    ExpectNear(dinp.Gpu(), dinp.Cpu(), tol, "matmul dinp" + c);
    ExpectNear(dw.Gpu(), dw.Cpu(), tol, "matmul dw" + c);
    ExpectNear(dbias.Gpu(), dbias.Cpu(), kTolF32, "matmul dbias" + c);  // our fp32 column sums
  }
  if (!mc.dinp) {
    EXPECT_EQ(dinp.Gpu(), std::vector<float>((size_t)N * C + o, 0.0f)) << "dinp == null: untouched";
  }
  gpu.kernels().set_matmul_precision(MatmulPrecision::kExact);
}

const MatmulCase kMatmulCases[] = {
    {64, 96, 128, true, true, 0},   {33, 75, 50, true, true, 0},    {128, 256, 384, false, true, 0},
    {96, 64, 200, true, false, 0},  {40, 48, 72, true, true, 1},    {300, 768, 2304, true, true, 0},
};

TEST_F(GpuTest, MatmulExact) {
  for (const auto& mc : kMatmulCases) RunMatmul(*gpu_, *cpu_, mc, MatmulPrecision::kExact, kTolF32);
}

TEST_F(GpuTest, MatmulBf16) {
  for (const auto& mc : kMatmulCases) RunMatmul(*gpu_, *cpu_, mc, MatmulPrecision::kBf16, kTolBf16);
}

// --gelu fused at fp32 activations: every configuration has cuBLASLt's GELU epilogue (GELU_AUX
// or GELU_AUX_BIAS forward, DGELU backward; fp32 D and aux) at both precisions. Against the CPU
// twins (which at fp32 activations are matmul + gelu): the matmul's tolerance.
TEST_F(GpuTest, MatmulGeluFusedFp32Activations) {
  for (MatmulPrecision precision : {MatmulPrecision::kExact, MatmulPrecision::kBf16}) {
    SCOPED_TRACE(precision == MatmulPrecision::kExact ? "fp32 products" : "bf16 products");
    const double tol = precision == MatmulPrecision::kExact ? kTolF32 : kTolBf16;
    for (bool g : {true, false}) k(g).set_matmul_precision(precision);
    const int N = 40, C = 64, OC = 4 * 64;
    auto inp = Make(RandomFloats((size_t)N * C, 70, -2, 2), "inp"), w = Make(RandomFloats((size_t)OC * C, 71), "w");
    auto b = Make(RandomFloats(OC, 72), "bias");
    for (bool bias : {true, false}) {
      auto out = Zeros((size_t)N * OC, "out"), pre = Zeros((size_t)N * OC, "pre");
      const uint64_t before = CudaGeluEpilogueCalls(*gpu_);
      for (bool g : {true, false})
        k(g).matmul_gelu_forward(out.p(g), pre.p(g), inp.p(g), w.p(g), bias ? b.p(g) : nullptr, N, C, OC);
      EXPECT_EQ(CudaGeluEpilogueCalls(*gpu_) - before, 1u);
      ExpectNear(pre.Gpu(), pre.Cpu(), tol, bias ? "pre (bias)" : "pre");
      ExpectNear(out.Gpu(), out.Cpu(), tol, bias ? "out (bias)" : "out");
    }
    // backward at the fc projection's shape (in = 4 x out channels)
    auto dout = Make(RandomFloats((size_t)N * 64, 73), "dout"), wp = Make(RandomFloats((size_t)64 * OC, 74), "w");
    auto x = Make(RandomFloats((size_t)N * OC, 75), "inp"), pre = Make(RandomFloats((size_t)N * OC, 76, -3, 3), "pre");
    auto dinp = Make(RandomFloats((size_t)N * OC, 77, -50, 50), "dinp");  // garbage: written
    auto dw = Zeros((size_t)64 * OC, "dw"), dbias = Zeros(64, "dbias");
    const uint64_t before = CudaGeluEpilogueCalls(*gpu_);
    for (bool g : {true, false})
      k(g).matmul_dgelu_backward(dinp.p(g), dw.p(g), dbias.p(g), dout.p(g), x.p(g), pre.p(g), wp.p(g), N, OC, 64);
    EXPECT_EQ(CudaGeluEpilogueCalls(*gpu_) - before, 1u);
    ExpectNear(dinp.Gpu(), dinp.Cpu(), tol, "dinp");
    ExpectNear(dw.Gpu(), dw.Cpu(), tol, "dw");
    ExpectNear(dbias.Gpu(), dbias.Cpu(), kTolF32, "dbias");
  }
  for (bool g : {true, false}) k(g).set_matmul_precision(MatmulPrecision::kExact);
}

// The weight reuse window with bf16 storage (Kernels::note_bf16_source): a matmul weight inside
// a noted fp32 compute copy is read from the bf16 parameters it was noted as widened from, until
// the window closes or either buffer is freed (CudaDevice::Free). The test notes a source that
// is NOT the weights' bf16 (twice them), so which one the product read shows in its result.
TEST_F(GpuTest, MatmulBf16ReadsTheNotedBf16SourceUntilFreed) {
  const int N = 32, C = 64, OC = 48;
  const size_t n = (size_t)OC * C;
  std::vector<float> w = RandomFloats(n, 52), w2(n), w3(n);
  for (size_t i = 0; i < n; i++) w[i] = RoundToBf16(w[i]), w2[i] = 2 * w[i], w3[i] = -w[i];
  std::vector<uint16_t> w2_bits(n);
  FloatToBf16(w2.data(), w2_bits.data(), n);
  auto d_inp = Make(RandomFloats((size_t)N * C, 53), "inp");
  auto forward = [&](const float* weights) {
    Twin<float> out = Zeros((size_t)N * OC, "out");
    k(true).matmul_forward(out.p(true), d_inp.p(true), weights, nullptr, N, C, OC);
    return out.Gpu();
  };
  k(true).set_matmul_precision(MatmulPrecision::kBf16);
  auto d_w = std::make_unique<Twin<float>>(*gpu_, *cpu_, w, "w");
  auto d_w2 = Make(w2, "w2");
  const std::vector<float> out_w = forward(d_w->p(true)), out_w2 = forward(d_w2.p(true));
  ASSERT_NE(out_w, out_w2);
  {
    DeviceBuffer src(gpu_.get(), nullptr, MemKind::kParams, n * sizeof(uint16_t), "bf16 source");
    gpu_->CopyToDevice(src.data(), w2_bits.data(), n * sizeof(uint16_t));
    k(true).begin_weight_reuse();
    k(true).note_bf16_source(d_w->p(true), src.data(), n);
    ExpectBitwise(forward(d_w->p(true)), out_w2, "a weight inside the noted copy, read from its source");
    src.Free();
    ExpectBitwise(forward(d_w->p(true)), out_w, "after the source's Free");
    k(true).end_weight_reuse();
  }
  // a noted compute copy freed and its memory reused (the pool hands back the same block) for
  // other weights: those are converted, not read from the old source
  DeviceBuffer src(gpu_.get(), nullptr, MemKind::kParams, n * sizeof(uint16_t), "bf16 source");
  gpu_->CopyToDevice(src.data(), w2_bits.data(), n * sizeof(uint16_t));
  k(true).begin_weight_reuse();
  const float* old_w = d_w->p(true);
  k(true).note_bf16_source(old_w, src.data(), n);
  d_w.reset();
  d_w = std::make_unique<Twin<float>>(*gpu_, *cpu_, w3, "w3");
  auto d_w3 = Make(w3, "w3 elsewhere");
  const std::vector<float> out_w3 = forward(d_w3.p(true));
  if (d_w->p(true) != old_w) GTEST_LOG_(INFO) << "the pool did not reuse the block; the Free is still checked";
  ExpectBitwise(forward(d_w->p(true)), out_w3, "new weights in a freed noted block");
  k(true).end_weight_reuse();
  // outside a window nothing is noted
  k(true).note_bf16_source(d_w->p(true), src.data(), n);
  ExpectBitwise(forward(d_w->p(true)), out_w3, "a note outside any window");
  k(true).set_matmul_precision(MatmulPrecision::kExact);
}

// bf16 activations with bf16 storage: a forward bias that is a noted widening of stored bf16
// values reaches cuBLASLt as those bf16 values, in the bias epilogue of the bf16 result (one
// call, no fp32 result in scratch); any other fp32 bias takes the fp32 result rounded once
// after. As above, the noted source is deliberately other values (twice the bias), so that the
// output shows which bias was read. Both paths round fp32(product) + bias once to bf16: under
// the emulation they agree bit for bit; on a GPU cuBLASLt may pick another algorithm for a bf16
// result (another summation order): within one bf16 rounding there.
TEST_F(GpuTest, MatmulForwardTakesANotedBf16BiasIntoItsBf16Result) {
  const int N = 32, C = 64, OC = 48;
  std::vector<float> b = RandomFloats(OC, 61), b2(OC);
  for (int i = 0; i < OC; i++) b[i] = RoundToBf16(4 * b[i]), b2[i] = 2 * b[i];  // 2b: exact in bf16
  std::vector<uint16_t> inp_bits((size_t)N * C), b2_bits(OC);
  const std::vector<float> inp = RandomFloats((size_t)N * C, 62);
  FloatToBf16(inp.data(), inp_bits.data(), inp.size());
  FloatToBf16(b2.data(), b2_bits.data(), OC);
  k(true).set_matmul_precision(MatmulPrecision::kBf16);
  k(true).set_activation_dtype(DType::kBF16);
  auto d_inp = Make(inp_bits, "inp");
  auto d_w = Make(RandomFloats((size_t)OC * C, 63), "w");
  auto d_b = Make(b, "bias"), d_b2 = Make(b2, "2 x bias");
  auto forward = [&](const float* bias) {
    Twin<uint16_t> out = Make(std::vector<uint16_t>((size_t)N * OC), "out");
    k(true).matmul_forward(out.p(true), d_inp.p(true), d_w.p(true), bias, N, C, OC);
    std::vector<float> widened((size_t)N * OC);
    const std::vector<uint16_t> bits = out.Gpu();
    for (size_t i = 0; i < bits.size(); i++) widened[i] = Bf16ToFloat(bits[i]);
    return widened;
  };
  const std::vector<float> out_b = forward(d_b.p(true)), out_b2 = forward(d_b2.p(true));
  ASSERT_NE(out_b, out_b2);
  auto expect_same = [&](const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
    if (kEmulated) ExpectBitwise(got, want, what);
    else ExpectNear(got, want, 1.0 / 128, what);  // one bf16 rounding of the largest value
  };
  DeviceBuffer src(gpu_.get(), nullptr, MemKind::kParams, OC * sizeof(uint16_t), "bf16 bias source");
  gpu_->CopyToDevice(src.data(), b2_bits.data(), OC * sizeof(uint16_t));
  k(true).begin_weight_reuse();
  k(true).note_bf16_source(d_b.p(true), src.data(), OC);
  expect_same(forward(d_b.p(true)), out_b2, "a bias inside the noted copy, read from its bf16 source");
  src.Free();
  ExpectBitwise(forward(d_b.p(true)), out_b, "after the source's Free: the fp32 bias again");
  k(true).end_weight_reuse();
  k(true).set_activation_dtype(DType::kF32);
  k(true).set_matmul_precision(MatmulPrecision::kExact);
}

// What kBf16 computes, told apart from the alternatives cuBLAS could pick: the products of
// bf16-rounded (RNE) inputs summed in fp32, not TF32-rounded inputs (10-bit mantissas, what
// CUBLAS_COMPUTE_32F_FAST_16BF on fp32 operands may do) and not fp32. Inputs are chosen not to
// be bf16 values; the reference is in double. The three references differ by ~1e-3 (normwise),
// the GPU must be within 2e-5 of the bf16 one (fp32 accumulation of exact products).
TEST_F(GpuTest, MatmulBf16RoundsTheInputsToBf16) {
  const int N = 48, C = 160, OC = 72;
  std::vector<float> inp = RandomFloats((size_t)N * C, 50), w = RandomFloats((size_t)OC * C, 51);
  auto round_mantissa = [](float x, int dropped_bits) {  // round to nearest even, as bf16 / TF32 do
    uint32_t u;
    std::memcpy(&u, &x, 4);
    const uint32_t half = 1u << (dropped_bits - 1), low = u & ((1u << dropped_bits) - 1);
    u &= ~((1u << dropped_bits) - 1);
    if (low > half || (low == half && (u >> dropped_bits) & 1u)) u += 1u << dropped_bits;
    float r;
    std::memcpy(&r, &u, 4);
    return r;
  };
  auto reference = [&](int dropped_bits) {
    std::vector<float> out((size_t)N * OC);
    for (int n = 0; n < N; n++)
      for (int o = 0; o < OC; o++) {
        double acc = 0;
        for (int c = 0; c < C; c++) {
          const float a = inp[(size_t)n * C + c], b = w[(size_t)o * C + c];
          acc += dropped_bits ? (double)round_mantissa(a, dropped_bits) * round_mantissa(b, dropped_bits)
                              : (double)a * b;
        }
        out[(size_t)n * OC + o] = (float)acc;
      }
    return out;
  };
  const std::vector<float> ref_bf16 = reference(16), ref_tf32 = reference(13), ref_f32 = reference(0);
  auto normwise = [](const std::vector<float>& a, const std::vector<float>& b) {
    double err = 0, scale = 0;
    for (size_t i = 0; i < a.size(); i++) err = std::max(err, std::fabs((double)a[i] - b[i])), scale = std::max(scale, std::fabs((double)b[i]));
    return err / scale;
  };
  ASSERT_GT(normwise(ref_tf32, ref_bf16), 2e-4) << "the inputs do not tell bf16 from TF32 rounding";
  ASSERT_GT(normwise(ref_f32, ref_bf16), 2e-4);
  auto d_inp = Make(inp, "inp"), d_w = Make(w, "w");
  auto out = Zeros((size_t)N * OC, "out");
  gpu_->kernels().set_matmul_precision(MatmulPrecision::kBf16);
  gpu_->kernels().matmul_forward(out.p(true), d_inp.p(true), d_w.p(true), nullptr, N, C, OC);
  gpu_->kernels().set_matmul_precision(MatmulPrecision::kExact);
  const std::vector<float> got = out.Gpu();
  EXPECT_LT(normwise(got, ref_bf16), 2e-5) << "not the product of bf16-rounded inputs";
  EXPECT_GT(normwise(got, ref_tf32), 1e-4) << "looks like TF32 rounding";
}

TEST_F(GpuTest, Attention) {
  struct Case {
    int B, T, NH, hs;
  };
  // T multiple of the 32-row tile and not; hs 32, 48 (dims per lane with a remainder), 64, 128.
  for (const Case& a : {Case{2, 64, 4, 32}, Case{2, 100, 4, 64}, Case{1, 256, 4, 64}, Case{1, 80, 4, 48},
                        Case{1, 96, 4, 128}}) {
    const int B = a.B, T = a.T, NH = a.NH, C = NH * a.hs;
    SCOPED_TRACE("B=" + std::to_string(B) + " T=" + std::to_string(T) + " NH=" + std::to_string(NH) +
                 " hs=" + std::to_string(a.hs));
    auto qkv = Make(RandomFloats((size_t)B * T * 3 * C, 30, -1.5f, 1.5f), "qkv");
    auto out = Zeros((size_t)B * T * C, "out"), lse = Zeros((size_t)B * NH * T, "lse");
    for (bool g : {true, false}) k(g).attention_forward(out.p(g), lse.p(g), qkv.p(g), B, T, C, NH);
    ExpectNear(out.Gpu(), out.Cpu(), kTolF32, "attention out");
    ExpectNear(lse.Gpu(), lse.Cpu(), kTolF32, "attention lse");

    auto dout = Make(RandomFloats((size_t)B * T * C, 31), "dout");
    auto dqkv = Zeros((size_t)B * T * 3 * C, "dqkv");
    for (int call = 1; call <= 2; call++) {
      // Both backward passes read the CPU's forward results, so only the backward is compared.
      out.Set(out.Cpu());
      lse.Set(lse.Cpu());
      for (bool g : {true, false})
        k(g).attention_backward(dqkv.p(g), dout.p(g), qkv.p(g), out.p(g), lse.p(g), B, T, C, NH);
      ExpectNear(dqkv.Gpu(), dqkv.Cpu(), kTolF32, "attention dqkv, call " + std::to_string(call));
    }
  }
}

TEST_F(GpuTest, GeluAndResidual) {
  const size_t n = 100003;
  auto x = Make(RandomFloats(n, 40, -5.0f, 5.0f), "x");
  auto y = Make(RandomFloats(n, 41), "y");
  auto out = Zeros(n, "out");
  for (bool g : {true, false}) k(g).gelu_forward(out.p(g), x.p(g), n);
  ExpectNear(out.Gpu(), out.Cpu(), kTolF32, "gelu out");
  auto dinp = Zeros(n, "dinp");
  for (int call = 1; call <= 2; call++) {
    for (bool g : {true, false}) k(g).gelu_backward(dinp.p(g), x.p(g), y.p(g), n);
    ExpectNear(dinp.Gpu(), dinp.Cpu(), kTolF32, "gelu dinp, call " + std::to_string(call));
  }
  for (bool g : {true, false}) k(g).residual_forward(out.p(g), x.p(g), y.p(g), n);
  ExpectBitwise(out.Gpu(), out.Cpu(), "residual out");
}

TEST_F(GpuTest, CrossEntropy) {
  const int N = 48, V = 300, Vp = 384;
  auto logits_init = RandomFloats((size_t)N * Vp, 50, -4.0f, 4.0f);
  for (int n = 0; n < N; n++)
    for (int v = V; v < Vp; v++) logits_init[(size_t)n * Vp + v] = 1000.0f;  // padding: must be ignored
  auto targets = Make(RandomTokens(N, V, 51), "targets");
  auto losses = Zeros(N, "losses");
  for (float scale : {0.0f, 1.0f / N}) {
    SCOPED_TRACE("dloss_scale " + std::to_string(scale));
    auto logits = Make(logits_init, "logits");
    double total[2];
    for (bool g : {true, false})
      total[g] = k(g).crossentropy_softmax(logits.p(g), losses.p(g), targets.p(g), N, V, Vp, scale);
    EXPECT_NEAR(total[1], total[0], 1e-5 * std::fabs(total[0])) << "sum of losses";
    ExpectNear(losses.Gpu(), losses.Cpu(), kTolF32, "losses");
    double sum = 0;
    for (float l : losses.Gpu()) sum += l;
    EXPECT_EQ(sum, total[1]) << "the returned sum is the row-order double sum of the losses";
    const auto got = logits.Gpu();
    if (scale == 0.0f) {
      ExpectBitwise(got, logits_init, "logits untouched when dloss_scale == 0");
    } else {
      ExpectNear(got, logits.Cpu(), kTolF32, "dlogits");
      for (int n = 0; n < N; n++)
        for (int v = V; v < Vp; v++) ASSERT_EQ(got[(size_t)n * Vp + v], 0.0f) << "padded column " << n << "," << v;
    }
  }
}

// The embedding backward sorts positions by token on the device: more positions than one
// block of the sort kernel (several tiles), a token at every position of a long run, token 0
// and the last token: still the CPU twin's additions in its order, bitwise.
TEST_F(GpuTest, EncoderBackwardSortedOnTheDevice) {
  const int B = 4, T = 200, C = 40, V = 1000;
  auto tok = RandomTokens((size_t)B * T, V, 12);
  for (int t = 0; t < 300; t++) tok[t] = 5;  // one token across sequences and tiles
  tok[301] = 0, tok[799] = V - 1, tok[400] = V - 1;
  auto tokens = Make(tok, "tokens");
  auto dout = Make(RandomFloats((size_t)B * T * C, 13), "dout");
  auto dwte = Make(RandomFloats((size_t)V * C, 14), "dwte");  // accumulates into what is there
  auto dwpe = Zeros((size_t)T * C, "dwpe");
  for (bool g : {true, false}) k(g).encoder_backward(dwte.p(g), dwpe.p(g), dout.p(g), tokens.p(g), B, T, C);
  ExpectBitwise(dwte.Gpu(), dwte.Cpu(), "dwte");
  ExpectBitwise(dwpe.Gpu(), dwpe.Cpu(), "dwpe");
}

// The classifier with the loss kept on the device: *loss_acc += float(sum of losses / N) per
// call, the dlogits seed as crossentropy_softmax's; rows with large and equal logits check
// the online softmax's rescaling.
TEST_F(GpuTest, CrossEntropyLossOnTheDevice) {
  const int N = 40, V = 1000, Vp = 1024;
  auto init = RandomFloats((size_t)N * Vp, 52, -4.0f, 4.0f);
  for (int v = 0; v < V; v++) init[v] = 80.0f + 0.01f * v;           // row 0: growing, large
  for (int v = 0; v < V; v++) init[(size_t)Vp + v] = -30.0f;         // row 1: all equal
  for (int v = 0; v < V; v++) init[(size_t)2 * Vp + v] = 50.0f - v;  // row 2: falling
  for (int n = 0; n < N; n++)
    for (int v = V; v < Vp; v++) init[(size_t)n * Vp + v] = 1000.0f;  // padding: ignored
  auto targets = Make(RandomTokens(N, V, 53), "targets");
  auto losses = Zeros(N, "losses");
  for (float scale : {0.0f, 0.5f / N}) {
    SCOPED_TRACE("dloss_scale " + std::to_string(scale));
    auto logits = Make(init, "logits");
    auto ref = Make(init, "reference logits");
    Twin<double> acc(*gpu_, *cpu_, std::vector<double>{0.25}, "loss accumulator");
    double expect = 0.25;
    for (int call = 0; call < 2; call++) {
      for (bool g : {true, false})
        k(g).crossentropy_softmax_acc(logits.p(g), losses.p(g), targets.p(g), N, V, Vp, scale, acc.p(g));
      const double total =
          k(false).crossentropy_softmax(ref.p(false), losses.p(false), targets.p(false), N, V, Vp, scale);
      expect += static_cast<float>(total / N);
    }
    EXPECT_EQ(acc.Cpu()[0], expect) << "CPU twin: the mean loss as GPT::Forward returns it, added per call";
    EXPECT_NEAR(acc.Gpu()[0], expect, 1e-5 * std::fabs(expect)) << "device loss accumulator";
    ExpectNear(losses.Gpu(), losses.Cpu(), kTolF32, "losses");
    // Every loss is finite and >= 0; row 1 (all logits equal): log V.
    for (float l : losses.Gpu()) ASSERT_TRUE(std::isfinite(l) && l >= -1e-5f) << l;
    if (scale == 0.0f) EXPECT_NEAR(losses.Gpu()[1], std::log((double)V), 1e-4);
    if (scale != 0.0f) {
      const auto got = logits.Gpu();
      ExpectNear(got, logits.Cpu(), kTolF32, "dlogits");
      for (int n = 0; n < N; n++)
        for (int v = V; v < Vp; v++) ASSERT_EQ(got[(size_t)n * Vp + v], 0.0f) << "padded column " << n << "," << v;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// engine kernels

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST_F(GpuTest, ConvertIsBitwiseLikeTheCpu) {
  std::vector<float> x = RandomFloats(10000, 60, -100.0f, 100.0f);
  for (uint32_t u : {0x00000000u, 0x80000000u, 0x3f800000u, 0x3f808000u /* tie, even */, 0x3f818000u /* tie, odd */,
                     0x3f808001u, 0x7f7fffffu /* max: rounds to inf */, 0x00000001u, 0x00400000u /* denormals */,
                     0x807fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7fc00001u, 0xffa00000u /* signalling */,
                     0x7f800001u /* payload only in the low bits */})
    x.push_back(FromBits(u));
  auto f32 = Make(x, "f32");
  auto bf = Twin<uint16_t>(*gpu_, *cpu_, x.size(), "bf16");
  for (bool g : {true, false}) k(g).convert(f32.p(g), DType::kF32, bf.p(g), DType::kBF16, x.size());
  ExpectBitwise(bf.Gpu(), bf.Cpu(), "f32 -> bf16");
  auto back = Zeros(x.size(), "back");
  for (bool g : {true, false}) k(g).convert(bf.p(g), DType::kBF16, back.p(g), DType::kF32, x.size());
  const auto gb = back.Gpu(), cb = back.Cpu();
  ASSERT_EQ(gb.size(), cb.size());
  for (size_t i = 0; i < gb.size(); i++) ASSERT_EQ(Bits(gb[i]), Bits(cb[i])) << "bf16 -> f32 [" << i << "]";
  auto copy = Zeros(x.size(), "copy");
  k(true).convert(f32.p(true), DType::kF32, copy.p(true), DType::kF32, x.size());
  for (size_t i = 0; i < x.size(); i++) ASSERT_EQ(Bits(copy.Gpu()[i]), Bits(x[i])) << "f32 -> f32 copy";
}

TEST_F(GpuTest, AccumulateIsBitwiseLikeTheCpu) {
  const size_t n = 50001;
  const auto a = RandomFloats(n, 70, -3.0f, 3.0f), b = RandomFloats(n, 71, -3.0f, 3.0f);
  std::vector<uint16_t> ab(n), bb(n);
  FloatToBf16(a.data(), ab.data(), n);
  FloatToBf16(b.data(), bb.data(), n);
  for (DType dst_t : {DType::kF32, DType::kBF16}) {
    for (DType src_t : {DType::kF32, DType::kBF16}) {
      const std::string what = std::string("accumulate ") + DTypeName(dst_t) + " += " + DTypeName(src_t);
      auto df = Make(a, "dst f32");
      auto db = Twin<uint16_t>(*gpu_, *cpu_, ab, "dst bf16");
      auto sf = Make(b, "src f32");
      auto sb = Twin<uint16_t>(*gpu_, *cpu_, bb, "src bf16");
      for (int call = 0; call < 2; call++) {
        for (bool g : {true, false}) {
          void* dst = dst_t == DType::kF32 ? (void*)df.p(g) : (void*)db.p(g);
          const void* src = src_t == DType::kF32 ? (const void*)sf.p(g) : (const void*)sb.p(g);
          k(g).accumulate(dst, dst_t, src, src_t, n);
        }
      }
      if (dst_t == DType::kF32) {
        ExpectBitwise(df.Gpu(), df.Cpu(), what);
      } else {
        ExpectBitwise(db.Gpu(), db.Cpu(), what);
      }
    }
  }
}

// The element-wise kernels move 8 elements per step in 128-bit accesses when every pointer is
// 16-byte aligned, and fall back to scalar accesses otherwise; a tail shorter than 8 is scalar.
// At every offset (fp32 0..3 floats: each 4-byte misalignment of a 16-byte vector; bf16 0..7)
// and a length that is not a multiple of 8, each kernel still matches its CPU twin (bitwise
// where the twins are bitwise), and the emulation (which stops on a misaligned vector access)
// runs every path. (adamw_mixed: AdamWMixedAtEveryAlignment.)
TEST_F(GpuTest, ElementwiseKernelsAtEveryAlignment) {
  const size_t n = 1003, pad = 8;
  for (size_t o = 0; o < 8; o++) {
    SCOPED_TRACE("offset " + std::to_string(o) + " elements");
    auto x = Make(RandomFloats(n + pad, 100 + o, -4.0f, 4.0f), "x");
    auto y = Make(RandomFloats(n + pad, 110 + o), "y");
    auto out = Zeros(n + pad, "out");
    if (o < 4) {  // fp32 kernels
      for (bool g : {true, false}) k(g).residual_forward(out.p(g) + o, x.p(g) + o, y.p(g), n);
      ExpectBitwise(out.Gpu(), out.Cpu(), "residual, only out and a offset");
      for (bool g : {true, false}) k(g).residual_forward(out.p(g) + o, x.p(g) + o, y.p(g) + o, n);
      ExpectBitwise(out.Gpu(), out.Cpu(), "residual");
      for (bool g : {true, false}) k(g).gelu_forward(out.p(g) + o, x.p(g) + o, n);
      ExpectNear(out.Gpu(), out.Cpu(), kTolF32, "gelu");
      for (bool g : {true, false}) k(g).gelu_backward(out.p(g) + o, x.p(g) + o, y.p(g) + o, n);
      ExpectNear(out.Gpu(), out.Cpu(), kTolF32, "gelu backward");
      out.Set(out.Cpu());  // the same start on both (GELU's results agree only to rounding)
      for (bool g : {true, false}) k(g).accumulate(out.p(g) + o, DType::kF32, y.p(g) + o, DType::kF32, n);
      ExpectBitwise(out.Gpu(), out.Cpu(), "accumulate f32 += f32");
    }
    // bf16 <-> fp32: a bf16 offset o is 2o bytes, an fp32 one 4 (o % 4) bytes
    Twin<uint16_t> h(*gpu_, *cpu_, std::vector<uint16_t>(n + pad), "bf16");
    const size_t of = o % 4;
    for (bool g : {true, false}) k(g).convert(x.p(g) + of, DType::kF32, h.p(g) + o, DType::kBF16, n);
    ExpectBitwise(h.Gpu(), h.Cpu(), "convert f32 -> bf16");
    for (bool g : {true, false}) k(g).convert(h.p(g) + o, DType::kBF16, out.p(g) + of, DType::kF32, n);
    ExpectBitwise(out.Gpu(), out.Cpu(), "convert bf16 -> f32");
    for (bool g : {true, false}) k(g).accumulate(h.p(g) + o, DType::kBF16, y.p(g) + of, DType::kF32, n);
    ExpectBitwise(h.Gpu(), h.Cpu(), "accumulate bf16 += f32");
    for (bool g : {true, false}) k(g).accumulate(out.p(g) + of, DType::kF32, h.p(g) + o, DType::kBF16, n);
    ExpectBitwise(out.Gpu(), out.Cpu(), "accumulate f32 += bf16");
    std::vector<uint16_t> yb(n + pad);
    FloatToBf16(y.Cpu().data(), yb.data(), n + pad);
    Twin<uint16_t> h2(*gpu_, *cpu_, yb, "bf16 src");
    for (bool g : {true, false}) k(g).accumulate(h.p(g) + o, DType::kBF16, h2.p(g) + (7 - o), DType::kBF16, n);
    ExpectBitwise(h.Gpu(), h.Cpu(), "accumulate bf16 += bf16");
  }
}

// x placed `o` elements into a zero buffer of n + pad, and the n elements read back from there.
template <typename T>
std::vector<T> Placed(const std::vector<T>& x, size_t o, size_t pad) {
  std::vector<T> b(x.size() + pad);
  std::copy(x.begin(), x.end(), b.begin() + o);
  return b;
}
template <typename T>
std::vector<T> Slice(const std::vector<T>& b, size_t o, size_t n) {
  return std::vector<T>(b.begin() + o, b.begin() + o + n);
}
// Every element of b outside [o, o + n) is still 0 (nothing written past either end).
template <typename T>
void ExpectPadsUntouched(const std::vector<T>& b, size_t o, size_t n, const std::string& what) {
  for (size_t i = 0; i < b.size(); i++)
    if (i < o || i >= o + n) ASSERT_EQ(b[i], T(0)) << what << ": element " << i << " outside [" << o << ", " << o + n << ")";
}

// adamw_mixed's 8-wide path (fp32 master, m and v in two 128-bit accesses per 8 elements, a bf16
// gradient or stored copy in one) and its scalar fallback: for every (stored form, gradient
// dtype), with every pointer, or one of them alone, o elements past a 16-byte boundary (o = 0..7:
// each 4-byte step of fp32, each 2-byte step of bf16; at o = 4 fp32 is aligned again, bf16 is
// not), on lengths with a tail and below one vector. The logical inputs are the same at every
// placement, so: the GPU's bits at every placement are those of the all-aligned (vector) run;
// the stored copy is the new master narrowed (RNE) or copied; nothing outside the n elements is
// written; and under the emulation every array is bitwise the CPU twin's (on a GPU, kTolAdam).
// Two steps: the scale as a value, then from device memory.
TEST_F(GpuTest, AdamWMixedAtEveryAlignment) {
  const size_t pad = 8;
  enum Where { kAll, kMaster, kGrad, kMoment1, kMoment2, kStored, kPlaces };
  const char* const where_name[] = {"every pointer", "master", "grad", "m", "v", "stored"};
  AdamWConfig cfg;
  auto factor = Make(std::vector<float>{0.3f, 0.7f}, "factor");
  for (const size_t n : {size_t{1003}, size_t{21}, size_t{5}}) {
    const auto x = RandomFloats(n, 140), m0 = RandomFloats(n, 141, -0.01f, 0.01f),
               v0 = RandomFloats(n, 142, 0.0f, 1e-4f), g32 = RandomFloats(n, 143, -0.1f, 0.1f);
    std::vector<uint16_t> g16(n);
    FloatToBf16(g32.data(), g16.data(), n);
    for (const DType gd : {DType::kF32, DType::kBF16}) {
      for (const int store : {0, 1, 2}) {  // 0: stored is the master (fp32), 1: a separate fp32 copy, 2: bf16
        const DType sd = store == 2 ? DType::kBF16 : DType::kF32;
        std::vector<float> ref_master, ref_m, ref_v;  // the all-aligned run's
        for (int where = kAll; where < kPlaces; where++) {
          if (where == kStored && store == 0) continue;  // no separate stored array
          for (size_t o = 0; o < 8; o++) {
            if (where != kAll && o == 0) continue;  // the all-aligned run again
            const std::string c = "n " + std::to_string(n) + " grad " + DTypeName(gd) + " store " +
                                  std::to_string(store) + ", " + where_name[where] + " at offset " + std::to_string(o);
            SCOPED_TRACE(c);
            auto at = [&](int w) { return where == kAll || where == w ? o : size_t{0}; };
            const size_t om = at(kMaster), og = at(kGrad), o1 = at(kMoment1), o2 = at(kMoment2), os = at(kStored);
            auto master = Make(Placed(x, om, pad), "master");
            auto m = Make(Placed(m0, o1, pad), "m");
            auto v = Make(Placed(v0, o2, pad), "v");
            auto grad32 = Make(Placed(g32, og, pad), "grad f32");
            auto grad16 = Twin<uint16_t>(*gpu_, *cpu_, Placed(g16, og, pad), "grad bf16");
            auto s32 = Zeros(n + pad, "stored f32");
            auto s16 = Twin<uint16_t>(*gpu_, *cpu_, n + pad, "stored bf16");
            for (int64_t t = 1; t <= 2; t++) {
              for (bool g : {true, false}) {
                const void* gr = gd == DType::kBF16 ? static_cast<const void*>(grad16.p(g) + og) : grad32.p(g) + og;
                void* st = store == 0   ? static_cast<void*>(master.p(g) + om)
                           : store == 1 ? static_cast<void*>(s32.p(g) + os)
                                        : static_cast<void*>(s16.p(g) + os);
                k(g).adamw_mixed(master.p(g) + om, st, sd, gr, gd, m.p(g) + o1, v.p(g) + o2, n, 6e-4f, 0.1f, cfg, t,
                                 t == 2 ? factor.p(g) + 1 : nullptr, 0.7f);
              }
            }
            const auto gm = master.Gpu(), g1 = m.Gpu(), g2 = v.Gpu();
            ExpectPadsUntouched(gm, om, n, "master");
            ExpectPadsUntouched(g1, o1, n, "m");
            ExpectPadsUntouched(g2, o2, n, "v");
            const auto sm = Slice(gm, om, n);
            if (where == kAll && o == 0) {
              ref_master = sm, ref_m = Slice(g1, o1, n), ref_v = Slice(g2, o2, n);
              EXPECT_NE(sm[n - 1], x[n - 1]) << "the parameters moved";
            } else {
              ExpectBitwise(sm, ref_master, "master == the aligned run's");
              ExpectBitwise(Slice(g1, o1, n), ref_m, "m == the aligned run's");
              ExpectBitwise(Slice(g2, o2, n), ref_v, "v == the aligned run's");
            }
            if (store == 1) {
              const auto gs = s32.Gpu();
              ExpectPadsUntouched(gs, os, n, "stored f32");
              ExpectBitwise(Slice(gs, os, n), sm, "stored f32 == master");
            }
            if (store == 2) {
              const auto gs = s16.Gpu();
              ExpectPadsUntouched(gs, os, n, "stored bf16");
              std::vector<uint16_t> narrowed(n);
              FloatToBf16(sm.data(), narrowed.data(), n);
              ExpectBitwise(Slice(gs, os, n), narrowed, "stored bf16 == RNE(master)");
            }
            if (kEmulated) {
              ExpectBitwise(gm, master.Cpu(), "master vs the CPU twin");
              ExpectBitwise(g1, m.Cpu(), "m vs the CPU twin");
              ExpectBitwise(g2, v.Cpu(), "v vs the CPU twin");
              if (store == 1) ExpectBitwise(s32.Gpu(), s32.Cpu(), "stored f32 vs the CPU twin");
              if (store == 2) ExpectBitwise(s16.Gpu(), s16.Cpu(), "stored bf16 vs the CPU twin");
            } else {
              ExpectNear(gm, master.Cpu(), kTolAdam, "master vs the CPU twin");
              ExpectNear(g2, v.Cpu(), kTolAdam, "v vs the CPU twin");
            }
            if (HasFailure()) return;  // one configuration's failures, not 300
          }
        }
      }
    }
  }
}

TEST_F(GpuTest, SumSquares) {
  for (size_t n : {size_t{1}, size_t{1000}, size_t{3000017}}) {
    const auto x = RandomFloats(n, 80, -2.0f, 2.0f);
    std::vector<uint16_t> xb(n);
    FloatToBf16(x.data(), xb.data(), n);
    auto f = Make(x, "x f32");
    auto b = Twin<uint16_t>(*gpu_, *cpu_, xb, "x bf16");
    const double gf = k(true).sum_squares(f.p(true), DType::kF32, n);
    const double cf = k(false).sum_squares(f.p(false), DType::kF32, n);
    const double gb = k(true).sum_squares(b.p(true), DType::kBF16, n);
    const double cb = k(false).sum_squares(b.p(false), DType::kBF16, n);
    EXPECT_NEAR(gf, cf, 1e-12 * cf) << "f32, n " << n;
    EXPECT_NEAR(gb, cb, 1e-12 * cb) << "bf16, n " << n;
    EXPECT_EQ(k(true).sum_squares(f.p(true), DType::kF32, n), gf) << "deterministic";
  }
}

// AdamW's reference: adamw_update (model/optimizer.h) on host copies of the parameters and
// moments, lr 6e-4 and weight decay 0.1 as in the tests below.
struct HostAdamW {
  std::vector<float> p, m, v;
  void Step(const std::vector<float>& grad, int64_t t, float scale) {
    adamw_update(p.data(), grad.data(), m.data(), v.data(), p.size(), 6e-4f, 0.1f, AdamWConfig(), t, scale);
  }
};

// A GPU result against the host's adamw_update: bitwise under the emulation (the same float
// operations by the same compiler), within kTolAdam on a GPU (see kEmulated). The CPU kernel
// set's results are bitwise adamw_update's everywhere (KernelsAdamWMixed).
void ExpectAdamW(const std::vector<float>& gpu, const std::vector<float>& host, const std::string& what) {
  if (kEmulated) return ExpectBitwise(gpu, host, what);
  ExpectNear(gpu, host, kTolAdam, what);
}

// fp32 storage (stored == master) with an fp32 gradient, as the engine's fp32 runs call it:
// adamw_mixed is adamw_update, over three steps, on both kernel sets.
TEST_F(GpuTest, AdamW) {
  const size_t n = 100003;
  HostAdamW ref{RandomFloats(n, 90), RandomFloats(n, 92, -0.01f, 0.01f), RandomFloats(n, 93, 0.0f, 1e-4f)};
  const auto g = RandomFloats(n, 91, -0.1f, 0.1f);
  auto param = Make(ref.p, "param");
  auto grad = Make(g, "grad");
  auto m = Make(ref.m, "m");
  auto v = Make(ref.v, "v");
  AdamWConfig cfg;
  for (int64_t t = 1; t <= 3; t++) {
    for (bool d : {true, false})
      k(d).adamw_mixed(param.p(d), param.p(d), DType::kF32, grad.p(d), DType::kF32, m.p(d), v.p(d), n, 6e-4f, 0.1f,
                       cfg, t, nullptr, 0.7f);
    ref.Step(g, t, 0.7f);
    const std::string c = ", step " + std::to_string(t);
    ExpectAdamW(param.Gpu(), ref.p, "GPU param vs adamw_update" + c);
    ExpectAdamW(m.Gpu(), ref.m, "GPU m vs adamw_update" + c);
    ExpectAdamW(v.Gpu(), ref.v, "GPU v vs adamw_update" + c);
    ExpectBitwise(param.Cpu(), ref.p, "CPU param vs adamw_update" + c);
    ExpectBitwise(v.Cpu(), ref.v, "CPU v vs adamw_update" + c);
  }
}

// The step's device scalars: sum_squares_to is sum_squares kept on the device (bitwise: the
// same partials added in the same order), sum_f64 and clip_factor match their CPU twins
// bitwise, and adamw_mixed with the factor in device memory is adamw_mixed with it as a value
// (bitwise) and adamw_update's result.
TEST_F(GpuTest, DeviceScalars) {
  const size_t n = 70001;
  auto x = Make(RandomFloats(n, 85, -2.0f, 2.0f), "x");
  Twin<double> ss(*gpu_, *cpu_, std::vector<double>(4), "sums");
  for (bool g : {true, false}) {
    k(g).sum_squares_to(ss.p(g), x.p(g), DType::kF32, n);
    k(g).sum_squares_to(ss.p(g) + 1, x.p(g), DType::kF32, 1000);
    k(g).sum_squares_to(ss.p(g) + 2, x.p(g), DType::kF32, 0);
    k(g).sum_f64(ss.p(g) + 3, ss.p(g), 3, 4.0);
  }
  const auto gs = ss.Gpu(), cs = ss.Cpu();
  EXPECT_EQ(gs[0], k(true).sum_squares(x.p(true), DType::kF32, n)) << "the host-returned sum, bitwise";
  EXPECT_EQ(gs[1], k(true).sum_squares(x.p(true), DType::kF32, 1000));
  EXPECT_EQ(gs[2], 0.0);
  EXPECT_NEAR(gs[0], cs[0], 1e-12 * cs[0]);
  EXPECT_EQ(gs[3], (gs[0] + gs[1] + gs[2]) / 4.0) << "index order, then the divisor";
  EXPECT_EQ(cs[3], (cs[0] + cs[1] + cs[2]) / 4.0);

  for (double sumsq : {0.0, 0.81, 2.25, 1e6}) {
    for (float clip : {0.0f, 1.0f}) {
      Twin<double> in(*gpu_, *cpu_, std::vector<double>{sumsq}, "ss");
      auto out = Zeros(2, "norm, factor");
      for (bool g : {true, false}) k(g).clip_factor(out.p(g), in.p(g), clip);
      ExpectBitwise(out.Gpu(), out.Cpu(), "clip_factor " + std::to_string(sumsq) + " clip " + std::to_string(clip));
      const float norm = static_cast<float>(std::sqrt(sumsq));
      EXPECT_EQ(out.Gpu()[0], norm);
      EXPECT_EQ(out.Gpu()[1], (clip > 0 && norm > clip) ? clip / (norm + 1e-6f) : 1.0f);
    }
  }

  const size_t m = 30011;
  HostAdamW ref{RandomFloats(m, 94), std::vector<float>(m), std::vector<float>(m)};
  const auto gh = RandomFloats(m, 95, -0.1f, 0.1f);
  auto p1 = Make(ref.p, "param");
  auto p2 = Make(ref.p, "param (device factor)");
  auto grad = Make(gh, "grad");
  auto m1 = Zeros(m, "m"), v1 = Zeros(m, "v"), m2 = Zeros(m, "m2"), v2 = Zeros(m, "v2");
  auto factor = Make(std::vector<float>{0.3f, 0.7f}, "factor");
  AdamWConfig cfg;
  for (int64_t t = 1; t <= 2; t++) {
    k(true).adamw_mixed(p1.p(true), p1.p(true), DType::kF32, grad.p(true), DType::kF32, m1.p(true), v1.p(true), m,
                        6e-4f, 0.1f, cfg, t, nullptr, 0.7f);
    for (bool g : {true, false})  // the value argument is ignored when the device pointer is given
      k(g).adamw_mixed(p2.p(g), p2.p(g), DType::kF32, grad.p(g), DType::kF32, m2.p(g), v2.p(g), m, 6e-4f, 0.1f, cfg,
                       t, factor.p(g) + 1, 123.0f);
    ref.Step(gh, t, 0.7f);
  }
  ExpectBitwise(p2.Gpu(), p1.Gpu(), "device factor == the factor as a value (param)");
  ExpectBitwise(v2.Gpu(), v1.Gpu(), "device factor == the factor as a value (v)");
  ExpectAdamW(p2.Gpu(), ref.p, "device factor: GPU param vs adamw_update");
  ExpectBitwise(p2.Cpu(), ref.p, "device factor: CPU param vs adamw_update");
}

// The optimizer's one pass against the three-call sequence it fuses, computed on the host:
// widen the gradient to fp32, adamw_update, narrow the master to the stored dtype (RNE). For
// bf16 and fp32 gradients and storage (fp32: stored == master), the scale as a value and in
// device memory: the GPU's master, m, v as ExpectAdamW, the CPU twin's bitwise, and each stored
// copy is its own device's new master narrowed.
TEST_F(GpuTest, AdamWMixed) {
  const size_t n = 50021;
  AdamWConfig cfg;
  const auto g32 = RandomFloats(n, 96, -0.1f, 0.1f);
  std::vector<uint16_t> g16(n);
  FloatToBf16(g32.data(), g16.data(), n);
  std::vector<float> g16_wide(n);
  Bf16ToFloat(g16.data(), g16_wide.data(), n);
  auto grad32 = Make(g32, "grad f32");
  auto grad16 = Twin<uint16_t>(*gpu_, *cpu_, g16, "grad bf16");
  auto factor = Make(std::vector<float>{0.3f, 0.7f}, "factor");
  for (const DType gd : {DType::kF32, DType::kBF16})
    for (const DType sd : {DType::kF32, DType::kBF16})
      for (const bool dev_scale : {false, true}) {
        const std::string c = std::string(" grad ") + DTypeName(gd) + " stored " + DTypeName(sd) +
                              (dev_scale ? " device scale" : " host scale");
        HostAdamW ref{RandomFloats(n, 97), std::vector<float>(n), std::vector<float>(n)};
        auto mix = Make(ref.p, "master");
        auto m2 = Zeros(n, "m"), v2 = Zeros(n, "v");
        auto s16 = Twin<uint16_t>(*gpu_, *cpu_, n, "stored bf16");
        for (int64_t t = 1; t <= 2; t++) {
          ref.Step(gd == DType::kBF16 ? g16_wide : g32, t, 0.7f);
          for (bool g : {true, false}) {
            const void* gr = gd == DType::kBF16 ? static_cast<const void*>(grad16.p(g)) : grad32.p(g);
            void* st = sd == DType::kBF16 ? static_cast<void*>(s16.p(g)) : static_cast<void*>(mix.p(g));
            k(g).adamw_mixed(mix.p(g), st, sd, gr, gd, m2.p(g), v2.p(g), n, 6e-4f, 0.1f, cfg, t,
                             dev_scale ? factor.p(g) + 1 : nullptr, dev_scale ? 123.0f : 0.7f);
          }
        }
        ExpectAdamW(mix.Gpu(), ref.p, "GPU master vs adamw_update" + c);
        ExpectAdamW(m2.Gpu(), ref.m, "GPU m vs adamw_update" + c);
        ExpectAdamW(v2.Gpu(), ref.v, "GPU v vs adamw_update" + c);
        ExpectBitwise(mix.Cpu(), ref.p, "CPU master vs adamw_update" + c);
        ExpectBitwise(m2.Cpu(), ref.m, "CPU m vs adamw_update" + c);
        ExpectBitwise(v2.Cpu(), ref.v, "CPU v vs adamw_update" + c);
        if (sd == DType::kBF16) {
          for (bool g : {true, false}) {
            const auto master = g ? mix.Gpu() : mix.Cpu();
            std::vector<uint16_t> narrowed(n);
            FloatToBf16(master.data(), narrowed.data(), n);
            ExpectBitwise(g ? s16.Gpu() : s16.Cpu(), narrowed, std::string(g ? "GPU" : "CPU") + " stored == RNE(master)" + c);
          }
        }
      }
}

// CopyToDeviceAsync: the host buffer is overwritten after every call, and more copies are made
// than the staging ring has slots, so a slot still being copied would show up as wrong bytes.
TEST_F(GpuTest, AsyncUploadsThroughTheStagingRing) {
  const size_t n = 1000;
  const int copies = 20;
  DeviceBuffer dst(gpu_.get(), nullptr, MemKind::kActivations, copies * n * sizeof(int32_t), "destinations");
  std::vector<int32_t> host(n);
  for (int c = 0; c < copies; c++) {
    for (size_t i = 0; i < n; i++) host[i] = c * 100000 + (int32_t)i;
    gpu_->CopyToDeviceAsync(dst.as<int32_t>() + c * n, host.data(), n * sizeof(int32_t));
    std::fill(host.begin(), host.end(), -1);  // reused at once
  }
  std::vector<int32_t> back((size_t)copies * n);
  gpu_->CopyToHost(back.data(), dst.data(), back.size() * sizeof(int32_t));
  for (int c = 0; c < copies; c++)
    for (size_t i = 0; i < n; i++) ASSERT_EQ(back[c * n + i], c * 100000 + (int32_t)i) << "copy " << c << " [" << i << "]";
}

// ------------------------------------------------------------------------------------------------
// determinism: the same call on the same inputs twice gives the same bits

TEST_F(GpuTest, BackwardIsBitwiseReproducible) {
  Device& d = *gpu_;
  Kernels& kg = d.kernels();
  const int B = 2, T = 256, NH = 4, C = 256, V = 1000, Vp = 1024, N = B * T;
  auto upload = [&](const std::vector<float>& v, const char* what) {
    DeviceBuffer b(&d, nullptr, MemKind::kParams, v.size() * 4, what);
    d.CopyToDevice(b.data(), v.data(), v.size() * 4);
    return b;
  };
  auto read = [&](const DeviceBuffer& b) {
    std::vector<float> v(b.bytes() / 4);
    d.CopyToHost(v.data(), b.data(), b.bytes());
    return v;
  };
  auto qkv = upload(RandomFloats((size_t)N * 3 * C, 100), "qkv");
  auto x = upload(RandomFloats((size_t)N * C, 101), "x");
  auto dout = upload(RandomFloats((size_t)N * C, 102), "dout");
  auto w = upload(RandomFloats((size_t)C * C, 103), "w");
  auto lnw = upload(RandomFloats(C, 104), "lnw");
  auto logits0 = RandomFloats((size_t)N * Vp, 105, -3.0f, 3.0f);
  auto tok = RandomTokens(N, 20, 106);  // many repeats
  DeviceBuffer tokens(&d, nullptr, MemKind::kParams, N * 4, "tokens");
  d.CopyToDevice(tokens.data(), tok.data(), N * 4);
  DeviceBuffer out(&d, nullptr, MemKind::kParams, (size_t)N * C * 4, "out");
  DeviceBuffer lse(&d, nullptr, MemKind::kParams, (size_t)B * NH * T * 4, "lse");
  DeviceBuffer lnout(&d, nullptr, MemKind::kParams, (size_t)N * C * 4, "lnout");
  DeviceBuffer mean(&d, nullptr, MemKind::kParams, N * 4, "mean"), rstd(&d, nullptr, MemKind::kParams, N * 4, "rstd");
  kg.attention_forward(out.as<float>(), lse.as<float>(), qkv.as<float>(), B, T, C, NH);
  kg.layernorm_forward(lnout.as<float>(), mean.as<float>(), rstd.as<float>(), x.as<float>(), lnw.as<float>(),
                       lnw.as<float>(), N, C);

  std::vector<std::vector<float>> runs[2];
  double loss[2];
  for (int run = 0; run < 2; run++) {
    DeviceBuffer dqkv(&d, nullptr, MemKind::kGrads, (size_t)N * 3 * C * 4, "dqkv");
    DeviceBuffer dx(&d, nullptr, MemKind::kGrads, (size_t)N * C * 4, "dx");
    DeviceBuffer dw(&d, nullptr, MemKind::kGrads, (size_t)C * C * 4, "dw");
    DeviceBuffer db(&d, nullptr, MemKind::kGrads, C * 4, "db");
    DeviceBuffer dlnw(&d, nullptr, MemKind::kGrads, C * 4, "dlnw"), dlnb(&d, nullptr, MemKind::kGrads, C * 4, "dlnb");
    DeviceBuffer dwte(&d, nullptr, MemKind::kGrads, (size_t)20 * C * 4, "dwte");
    DeviceBuffer dwpe(&d, nullptr, MemKind::kGrads, (size_t)T * C * 4, "dwpe");
    DeviceBuffer logits = upload(logits0, "logits");
    DeviceBuffer losses(&d, nullptr, MemKind::kParams, N * 4, "losses");
    kg.attention_backward(dqkv.as<float>(), dout.as<float>(), qkv.as<float>(), out.as<float>(), lse.as<float>(), B,
                          T, C, NH);
    kg.layernorm_backward(dx.as<float>(), dlnw.as<float>(), dlnb.as<float>(), dout.as<float>(), x.as<float>(),
                          lnw.as<float>(), mean.as<float>(), rstd.as<float>(), N, C);
    for (MatmulPrecision p : {MatmulPrecision::kExact, MatmulPrecision::kBf16}) {
      kg.set_matmul_precision(p);
      kg.matmul_backward(dx.as<float>(), dw.as<float>(), db.as<float>(), dout.as<float>(), x.as<float>(),
                         w.as<float>(), N, C, C);
    }
    kg.set_matmul_precision(MatmulPrecision::kExact);
    kg.encoder_backward(dwte.as<float>(), dwpe.as<float>(), dout.as<float>(), tokens.as<int32_t>(), B, T, C);
    loss[run] = kg.crossentropy_softmax(logits.as<float>(), losses.as<float>(), tokens.as<int32_t>(), N, V, Vp,
                                        1.0f / N);
    for (const DeviceBuffer* b : {&dqkv, &dx, &dw, &db, &dlnw, &dlnb, &dwte, &dwpe, &logits})
      runs[run].push_back(read(*b));
  }
  const char* names[] = {"dqkv", "dx", "dw", "dbias", "dlnw", "dlnb", "dwte", "dwpe", "dlogits"};
  for (size_t i = 0; i < runs[0].size(); i++) ExpectBitwise(runs[0][i], runs[1][i], names[i]);
  EXPECT_EQ(loss[0], loss[1]);
}

}  // namespace
}  // namespace shardgpt
