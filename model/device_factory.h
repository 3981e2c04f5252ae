// Picks and creates this rank's device from the --device flag.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "model/device.h"

namespace shardgpt {

// True when this build contains the CUDA backend (the toolkit was found at configure time).
bool CudaBackendBuilt();

// GPUs this process can use (CUDA_VISIBLE_DEVICES applied); 0 without the CUDA backend or a GPU.
int VisibleGpuCount();

// kind "cpu": the CPU device. kind "cuda": one of the GPUs visible to this process
// (CUDA_VISIBLE_DEVICES and Slurm's per-task binding both shrink that set): with one visible
// GPU, that one; otherwise GPU (local_rank mod count), local_rank being this rank's index among
// the local_size ranks of its node. Errors: a build without CUDA, no driver, no GPU (naming the
// CUDA error).
StatusOr<std::unique_ptr<Device>> CreateDevice(const std::string& kind, int local_rank, int local_size);

// --attention: "own" (the default: this project's kernels, on every device) or "cudnn" (cuDNN's
// SDPA through the cuDNN frontend graph API, GPU only). Checked before the device is made: OK,
// or one error line naming the flag ("cudnn" with --device cpu; "cudnn" in a build without the
// cuDNN frontend: the CUDA emulation, or nvcc builds where CMake found no cudnn_frontend.h).
Status CheckAttentionChoice(const std::string& attention, const std::string& device_kind);
// Applies a checked choice to the device made for it (cudnn: the CUDA kernels switch to cuDNN).
Status ApplyAttentionChoice(const std::string& attention, Device& device);

// attention_forward + attention_backward calls on a CUDA device that ran the bf16 tensor-core
// kernels (model/cuda/attention_tc_cuda.cu); 0 for any other device or build.
uint64_t TensorCoreAttentionCalls(Device& device);

}  // namespace shardgpt
