#include "model/device_factory.h"

#include <cstring>

#ifdef SHARDGPT_HAVE_CUDA
#include "model/cuda/cuda_device.h"
#endif

namespace shardgpt {

bool CudaBackendBuilt() {
#ifdef SHARDGPT_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int VisibleGpuCount() {
#ifdef SHARDGPT_HAVE_CUDA
  return CudaVisibleDeviceCount(nullptr);
#else
  return 0;
#endif
}

LauncherLocalRank LocalRankFromEnvironment(const std::function<const char*(const char*)>& lookup) {
  static const char* const kVariables[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID",
                                           "PMI_LOCAL_RANK", "LOCAL_RANK"};
  for (const char* name : kVariables) {
    const char* v = lookup(name);
    if (v == nullptr || *v == '\0' || std::strlen(v) > 10) continue;
    long long r = 0;
    bool digits = true;
    for (const char* c = v; *c; c++) {
      if (*c < '0' || *c > '9') { digits = false; break; }
      r = r * 10 + (*c - '0');
    }
    if (!digits || r > 2147483647LL) continue;
    LauncherLocalRank out;
    out.rank = static_cast<int>(r);
    out.variable = name;
    return out;
  }
  return LauncherLocalRank();
}

EarlyGpu SetGpuBeforeMpi(const std::function<const char*(const char*)>& lookup) {
  EarlyGpu out;
  out.from = LocalRankFromEnvironment(lookup);
#ifdef SHARDGPT_HAVE_CUDA
  if (out.from.rank < 0) return out;
  const int count = CudaVisibleDeviceCount(nullptr);
  if (count <= 0) return out;
  const int dev = GpuForLocalRank(out.from.rank, count);
  if (CudaSetDeviceQuietly(dev)) out.ordinal = dev;
#endif
  return out;
}

int GpuOrdinalOf(Device& device) {
#ifdef SHARDGPT_HAVE_CUDA
  return CudaDeviceOrdinal(device);
#else
  (void)device;
  return -1;
#endif
}

StatusOr<std::unique_ptr<Device>> CreateDevice(const std::string& kind, int local_rank, int local_size) {
  if (kind == "cpu") return NewCpuDevice(false);
  if (kind != "cuda") return Status::InvalidArgument("--device " + kind + ": expected cpu or cuda");
#ifdef SHARDGPT_HAVE_CUDA
  return CreateCudaDevice(local_rank, local_size);
#else
  (void)local_rank, (void)local_size;
  return Status::Unimplemented(
      "--device cuda: this shardgpt was built without the CUDA backend (no CUDA toolkit found at configure "
      "time; install it and rebuild, or use --device cpu)");
#endif
}

Status CheckAttentionChoice(const std::string& attention, const std::string& device_kind) {
  if (attention == "own") return Status::OK();
  if (attention != "cudnn") return Status::InvalidArgument("--attention " + attention + ": expected own or cudnn");
  if (device_kind != "cuda")
    return Status::InvalidArgument("--attention cudnn: needs --device cuda (cuDNN runs on the GPU; --device " +
                                   device_kind + " has only --attention own)");
#if defined(SHARDGPT_CUDA_EMULATION)
  return Status::Unimplemented(
      "--attention cudnn: this build has no cuDNN frontend: it is the CUDA emulation, which has no cuDNN (use "
      "--attention own)");
#elif defined(SHARDGPT_HAVE_CUDA)
  if (CudnnAttentionInBuild()) return Status::OK();
  return Status::Unimplemented(
      "--attention cudnn: this build has no cuDNN frontend: CMake found no cudnn_frontend.h and cuDNN 9 at "
      "configure time (pip install nvidia-cudnn-frontend, or -DCUDNN_FRONTEND_INCLUDE_DIR=..., then reconfigure; "
      "or use --attention own)");
#else
  return Status::Unimplemented("--attention cudnn: this build has no cuDNN frontend (no CUDA backend either)");
#endif
}

Status ApplyAttentionChoice(const std::string& attention, Device& device) {
  if (attention != "cudnn") return Status::OK();
#ifdef SHARDGPT_HAVE_CUDA
  return UseCudnnAttention(device);
#else
  (void)device;
  return Status::Unimplemented("--attention cudnn: this build has no cuDNN frontend (no CUDA backend either)");
#endif
}

uint64_t TensorCoreAttentionCalls(Device& device) {
#ifdef SHARDGPT_HAVE_CUDA
  const TcAttentionCalls c = CudaTcAttentionCalls(device);
  return c.forwards + c.backwards;
#else
  (void)device;
  return 0;
#endif
}

}  // namespace shardgpt
