#include "model/device_factory.h"

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

}  // namespace shardgpt
