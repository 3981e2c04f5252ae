// Benchmark helper (bench only): what a roofline predicts for one training step, without
// running it: the model and engine run their real call sequence on a CountingDevice whose
// kernels do nothing and whose memory is reserved address space (never touched, so a d12 B16
// step's ~30 GB of activations costs no RAM), and bench/kernel_profile.h's ProfilingKernels
// counts each call's FLOPs and bytes and the roofline's time at the given peaks (bench_train
// --roofline 1). What a GPU run of the same shape is compared with (bench_train --profile 1).
//
// Thread contract: one training thread.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/kernel_profile.h"
#include "model/device.h"

namespace shardgpt {

// Kernels that do nothing (host values: 0).
class NullKernels final : public Kernels {
 public:
  void encoder_forward(void*, const int32_t*, const float*, const float*, int, int, int) const override {}
  void encoder_backward(float*, float*, const void*, const int32_t*, int, int, int) const override {}
  void layernorm_forward(void*, float*, float*, const void*, const float*, const float*, int, int) const override {}
  void layernorm_backward(void*, float*, float*, const void*, const void*, const float*, const float*,
                          const float*, int, int) const override {}
  void matmul_forward(void*, const void*, const float*, const float*, int, int, int) const override {}
  void matmul_backward(void*, float*, float*, const void*, const void*, const float*, int, int, int) const override {}
  void attention_forward(void*, float*, const void*, int, int, int, int) const override {}
  void attention_backward(void*, const void*, const void*, const void*, const float*, int, int, int,
                          int) const override {}
  void gelu_forward(void*, const void*, size_t) const override {}
  void gelu_backward(void*, const void*, const void*, size_t) const override {}
  void matmul_gelu_forward(void*, void*, const void*, const float*, const float*, int, int, int) const override {}
  void matmul_dgelu_backward(void*, float*, float*, const void*, const void*, const void*, const float*, int, int,
                             int) const override {}
  void residual_forward(void*, const void*, const void*, size_t) const override {}
  void residual_layernorm_forward(void*, void*, float*, float*, const void*, const void*, const float*,
                                  const float*, int, int) const override {}
  double crossentropy_softmax(void*, float*, const int32_t*, int, int, int, float) const override { return 0; }
  void convert(const void*, DType, void*, DType, size_t) const override {}
  void accumulate(void*, DType, const void*, DType, size_t) const override {}
  double sum_squares(const void*, DType, size_t) const override { return 0; }
  void crossentropy_softmax_acc(void*, float*, const int32_t*, int, int, int, float, double*) const override {}
  void sum_squares_to(double*, const void*, DType, size_t) const override {}
  void sum_f64(double*, const double*, size_t, double) const override {}
  void clip_factor(float*, const double*, float) const override {}
  void adamw_mixed(float*, void*, DType, const void*, DType, float*, float*, size_t, float, float, const AdamWConfig&,
                   int64_t, const float*, float) const override {}
};

// A device that runs nothing: memory is address space reserved with MAP_NORESERVE and never
// touched (copies and zeroing are skipped), the kernels are NullKernels.
class CountingDevice final : public Device {
 public:
  ~CountingDevice() override {
    for (auto& kv : live_) munmap(kv.first, kv.second);
  }
  std::string name() const override { return "counting device (runs nothing)"; }
  bool is_cuda() const override { return false; }
  bool host_accessible() const override { return false; }
  void* Allocate(size_t bytes, const std::string& what) override {
    if (bytes == 0) return nullptr;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw DeviceOutOfMemory("counting device: cannot reserve " + std::to_string(bytes) +
                                                 " bytes of address space for " + what);
    live_[p] = bytes;
    return p;
  }
  void Free(void* p) override {
    auto it = live_.find(p);
    if (it == live_.end()) return;
    munmap(it->first, it->second);
    live_.erase(it);
  }
  void CopyToDevice(void*, const void*, size_t) override {}
  void CopyToHost(void* dst, const void*, size_t bytes) override { std::memset(dst, 0, bytes); }
  void Copy(void*, const void*, size_t) override {}
  void Zero(void*, size_t) override {}
  void Synchronize() override {}
  std::shared_ptr<DeviceEvent> RecordEvent() override { return std::make_shared<Done>(); }
  void* AllocateHost(size_t bytes) override { return ::operator new(bytes); }
  void FreeHost(void* p) override { ::operator delete(p); }
  void StageToHost(void* dst, const void*, size_t bytes) override { std::memset(dst, 0, bytes); }
  void StageToDevice(void*, const void*, size_t) override {}
  Kernels& kernels() override { return k_; }

 private:
  struct Done final : DeviceEvent {
    void Synchronize() override {}
  };
  NullKernels k_;
  std::map<void*, size_t> live_;
};

// Prints the roofline table of one step's counted calls (slowest predicted first) and the
// predicted step time and throughput: tokens per step / the sum of every call's roofline time.
inline void PrintRoofline(const ProfilingKernels& p, const Peaks& peaks, double tokens, double model_flops) {
  std::vector<std::pair<std::string, ProfilingKernels::Entry>> rows(p.table().begin(), p.table().end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.predicted_s > b.second.predicted_s; });
  ProfilingKernels::Entry total;
  std::printf("  %-26s %6s %12s %12s %10s %12s %8s\n", "kernel", "calls", "GFLOP", "MB", "FLOP/byte", "roofline_ms",
              "bound");
  for (const auto& [name, e] : rows) {
    total.flops += e.flops, total.bytes += e.bytes, total.predicted_s += e.predicted_s, total.calls += e.calls;
    const bool compute = peaks.flops > 0 && e.flops / peaks.flops >= e.bytes / peaks.bytes_per_s;
    std::printf("  %-26s %6ld %12.6g %12.6g %10.1f %12.4g %8s\n", name.c_str(), e.calls, e.flops / 1e9, e.bytes / 1e6,
                e.bytes > 0 ? e.flops / e.bytes : 0.0, 1e3 * e.predicted_s, compute ? "compute" : "memory");
  }
  std::printf("  %-26s %6ld %12.6g %12.6g %10.1f %12.4g\n", "all kernels", total.calls, total.flops / 1e9,
              total.bytes / 1e6, total.bytes > 0 ? total.flops / total.bytes : 0.0, 1e3 * total.predicted_s);
  const double step = total.predicted_s;
  std::printf("predicted step %.1f ms | %.0f tokens/s | model FLOPs (6N + 6LCT per token) %.1f TFLOP/step, MFU %.1f%% "
              "of %.0f TFLOP/s — every kernel at its roofline, nothing between kernels\n",
              1e3 * step, tokens / step, model_flops / 1e12, 100 * model_flops / step / peaks.flops, peaks.flops / 1e12);
}

}  // namespace shardgpt
