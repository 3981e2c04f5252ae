// The CUDA device: one GPU, its compute stream, a side stream for the communicator's staging,
// cuBLASLt and our kernels (model/cuda/kernels_cuda.h). Built only when CMake found a CUDA
// toolkit (SHARDGPT_HAVE_CUDA); this header includes no CUDA header, so plain C++ files
// (model/device_factory.cc, the tests) can include it.
//
// Errors that a user can cause (no driver, no GPU, a GPU this build has no code for, out of
// memory at start-up) come back as a Status with one line; Allocate throws DeviceOutOfMemory
// (model/device.h). Anything else failing inside a kernel or copy (an illegal address, a lost
// GPU) throws std::runtime_error("CUDA: <call>: <error string> (<error name>)").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "model/device.h"

namespace shardgpt {

// Number of GPUs this process can use (CUDA_VISIBLE_DEVICES applied). 0 when there is none or
// CUDA cannot start; then *error (if not null) says why, naming the CUDA error string, name and
// code, e.g. "CUDA driver version is insufficient for CUDA runtime version
// (cudaErrorInsufficientDriver, 35)".
int CudaVisibleDeviceCount(std::string* error);

// cudaSetDevice(ordinal), which also creates the GPU's context; false (the error cleared) when
// it fails.
bool CudaSetDeviceQuietly(int ordinal);

// Opens GPU (local_rank mod count) of the visible ones (GPU 0 when only one is visible).
// Errors: "--device cuda: no usable GPU: <cuda error>", and the like, one line each.
StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int local_rank, int local_size);

// For the NCCL communicator: the CUDA ordinal of a device made by CreateCudaDevice (-1 for any
// other device) and its compute stream (a cudaStream_t; null for any other device).
int CudaDeviceOrdinal(Device& device);
void* CudaComputeStream(Device& device);
// The PCI bus id of a device made by CreateCudaDevice, lower case ("0000:19:00.0", what its
// name shows): which physical GPU it is, whatever CUDA_VISIBLE_DEVICES renumbered. "" for any
// other device, or when CUDA cannot tell. The NCCL communicator refuses two ranks on one GPU by it.
std::string CudaPciBusId(Device& device);

// True when this build has the cuDNN SDPA path (--attention cudnn; model/cuda/attention_cudnn.h).
bool CudnnAttentionInBuild();
// --attention cudnn on a device made by CreateCudaDevice; an error line for any other device or
// a build without the path.
Status UseCudnnAttention(Device& device);
// --gelu fused: the matmul_gelu_forward / matmul_dgelu_backward calls on a device made by
// CreateCudaDevice whose GELU ran in cuBLASLt's epilogue (the others took the fp32 result and
// the element-wise kernel: no epilogue algorithm, or a configuration without one); 0 for any
// other device. For tests and bench_train's report.
uint64_t CudaGeluEpilogueCalls(Device& device);
// Matmul calls that took a fallback (cuBLASLt's heuristic failed or had no algorithm, or one was
// refused at its call) on this device since it was made; 0 for a non-CUDA device (tests).
uint64_t CudaGemmFallbacks(Device& device);
// The attention_forward / attention_backward calls on a device made by CreateCudaDevice that ran
// the bf16 tensor-core kernels (attention_tc_cuda.cu); 0 for any other device. For tests and
// train's --log rows (attention_tc_calls).
struct TcAttentionCalls {
  uint64_t forwards = 0, backwards = 0;
};
TcAttentionCalls CudaTcAttentionCalls(Device& device);

}  // namespace shardgpt
