// Picks and creates this rank's device from the --device flag.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "model/device.h"

namespace shardgpt {

// True when this build contains the CUDA backend (the toolkit was found at configure time).
bool CudaBackendBuilt();

// GPUs this process can use (CUDA_VISIBLE_DEVICES applied); 0 without the CUDA backend or a GPU.
int VisibleGpuCount();

// The GPU a rank of node-local rank `local_rank` takes among `count` visible ones (count >= 1):
// local_rank mod count, so 0 when only one is visible. Both the choice before MPI starts
// (SetGpuBeforeMpi) and CreateDevice use it.
inline int GpuForLocalRank(int local_rank, int count) {
  return count <= 1 ? 0 : (local_rank % count + count) % count;
}

// This process's node-local rank as its launcher states it in the environment, for use before
// MPI starts. The variables, first match wins: OMPI_COMM_WORLD_LOCAL_RANK (Open MPI's mpirun),
// SLURM_LOCALID (srun), MPI_LOCALRANKID (MPICH / Intel MPI's Hydra), PMI_LOCAL_RANK (PMI-based
// launchers), LOCAL_RANK (torchrun-style launchers). A value counts only when it is a plain
// decimal integer in [0, 2^31); any other value is skipped and the next variable is tried.
// lookup(name) returns the variable's value or null. rank -1 and variable "" when none counts.
struct LauncherLocalRank {
  int rank = -1;
  std::string variable;  // the variable it came from, e.g. "SLURM_LOCALID"
};
LauncherLocalRank LocalRankFromEnvironment(const std::function<const char*(const char*)>& lookup);

// For --device cuda, before MPI_Init: makes GPU GpuForLocalRank(launcher's local rank, visible
// GPUs) this thread's current device (cudaSetDevice, which creates its context), so that a
// CUDA-aware MPI or UCX initialised afterwards works on that GPU rather than GPU 0. Does
// nothing (ordinal -1) when the environment names no local rank, when no GPU is visible, or in
// a build without the CUDA backend; never fails (CreateDevice reports any GPU error later).
struct EarlyGpu {
  int ordinal = -1;  // the GPU set, -1 when none
  LauncherLocalRank from;
};
EarlyGpu SetGpuBeforeMpi(const std::function<const char*(const char*)>& lookup);

// The CUDA ordinal of a device made by CreateDevice("cuda", ...); -1 for any other device.
int GpuOrdinalOf(Device& device);

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
