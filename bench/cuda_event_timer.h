// Benchmark helper (bench only, CUDA builds): the KernelTimer of bench/kernel_profile.h on a
// CUDA device: each Mark records a timing event on the device's compute stream (events are
// pooled, so a step creates none after the first); Collect waits for the last one and reads
// cudaEventElapsedTime for each pair. Under the CUDA emulation the figures are the host's time
// running the queued work (meaningless as GPU times; the table's shape is what a test checks).
//
// Thread contract: the training thread.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/kernel_profile.h"
#include "model/cuda/cuda_device.h"

namespace shardgpt {

class CudaEventTimer final : public KernelTimer {
 public:
  explicit CudaEventTimer(Device& device) : stream_(static_cast<cudaStream_t>(CudaComputeStream(device))) {}
  ~CudaEventTimer() override {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  }
  int Mark() override {
    if (used_ == pool_.size()) {
      cudaEvent_t e = nullptr;
      Check(cudaEventCreate(&e), "cudaEventCreate");
      pool_.push_back(e);
    }
    Check(cudaEventRecord(pool_[used_], stream_), "cudaEventRecord");
    return static_cast<int>(used_++);
  }
  std::vector<double> Collect(const std::vector<std::pair<int, int>>& pairs) override {
    std::vector<double> ms;
    if (used_ > 0) Check(cudaEventSynchronize(pool_[used_ - 1]), "cudaEventSynchronize");
    for (const auto& p : pairs) {
      float t = 0;
      Check(cudaEventElapsedTime(&t, pool_[p.first], pool_[p.second]), "cudaEventElapsedTime");
      ms.push_back(t);
    }
    used_ = 0;
    return ms;
  }

 private:
  static void Check(cudaError_t e, const char* call) {
    if (e == cudaSuccess) return;
    std::fprintf(stderr, "bench_train: --profile: %s: %s\n", call, cudaGetErrorString(e));
    std::exit(1);
  }
  cudaStream_t stream_;
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
};

}  // namespace shardgpt
