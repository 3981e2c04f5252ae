// The two devices a GPU twin test compares: CUDA device 0 (real, or the emulation) and the CPU
// device whose kernels are the CUDA kernels' CPU twins.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "model/cuda/cuda_device.h"
#include "model/device.h"

namespace shardgpt {

// Opens both into *gpu and *cpu. False when no GPU is usable, with the reason in *skip (the
// caller's SetUp skips); a GPU that is visible but fails to open is a test failure as well.
inline bool OpenGpuAndCpu(std::unique_ptr<Device>* gpu, std::unique_ptr<Device>* cpu, std::string* skip) {
  std::string error;
  if (CudaVisibleDeviceCount(&error) == 0) {
    *skip = "no usable GPU: " + error;
    return false;
  }
  auto dev = CreateCudaDevice(0, 1);
  if (!dev.ok()) {
    ADD_FAILURE() << dev.status().message();
    *skip = "the CUDA device did not open";
    return false;
  }
  *gpu = std::move(dev.value());
  *cpu = NewCpuDevice(false);
  return true;
}

}  // namespace shardgpt
