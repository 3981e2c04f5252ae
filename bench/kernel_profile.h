// Benchmark helper (bench only): a Device that forwards everything to another device and times
// each kernel call of its kernel set, to show where a training step's time goes
// (bench_train --profile). Time is host wall time around each call, which on the CPU device
// (synchronous kernels) is the kernel's time. FLOPs are the model's counts (matmul 2*N*C*OC
// forward, twice that backward, or once without dinp; attention 2*B*T*T*C forward counted as
// in 6LCT per token, twice that backward), so GFLOP/s per kernel compares with bench_train's
// model GFLOP/s.
//
// Thread contract: one training thread, as Device.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/device.h"

namespace shardgpt {

class ProfilingKernels final : public Kernels {
 public:
  struct Entry {
    double seconds = 0, flops = 0;
    long calls = 0;
  };
  explicit ProfilingKernels(Kernels& inner) : k_(inner) {}
  void Reset() { table_.clear(); }
  const std::map<std::string, Entry>& table() const { return table_; }

  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C) const override {
    Time("encoder_forward", 0, [&] { k_.encoder_forward(out, tokens, wte, wpe, B, T, C); });
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                        int C) const override {
    Time("encoder_backward", 0, [&] { k_.encoder_backward(dwte, dwpe, dout, tokens, B, T, C); });
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                         int N, int C) const override {
    Time("layernorm_forward", 0, [&] { k_.layernorm_forward(out, mean, rstd, inp, w, b, N, C); });
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                          const float* mean, const float* rstd, int N, int C) const override {
    Time("layernorm_backward", 0, [&] { k_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C); });
  }
  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C,
                      int OC) const override {
    Time("matmul_forward", 2.0 * N * C * OC, [&] { k_.matmul_forward(out, inp, w, bias, N, C, OC); });
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                       int N, int C, int OC) const override {
    Time("matmul_backward", (dinp ? 4.0 : 2.0) * N * C * OC,
         [&] { k_.matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC); });
  }
  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) const override {
    Time("attention_forward", 2.0 * B * T * T * C, [&] { k_.attention_forward(out, lse, qkv, B, T, C, NH); });
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                          int B, int T, int C, int NH) const override {
    Time("attention_backward", 4.0 * B * T * T * C,
         [&] { k_.attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH); });
  }
  void gelu_forward(float* out, const float* inp, size_t n) const override {
    Time("gelu_forward", 0, [&] { k_.gelu_forward(out, inp, n); });
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) const override {
    Time("gelu_backward", 0, [&] { k_.gelu_backward(dinp, inp, dout, n); });
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) const override {
    Time("residual_forward", 0, [&] { k_.residual_forward(out, a, b, n); });
  }
  double crossentropy_softmax(float* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                              float dloss_scale) const override {
    double r = 0;
    Time("crossentropy_softmax", 0, [&] { r = k_.crossentropy_softmax(logits, losses, targets, N, V, Vp, dloss_scale); });
    return r;
  }
  void convert(const void* src, DType from, void* dst, DType to, size_t n) const override {
    Time("convert (engine)", 0, [&] { k_.convert(src, from, dst, to, n); });
  }
  void accumulate(void* dst, DType dtype, const void* src, DType src_dtype, size_t n) const override {
    Time("accumulate (engine)", 0, [&] { k_.accumulate(dst, dtype, src, src_dtype, n); });
  }
  double sum_squares(const void* x, DType dtype, size_t n) const override {
    double r = 0;
    Time("sum_squares (engine)", 0, [&] { r = k_.sum_squares(x, dtype, n); });
    return r;
  }
  void adamw(float* param, const float* grad, float* m, float* v, size_t n, float lr, float weight_decay,
             const AdamWConfig& cfg, int64_t t, float grad_scale) const override {
    Time("adamw (engine)", 0, [&] { k_.adamw(param, grad, m, v, n, lr, weight_decay, cfg, t, grad_scale); });
  }
  void crossentropy_softmax_acc(float* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                                float dloss_scale, double* loss_acc) const override {
    Time("crossentropy_softmax", 0,
         [&] { k_.crossentropy_softmax_acc(logits, losses, targets, N, V, Vp, dloss_scale, loss_acc); });
  }
  void sum_squares_to(double* dst, const void* x, DType dtype, size_t n) const override {
    Time("sum_squares (engine)", 0, [&] { k_.sum_squares_to(dst, x, dtype, n); });
  }
  void sum_f64(double* dst, const double* src, size_t n, double divisor) const override {
    Time("sum_f64 (engine)", 0, [&] { k_.sum_f64(dst, src, n, divisor); });
  }
  void clip_factor(float* out, const double* ss, float grad_clip) const override {
    Time("clip_factor (engine)", 0, [&] { k_.clip_factor(out, ss, grad_clip); });
  }
  void adamw_dev(float* param, const float* grad, float* m, float* v, size_t n, float lr, float weight_decay,
                 const AdamWConfig& cfg, int64_t t, const float* grad_scale) const override {
    Time("adamw (engine)", 0, [&] { k_.adamw_dev(param, grad, m, v, n, lr, weight_decay, cfg, t, grad_scale); });
  }

 private:
  template <class F>
  void Time(const char* name, double flops, F f) const {
    k_.set_matmul_precision(matmul_precision());
    const auto t0 = std::chrono::steady_clock::now();
    f();
    Entry& e = table_[name];
    e.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    e.flops += flops;
    e.calls++;
  }
  Kernels& k_;
  mutable std::map<std::string, Entry> table_;
};

// Forwards every Device call to `inner`; kernels() is the profiling wrapper.
class ProfilingDevice final : public Device {
 public:
  explicit ProfilingDevice(Device& inner) : d_(inner), k_(inner.kernels()) {}
  ProfilingKernels& profile() { return k_; }
  std::string name() const override { return d_.name(); }
  bool is_cuda() const override { return d_.is_cuda(); }
  bool host_accessible() const override { return d_.host_accessible(); }
  void* Allocate(size_t bytes, const std::string& what) override { return d_.Allocate(bytes, what); }
  void Free(void* p) override { d_.Free(p); }
  uint64_t free_bytes() const override { return d_.free_bytes(); }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override { d_.CopyToDevice(dst, src, bytes); }
  void CopyToHost(void* dst, const void* src, size_t bytes) override { d_.CopyToHost(dst, src, bytes); }
  void Copy(void* dst, const void* src, size_t bytes) override { d_.Copy(dst, src, bytes); }
  void Zero(void* p, size_t bytes) override { d_.Zero(p, bytes); }
  void Synchronize() override { d_.Synchronize(); }
  std::shared_ptr<DeviceEvent> RecordEvent() override { return d_.RecordEvent(); }
  void* AllocateHost(size_t bytes) override { return d_.AllocateHost(bytes); }
  void FreeHost(void* p) override { d_.FreeHost(p); }
  void StageToHost(void* dst, const void* src, size_t bytes) override { d_.StageToHost(dst, src, bytes); }
  void StageToDevice(void* dst, const void* src, size_t bytes) override { d_.StageToDevice(dst, src, bytes); }
  Kernels& kernels() override { return k_; }

 private:
  Device& d_;
  ProfilingKernels k_;
};

// Prints the table: per kernel, ms per step, share of the step, GFLOP/s where FLOPs are counted.
inline void PrintProfile(const ProfilingKernels& p, int steps, double step_seconds) {
  std::vector<std::pair<std::string, ProfilingKernels::Entry>> rows(p.table().begin(), p.table().end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double total = 0;
  for (const auto& r : rows) total += r.second.seconds;
  std::printf("  %-22s %10s %8s %8s %10s\n", "kernel", "ms/step", "step %", "calls", "GFLOP/s");
  for (const auto& [name, e] : rows) {
    std::printf("  %-22s %10.2f %7.1f%% %8ld", name.c_str(), 1e3 * e.seconds / steps,
                100 * e.seconds / steps / step_seconds, e.calls / steps);
    if (e.flops > 0) std::printf(" %10.1f", e.flops / e.seconds / 1e9);
    std::printf("\n");
  }
  std::printf("  %-22s %10.2f %7.1f%%  (the rest: engine bookkeeping, copies, communication)\n", "all kernels",
              1e3 * total / steps, 100 * total / steps / step_seconds);
}

}  // namespace shardgpt
