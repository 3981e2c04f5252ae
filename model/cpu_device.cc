// The CPU device: host memory (calloc) and the OpenBLAS/OpenMP kernels of model/kernels_cpu.h;
// at MatmulPrecision::kBf16 the matmuls and attention run the bf16 kernels of
// model/kernels_cpu_bf16.h instead. Copies are memcpy and events are complete at once: the CPU
// computes synchronously.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "model/device.h"
#include "model/kernels_cpu.h"
#include "model/kernels_cpu_bf16.h"

namespace shardgpt {

namespace {

// Forwards every kernel to its free function in model/kernels_cpu.h, or, for the matmuls and
// attention at MatmulPrecision::kBf16, in model/kernels_cpu_bf16.h.
class CpuKernels final : public Kernels {
 public:
  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C) const override {
    shardgpt::encoder_forward(out, tokens, wte, wpe, B, T, C);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                        int C) const override {
    shardgpt::encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                         int N, int C) const override {
    shardgpt::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                          const float* mean, const float* rstd, int N, int C) const override {
    shardgpt::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C,
                      int OC) const override {
    if (bf16()) return shardgpt::matmul_forward_bf16(out, inp, w, bias, N, C, OC, &weights_);
    shardgpt::matmul_forward(out, inp, w, bias, N, C, OC);
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                       int N, int C, int OC) const override {
    if (bf16()) return shardgpt::matmul_backward_bf16(dinp, dw, dbias, dout, inp, w, N, C, OC, &weights_);
    shardgpt::matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
  }
  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) const override {
    if (bf16()) return shardgpt::attention_forward_bf16(out, lse, qkv, B, T, C, NH);
    shardgpt::attention_forward(out, lse, qkv, B, T, C, NH);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                          int B, int T, int C, int NH) const override {
    if (bf16()) return shardgpt::attention_backward_bf16(dqkv, dout, qkv, out, lse, B, T, C, NH);
    shardgpt::attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH);
  }
  void gelu_forward(float* out, const float* inp, size_t n) const override { shardgpt::gelu_forward(out, inp, n); }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) const override {
    shardgpt::gelu_backward(dinp, inp, dout, n);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) const override {
    shardgpt::residual_forward(out, a, b, n);
  }
  void residual_layernorm_forward(float* res_out, float* ln_out, float* mean, float* rstd, const float* a,
                                  const float* b, const float* w, const float* bias, int N, int C) const override {
    shardgpt::residual_layernorm_forward(res_out, ln_out, mean, rstd, a, b, w, bias, N, C);
  }
  double crossentropy_softmax(float* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                              float dloss_scale) const override {
    return shardgpt::crossentropy_softmax(logits, losses, targets, N, V, Vp, dloss_scale);
  }
  void crossentropy_softmax_acc(float* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                                float dloss_scale, double* loss_acc) const override {
    shardgpt::crossentropy_softmax(logits, losses, targets, N, V, Vp, dloss_scale);
    shardgpt::add_mean_loss(loss_acc, losses, N);
  }
  void convert(const void* src, DType from, void* dst, DType to, size_t n) const override {
    shardgpt::convert(src, from, dst, to, n);
  }
  void accumulate(void* dst, DType dtype, const void* src, DType src_dtype, size_t n) const override {
    shardgpt::accumulate(dst, dtype, src, src_dtype, n);
  }
  double sum_squares(const void* x, DType dtype, size_t n) const override {
    return shardgpt::sum_squares(x, dtype, n);
  }
  void sum_squares_to(double* dst, const void* x, DType dtype, size_t n) const override {
    *dst = shardgpt::sum_squares(x, dtype, n);
  }
  void sum_f64(double* dst, const double* src, size_t n, double divisor) const override {
    shardgpt::sum_f64(dst, src, n, divisor);
  }
  void clip_factor(float* out, const double* ss, float grad_clip) const override {
    shardgpt::clip_factor(out, ss, grad_clip);
  }
  void begin_weight_reuse() override { weights_.Begin(); }
  void end_weight_reuse() override { weights_.End(); }
  void adamw_mixed(float* master, void* stored, DType stored_dtype, const void* grad, DType grad_dtype, float* m,
                   float* v, size_t n, float lr, float weight_decay, const AdamWConfig& cfg, int64_t t,
                   const float* grad_scale_dev, float grad_scale) const override {
    shardgpt::adamw_mixed(master, stored, stored_dtype, grad, grad_dtype, m, v, n, lr, weight_decay, cfg, t,
                          grad_scale_dev ? *grad_scale_dev : grad_scale);
  }

 private:
  bool bf16() const { return precision_ == MatmulPrecision::kBf16; }
  // The bf16 weight copies of the current reuse window (mutable: the kernels are const calls;
  // the training thread only, as every kernel).
  mutable Bf16WeightCache weights_;
};

class DoneEvent final : public DeviceEvent {
 public:
  void Synchronize() override {}
};

// With pretend_device_memory, the device also checks that every pointer it is given as device
// memory lies inside one of its allocations (as a GPU would fault on a host pointer), so tests
// of the device-memory paths fail loudly when host memory reaches them.
class CpuDeviceImpl final : public Device {
 public:
  explicit CpuDeviceImpl(bool pretend_device_memory) : pretend_(pretend_device_memory) {}
  std::string name() const override { return pretend_ ? "cpu (as device memory)" : "cpu"; }
  bool is_cuda() const override { return false; }
  bool host_accessible() const override { return !pretend_; }
  void* Allocate(size_t bytes, const std::string& what) override {
    if (bytes == 0) return nullptr;
    void* p = std::calloc(bytes, 1);
    if (p == nullptr)
      throw DeviceOutOfMemory("out of host memory allocating " + what + " (" + std::to_string(bytes) +
                              " bytes); try a higher --zero-stage or a smaller --micro-batch");
    if (pretend_) {
      std::lock_guard<std::mutex> lock(mu_);
      allocations_[reinterpret_cast<uintptr_t>(p)] = bytes;
    }
    return p;
  }
  void Free(void* p) override {
    if (pretend_ && p != nullptr) {
      std::lock_guard<std::mutex> lock(mu_);
      allocations_.erase(reinterpret_cast<uintptr_t>(p));
    }
    std::free(p);
  }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override { Move(Dev(dst, bytes, "CopyToDevice"), src, bytes); }
  void CopyToHost(void* dst, const void* src, size_t bytes) override { Move(dst, Dev(src, bytes, "CopyToHost"), bytes); }
  void Copy(void* dst, const void* src, size_t bytes) override {
    Move(Dev(dst, bytes, "Copy"), Dev(src, bytes, "Copy"), bytes);
  }
  void Zero(void* p, size_t bytes) override {
    if (bytes) std::memset(Dev(p, bytes, "Zero"), 0, bytes);
  }
  void Synchronize() override {}
  std::shared_ptr<DeviceEvent> RecordEvent() override { return std::make_shared<DoneEvent>(); }
  void* AllocateHost(size_t bytes) override { return std::malloc(bytes > 0 ? bytes : 1); }
  void FreeHost(void* p) override { std::free(p); }
  void StageToHost(void* dst, const void* src, size_t bytes) override { Move(dst, Dev(src, bytes, "StageToHost"), bytes); }
  void StageToDevice(void* dst, const void* src, size_t bytes) override { Move(Dev(dst, bytes, "StageToDevice"), src, bytes); }
  Kernels& kernels() override { return kernels_; }

 private:
  static void Move(void* dst, const void* src, size_t bytes) {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }
  // p, checked to be device memory when pretending.
  template <typename P>
  P Dev(P p, size_t bytes, const char* call) {
    if (!pretend_ || bytes == 0) return p;
    const auto a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocations_.upper_bound(a);
    if (it == allocations_.begin() || a + bytes > std::prev(it)->first + std::prev(it)->second) {
      std::fprintf(stderr, "shardgpt: internal error: Device::%s given %zu bytes at %p, which is not device memory\n",
                   call, bytes, static_cast<const void*>(p));
      std::abort();
    }
    return p;
  }
  const bool pretend_;
  CpuKernels kernels_;
  std::mutex mu_;
  std::map<uintptr_t, size_t> allocations_;  // pretend_ only: start -> bytes
};

}  // namespace

Device& CpuDevice() {
  static CpuDeviceImpl device(false);
  return device;
}

std::unique_ptr<Device> NewCpuDevice(bool pretend_device_memory) {
  return std::make_unique<CpuDeviceImpl>(pretend_device_memory);
}

}  // namespace shardgpt
