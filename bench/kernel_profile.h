// Benchmark helper (bench only): a Device that forwards everything to another device and times
// each call of its kernel set, to show where a training step's time goes (bench_train
// --profile), and counts each call's FLOPs and bytes (what a roofline predicts, bench_train
// --roofline).
//
// Time. On the CPU device (synchronous kernels) host wall time around each call is the
// kernel's time. On a CUDA device a KernelTimer (bench/cuda_event_timer.h) records a CUDA event
// pair on the compute stream around each call, read back after the step (Collect): the GPU's
// time between the two events, so a launch-bound kernel shows the host's launch gap too. A call
// is one Kernels method: matmul_backward, for one, is several cuBLASLt calls.
//
// FLOPs: the model's counts: matmul 2*N*C*OC forward; backward 2*N*C*OC for each of dinp and
// dw it computes (the tied LM head computes dinp at the start of backward and dw at its end);
// causal attention 2*B*T*T*C forward (QK^T and PV over the lower triangle), twice that backward,
// as in 6LCT per token. Everything else counts 0 FLOPs (element-wise: bound by bytes).
// Bytes: the least traffic a kernel can have: each tensor it reads read once, each it writes
// written once (an accumulated gradient read and written), at the activation dtype's size
// (activation_dtype(), forwarded to the inner kernel set with the matmul precision: 4 or 2) per
// element for activations and their gradients, 4 for weights and their gradients (fp32 at
// every activation dtype) and for LayerNorm statistics, log-sum-exps, losses and token ids, the
// dtype's size for the engine's kernels, fp32 for AdamW's state. No T x T tensor is counted
// (flash-style attention keeps none).
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
#include "model/forwarding_device.h"

namespace shardgpt {

// Times device work between two points of the compute stream (CUDA events); see the header.
class KernelTimer {
 public:
  virtual ~KernelTimer() = default;
  // Marks the compute stream now; returns a handle valid until Collect's next call.
  virtual int Mark() = 0;
  // Waits for the marks so far; returns the ms between each pair (a, b) of marks, in order,
  // and forgets every mark.
  virtual std::vector<double> Collect(const std::vector<std::pair<int, int>>& pairs) = 0;
};

// Peaks a roofline compares with: dense FLOP/s and memory bytes/s.
struct Peaks {
  double flops = 0, bytes_per_s = 0;
  // The roofline's time for work of `flops` and `bytes`: the slower of the two limits.
  double Seconds(double f, double b) const {
    return std::max(flops > 0 ? f / flops : 0.0, bytes_per_s > 0 ? b / bytes_per_s : 0.0);
  }
};

class ProfilingKernels final : public Kernels {
 public:
  struct Entry {
    double seconds = 0, flops = 0, bytes = 0;
    double predicted_s = 0;  // the roofline's time at Peaks (per call: the slower limit)
    long calls = 0;
  };
  explicit ProfilingKernels(Kernels& inner) : k_(inner) {}
  void Reset() { table_.clear(), pending_.clear(); }
  const std::map<std::string, Entry>& table() const { return table_; }
  // Times with device events instead of host wall time (a CUDA device); not owned.
  void set_timer(KernelTimer* t) { timer_ = t; }
  void set_peaks(const Peaks& p) { peaks_ = p; }
  // With a timer: reads the step's event pairs into the table (after the step's work was queued).
  void Collect() {
    if (!timer_ || pending_.empty()) return;
    std::vector<std::pair<int, int>> pairs;
    for (const Pending& p : pending_) pairs.emplace_back(p.start, p.end);
    const std::vector<double> ms = timer_->Collect(pairs);
    for (size_t i = 0; i < pending_.size(); i++) table_[pending_[i].name].seconds += ms[i] / 1e3;
    pending_.clear();
  }

  // ---- model: out = wte[token] + wpe[t]; backward scatters dout into dwte rows, dwpe ----
  void encoder_forward(void* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C) const override {
    const double btc = double(B) * T * C;
    Time("encoder_forward", 0, 4.0 * B * T + A() * btc + 4.0 * (btc + double(T) * C),
         [&] { k_.encoder_forward(out, tokens, wte, wpe, B, T, C); });
  }
  void encoder_backward(float* dwte, float* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                        int C) const override {
    const double btc = double(B) * T * C;
    Time("encoder_backward", 0, 4.0 * B * T + A() * btc + 4.0 * (2 * btc + 3.0 * T * C),
         [&] { k_.encoder_backward(dwte, dwpe, dout, tokens, B, T, C); });
  }
  // ---- out = (inp - mean) * rstd * w + b; backward accumulates dinp, dw, db ----
  void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const float* w, const float* b,
                         int N, int C) const override {
    Time("layernorm_forward", 0, A() * 2.0 * N * C + 4.0 * 2.0 * C + 8.0 * N,
         [&] { k_.layernorm_forward(out, mean, rstd, inp, w, b, N, C); });
  }
  void layernorm_backward(void* dinp, float* dw, float* db, const void* dout, const void* inp, const float* w,
                          const float* mean, const float* rstd, int N, int C) const override {
    Time("layernorm_backward", 0, A() * 4.0 * N * C + 4.0 * 5.0 * C + 8.0 * N,
         [&] { k_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C); });
  }
  // ---- out[N,OC] = inp[N,C] w[OC,C]^T + bias ----
  void matmul_forward(void* out, const void* inp, const float* w, const float* bias, int N, int C,
                      int OC) const override {
    Time("matmul_forward", 2.0 * N * C * OC, A() * (double(N) * C + double(N) * OC) + 4.0 * (double(OC) * C + OC),
         [&] { k_.matmul_forward(out, inp, w, bias, N, C, OC); });
  }
  void matmul_backward(void* dinp, float* dw, float* dbias, const void* dout, const void* inp, const float* w,
                       int N, int C, int OC) const override {
    const double nc = double(N) * C, woc = double(OC) * C, noc = double(N) * OC;
    double bytes = 0;  // activations at A(), weights and their gradients fp32
    if (dinp) bytes += A() * (noc + 2 * nc) + 4.0 * woc;  // read dout, w; dinp +=
    if (dw) bytes += A() * (noc + nc) + 4.0 * 2 * woc;    // read dout, inp; dw +=
    if (dbias) bytes += A() * noc + 4.0 * 2 * OC;
    Time("matmul_backward", 2.0 * nc * OC * ((dinp ? 1 : 0) + (dw ? 1 : 0)), bytes,
         [&] { k_.matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC); });
  }
  // ---- the fc matmul with its GELU: out and pre written; backward writes dinp, reads pre ----
  void matmul_gelu_forward(void* out, void* pre, const void* inp, const float* w, const float* bias, int N, int C,
                           int OC) const override {
    Time("matmul_gelu_forward", 2.0 * N * C * OC,
         A() * (double(N) * C + 2.0 * N * OC) + 4.0 * (double(OC) * C + OC),
         [&] { k_.matmul_gelu_forward(out, pre, inp, w, bias, N, C, OC); });
  }
  void matmul_dgelu_backward(void* dinp, float* dw, float* dbias, const void* dout, const void* inp, const void* pre,
                             const float* w, int N, int C, int OC) const override {
    const double nc = double(N) * C, woc = double(OC) * C, noc = double(N) * OC;
    double bytes = A() * (noc + 2 * nc) + 4.0 * woc;   // read dout, pre, w; dinp written
    if (dw) bytes += A() * (noc + nc) + 4.0 * 2 * woc;  // read dout, inp; dw +=
    if (dbias) bytes += A() * noc + 4.0 * 2 * OC;
    Time("matmul_dgelu_backward", 2.0 * nc * OC * (1 + (dw ? 1 : 0)), bytes,
         [&] { k_.matmul_dgelu_backward(dinp, dw, dbias, dout, inp, pre, w, N, C, OC); });
  }
  // ---- causal softmax(QK^T / sqrt(hs)) V per head; lse per row for the backward ----
  void attention_forward(void* out, float* lse, const void* qkv, int B, int T, int C, int NH) const override {
    const double btc = double(B) * T * C;
    Time("attention_forward", 2.0 * B * T * double(T) * C, A() * 4 * btc + 4.0 * B * NH * T,
         [&] { k_.attention_forward(out, lse, qkv, B, T, C, NH); });
  }
  void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                          int B, int T, int C, int NH) const override {
    const double btc = double(B) * T * C;
    Time("attention_backward", 4.0 * B * T * double(T) * C, A() * 8 * btc + 4.0 * B * NH * T,
         [&] { k_.attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH); });
  }
  // ---- element-wise ----
  void gelu_forward(void* out, const void* inp, size_t n) const override {
    Time("gelu_forward", 0, A() * 2.0 * n, [&] { k_.gelu_forward(out, inp, n); });
  }
  void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) const override {
    Time("gelu_backward", 0, A() * 3.0 * n, [&] { k_.gelu_backward(dinp, inp, dout, n); });
  }
  void residual_forward(void* out, const void* a, const void* b, size_t n) const override {
    Time("residual_forward", 0, A() * 3.0 * n, [&] { k_.residual_forward(out, a, b, n); });
  }
  // reads a, b and the LayerNorm's w, bias; writes res and ln, and mean, rstd (fp32): the
  // residual stream is not read a second time (unfused: residual 3NC + layernorm 2NC)
  void residual_layernorm_forward(void* res_out, void* ln_out, float* mean, float* rstd, const void* a,
                                  const void* b, const float* w, const float* bias, int N, int C) const override {
    Time("residual_layernorm_forward", 0, A() * 4.0 * N * C + 4.0 * 2.0 * C + 8.0 * N,
         [&] { k_.residual_layernorm_forward(res_out, ln_out, mean, rstd, a, b, w, bias, N, C); });
  }
  // ---- softmax + cross-entropy over the logits, dlogits written in place ----
  double crossentropy_softmax(void* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                              float dloss_scale) const override {
    double r = 0;
    Time("crossentropy_softmax", 0, A() * 2.0 * N * Vp + 8.0 * N,
         [&] { r = k_.crossentropy_softmax(logits, losses, targets, N, V, Vp, dloss_scale); });
    return r;
  }
  // ---- the Llama block (model/kernels_cpu_llama.h; W = (NH + 2 KV) hs, F the SwiGLU width) ----
  void rmsnorm_forward(void* out, float* rstd, const void* inp, const float* w, int N, int C,
                       float eps) const override {
    Time("rmsnorm_forward", 0, A() * 2.0 * N * C + 4.0 * C + 4.0 * N,
         [&] { k_.rmsnorm_forward(out, rstd, inp, w, N, C, eps); });
  }
  void rmsnorm_backward(void* dinp, float* dw, const void* dout, const void* inp, const float* w,
                        const float* rstd, int N, int C) const override {
    Time("rmsnorm_backward", 0, A() * 4.0 * N * C + 4.0 * 3.0 * C + 4.0 * N,
         [&] { k_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C); });
  }
  // in place on the q and k heads: read and written
  void rope_forward(void* qkv, int B, int T, int NH, int KV, int hs, float theta) const override {
    Time("rope_forward", 0, A() * 2.0 * B * T * double(NH + KV) * hs,
         [&] { k_.rope_forward(qkv, B, T, NH, KV, hs, theta); });
  }
  void rope_backward(void* dqkv, int B, int T, int NH, int KV, int hs, float theta) const override {
    Time("rope_backward", 0, A() * 2.0 * B * T * double(NH + KV) * hs,
         [&] { k_.rope_backward(dqkv, B, T, NH, KV, hs, theta); });
  }
  void swiglu_forward(void* out, const void* gate_up, int N, int F) const override {
    Time("swiglu_forward", 0, A() * 3.0 * N * F, [&] { k_.swiglu_forward(out, gate_up, N, F); });
  }
  void swiglu_backward(void* dgate_up, const void* gate_up, const void* dout, int N, int F) const override {
    Time("swiglu_backward", 0, A() * 7.0 * N * F, [&] { k_.swiglu_backward(dgate_up, gate_up, dout, N, F); });
  }
  // reads the W-wide rows, writes the 3C-wide [q | k | v] rows attention reads
  void kv_repeat_forward(void* out, const void* qkv, int N, int NH, int KV, int hs) const override {
    Time("kv_repeat_forward", 0, A() * double(N) * hs * (NH + 2 * KV + 3 * NH),
         [&] { k_.kv_repeat_forward(out, qkv, N, NH, KV, hs); });
  }
  void kv_repeat_backward(void* dqkv, const void* dout, int N, int NH, int KV, int hs) const override {
    Time("kv_repeat_backward", 0, A() * double(N) * hs * (3 * NH + 2 * (NH + 2 * KV)),
         [&] { k_.kv_repeat_backward(dqkv, dout, N, NH, KV, hs); });
  }
  bool has_llama_kernels() const override { return k_.has_llama_kernels(); }
  // ---- engine ----
  void begin_weight_reuse() override { k_.begin_weight_reuse(); }
  void end_weight_reuse() override { k_.end_weight_reuse(); }
  void note_bf16_source(const float* widened, const void* bf16, size_t n) override {
    k_.note_bf16_source(widened, bf16, n);
  }
  void convert(const void* src, DType from, void* dst, DType to, size_t n) const override {
    Time("convert (engine)", 0, double(n) * (DTypeSize(from) + DTypeSize(to)),
         [&] { k_.convert(src, from, dst, to, n); });
  }
  void accumulate(void* dst, DType dtype, const void* src, DType src_dtype, size_t n) const override {
    Time("accumulate (engine)", 0, double(n) * (2 * DTypeSize(dtype) + DTypeSize(src_dtype)),
         [&] { k_.accumulate(dst, dtype, src, src_dtype, n); });
  }
  double sum_squares(const void* x, DType dtype, size_t n) const override {
    double r = 0;
    Time("sum_squares (engine)", 0, double(n) * DTypeSize(dtype), [&] { r = k_.sum_squares(x, dtype, n); });
    return r;
  }
  void crossentropy_softmax_acc(void* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                                float dloss_scale, double* loss_acc) const override {
    Time("crossentropy_softmax", 0, A() * 2.0 * N * Vp + 8.0 * N,
         [&] { k_.crossentropy_softmax_acc(logits, losses, targets, N, V, Vp, dloss_scale, loss_acc); });
  }
  void sum_squares_to(double* dst, const void* x, DType dtype, size_t n) const override {
    Time("sum_squares (engine)", 0, double(n) * DTypeSize(dtype), [&] { k_.sum_squares_to(dst, x, dtype, n); });
  }
  void sum_f64(double* dst, const double* src, size_t n, double divisor) const override {
    Time("sum_f64 (engine)", 0, 8.0 * n, [&] { k_.sum_f64(dst, src, n, divisor); });
  }
  void clip_factor(float* out, const double* ss, float grad_clip) const override {
    Time("clip_factor (engine)", 0, 16.0, [&] { k_.clip_factor(out, ss, grad_clip); });
  }
  // bytes: read master, m, v (fp32) and grad; write master, m, v and stored (nothing more when
  // stored is the master)
  void adamw_mixed(float* master, void* stored, DType stored_dtype, const void* grad, DType grad_dtype, float* m,
                   float* v, size_t n, float lr, float weight_decay, const AdamWConfig& cfg, int64_t t,
                   const float* grad_scale_dev, float grad_scale) const override {
    const double stored_bytes = stored == master ? 0.0 : DTypeSize(stored_dtype);
    Time("adamw (engine)", 0, double(n) * (4.0 * 6 + DTypeSize(grad_dtype) + stored_bytes), [&] {
      k_.adamw_mixed(master, stored, stored_dtype, grad, grad_dtype, m, v, n, lr, weight_decay, cfg, t,
                     grad_scale_dev, grad_scale);
    });
  }

 private:
  struct Pending {
    const char* name;
    int start, end;
  };
  template <class F>
  void Time(const char* name, double flops, double bytes, F f) const {
    k_.set_matmul_precision(matmul_precision());
    k_.set_activation_dtype(activation_dtype());
    Entry& e = table_[name];
    e.flops += flops;
    e.bytes += bytes;
    e.predicted_s += peaks_.Seconds(flops, bytes);
    e.calls++;
    if (timer_) {
      const int start = timer_->Mark();
      f();
      pending_.push_back(Pending{name, start, timer_->Mark()});
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    f();
    e.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  double A() const { return double(DTypeSize(activation_dtype())); }  // bytes per activation element
  Kernels& k_;
  KernelTimer* timer_ = nullptr;
  Peaks peaks_;
  mutable std::map<std::string, Entry> table_;
  mutable std::vector<Pending> pending_;
};

// Forwards every Device call to `inner`; kernels() is the profiling wrapper.
class ProfilingDevice final : public ForwardingDevice {
 public:
  explicit ProfilingDevice(Device& inner) : ForwardingDevice(inner), k_(inner.kernels()) {}
  ProfilingKernels& profile() { return k_; }
  Kernels& kernels() override { return k_; }

 private:
  ProfilingKernels k_;
};

// Prints the table: per kernel (slowest first), ms per step, share of the step, calls, GFLOP
// and MB per step, achieved TFLOP/s (FLOP-counted kernels) or GB/s (the others) and that as a
// share of the peak given (0: not printed), and the roofline's ms per step at those peaks.
// The last row sums the columns; its FLOPs are what a test compares with 6 * tokens * (matmul
// weights) + 6 * L * B * T^2 * C (tests/e2e_gpu/kernel_profile.sh).
inline void PrintProfile(const ProfilingKernels& p, int steps, double step_seconds, const Peaks& peaks = Peaks()) {
  std::vector<std::pair<std::string, ProfilingKernels::Entry>> rows(p.table().begin(), p.table().end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.second.seconds != b.second.seconds ? a.second.seconds > b.second.seconds
                                                : a.second.predicted_s > b.second.predicted_s;
  });
  ProfilingKernels::Entry total;
  for (const auto& r : rows) {
    total.seconds += r.second.seconds, total.flops += r.second.flops, total.bytes += r.second.bytes;
    total.predicted_s += r.second.predicted_s, total.calls += r.second.calls;
  }
  rows.emplace_back("all kernels", total);
  std::printf("  %-26s %10s %7s %6s %12s %12s %10s %10s %7s %12s\n", "kernel", "ms/step", "step%", "calls",
              "GFLOP/step", "MB/step", "TFLOP/s", "GB/s", "%peak", "roofline_ms");
  for (const auto& [name, e] : rows) {
    const double s = e.seconds / steps;
    const double tf = s > 0 ? e.flops / steps / s / 1e12 : 0, gbs = s > 0 ? e.bytes / steps / s / 1e9 : 0;
    // the share of the peak that binds this kernel: FLOPs where counted, else bytes
    double share = -1;
    if (s > 0 && e.flops > 0 && peaks.flops > 0) share = 100 * tf * 1e12 / peaks.flops;
    else if (s > 0 && e.flops == 0 && peaks.bytes_per_s > 0) share = 100 * gbs * 1e9 / peaks.bytes_per_s;
    std::printf("  %-26s %10.3f %6.1f%% %6ld %12.6g %12.6g %10.4g %10.4g", name.c_str(), 1e3 * s,
                step_seconds > 0 ? 100 * s / step_seconds : 0.0, e.calls / steps, e.flops / steps / 1e9,
                e.bytes / steps / 1e6, tf, gbs);
    if (share >= 0) std::printf(" %6.1f%%", share);
    else std::printf(" %7s", "-");
    std::printf(" %12.3f\n", 1e3 * e.predicted_s / steps);
  }
  std::printf("  (the rest of the step: engine bookkeeping, copies, communication, host gaps)\n");
}

}  // namespace shardgpt
