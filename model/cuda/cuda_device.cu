// CudaDevice: one GPU. Memory comes from cudaMalloc (zero-filled on the compute stream), kernels,
// Copy and Zero run in order on one compute stream, the communicator's staging copies run on a
// side stream guarded by a mutex, events are cudaEvents, host staging memory is pinned.
#include <cuda_runtime.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "model/cuda/cuda_device.h"
#include "model/cuda/kernels_cuda.h"

#ifndef SHARDGPT_CUDA_ARCHS
#define SHARDGPT_CUDA_ARCHS "unknown"
#endif

namespace shardgpt {

namespace {

// Launched never: cudaFuncGetAttributes on it tells whether this build has code for the GPU.
__global__ void probe_kernel() {}

std::string GiB(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

// cudaDeviceGetPCIBusId of ordinal dev in lower case; "" when CUDA cannot tell.
std::string PciBusId(int dev) {
  char bus[32] = "";
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), dev) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  for (char* c = bus; *c; c++) *c = (char)std::tolower((unsigned char)*c);
  return bus;
}

class CudaEvent final : public DeviceEvent {
 public:
  CudaEvent(int device, cudaEvent_t e) : device_(device), event_(e) {}
  ~CudaEvent() override {
    cudaSetDevice(device_);
    cudaEventDestroy(event_);
  }
  void Synchronize() override {
    SHARDGPT_CUDA_CHECK(cudaSetDevice(device_));
    SHARDGPT_CUDA_CHECK(cudaEventSynchronize(event_));
  }

 private:
  const int device_;
  const cudaEvent_t event_;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int device) : device_(device) {}
  ~CudaDevice() override {
    // No throwing here: errors are ignored (the GPU may be gone already).
    cudaSetDevice(device_);
    if (compute_) cudaStreamSynchronize(compute_);
    if (side_) cudaStreamSynchronize(side_);
    kernels_.reset();  // before the stream it uses
    if (side_) cudaStreamDestroy(side_);
    if (compute_) cudaStreamDestroy(compute_);
  }

  // Streams, cuBLASLt, the workspace. The caller has checked the GPU and made it current.
  Status Init(const std::string& name) {
    name_ = name;
    cudaError_t e = cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Status::Internal("--device cuda: " + name_ + ": cannot create a stream: " + cuda::ErrorText(e));
    }
    kernels_ = std::make_unique<CudaKernels>(device_, compute_);
    return kernels_->Init();
  }

  std::string name() const override { return name_; }
  bool is_cuda() const override { return true; }
  bool host_accessible() const override { return false; }

  void* Allocate(size_t bytes, const std::string& what) override {
    if (bytes == 0) return nullptr;
    Bind();
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky; clear it
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw DeviceOutOfMemory("out of GPU memory on " + name_ + " allocating " + what + ": " +
                              std::to_string(bytes) + " bytes (" + GiB(bytes) + ") asked, " + std::to_string(free_b) +
                              " bytes (" + GiB(free_b) + ") free of " + GiB(total_b) +
                              "; try a higher --zero-stage or a smaller --micro-batch");
    }
    SHARDGPT_CUDA_CHECK(e);
    // Zero-filled in stream order: every later kernel, copy or recorded event sees the zeros.
    SHARDGPT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, compute_));
    return p;
  }

  void Free(void* p) override {
    if (p == nullptr) return;
    cudaSetDevice(device_);
    // Queued kernels may still use p. Called from destructors: reports, never throws.
    cudaError_t e = cudaStreamSynchronize(compute_);
    if (e == cudaSuccess) e = cudaFree(p);
    if (e != cudaSuccess) std::fprintf(stderr, "shardgpt: warning: CUDA: cudaFree: %s\n", cuda::ErrorText(e).c_str());
  }

  uint64_t free_bytes() const override {
    cudaSetDevice(device_);
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return free_b;
  }

  // Synchronous for the host, ordered after the kernels already queued.
  void CopyToDevice(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    Bind();
    SHARDGPT_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, compute_));
    SHARDGPT_CUDA_CHECK(cudaStreamSynchronize(compute_));
  }
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    Bind();
    SHARDGPT_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, compute_));
    SHARDGPT_CUDA_CHECK(cudaStreamSynchronize(compute_));
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    Bind();
    SHARDGPT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_));
  }
  void Zero(void* p, size_t bytes) override {
    if (bytes == 0) return;
    Bind();
    SHARDGPT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, compute_));
  }
  void Synchronize() override {
    Bind();
    SHARDGPT_CUDA_CHECK(cudaStreamSynchronize(compute_));
  }

  std::shared_ptr<DeviceEvent> RecordEvent() override {
    Bind();
    cudaEvent_t e = nullptr;
    SHARDGPT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    auto event = std::make_shared<CudaEvent>(device_, e);  // owns e from here on
    SHARDGPT_CUDA_CHECK(cudaEventRecord(e, compute_));
    return event;
  }

  void* AllocateHost(size_t bytes) override {
    if (bytes == 0) return nullptr;
    Bind();
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw DeviceOutOfMemory("out of pinned host memory allocating " + std::to_string(bytes) + " bytes (" +
                              GiB(bytes) + ") of staging buffers for " + name_ +
                              "; try a higher --zero-stage or a smaller --micro-batch");
    }
    SHARDGPT_CUDA_CHECK(e);
    return p;
  }
  void FreeHost(void* p) override {
    if (p == nullptr) return;
    cudaSetDevice(device_);
    const cudaError_t e = cudaFreeHost(p);
    if (e != cudaSuccess)
      std::fprintf(stderr, "shardgpt: warning: CUDA: cudaFreeHost: %s\n", cuda::ErrorText(e).c_str());
  }

  // Side-stream copies, synchronous for the calling thread (any thread). The caller has waited
  // for the event after the producer of src (or the last reader of dst) on the compute stream.
  void StageToHost(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> lock(side_mu_);
    Bind();
    SHARDGPT_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, side_));
    SHARDGPT_CUDA_CHECK(cudaStreamSynchronize(side_));
  }
  void StageToDevice(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> lock(side_mu_);
    Bind();
    SHARDGPT_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, side_));
    SHARDGPT_CUDA_CHECK(cudaStreamSynchronize(side_));
  }

  Kernels& kernels() override { return *kernels_; }
  int ordinal() const { return device_; }
  cudaStream_t compute_stream() const { return compute_; }

 private:
  // The current device is per thread; the communicator's thread starts on GPU 0.
  void Bind() const { SHARDGPT_CUDA_CHECK(cudaSetDevice(device_)); }

  const int device_;
  std::string name_;
  cudaStream_t compute_ = nullptr;
  cudaStream_t side_ = nullptr;
  std::mutex side_mu_;
  std::unique_ptr<CudaKernels> kernels_;
};

}  // namespace

int CudaDeviceOrdinal(Device& device) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  return cuda ? cuda->ordinal() : -1;
}

void* CudaComputeStream(Device& device) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  return cuda ? static_cast<void*>(cuda->compute_stream()) : nullptr;
}

std::string CudaPciBusId(Device& device) {
  const int ordinal = CudaDeviceOrdinal(device);
  return ordinal < 0 ? std::string() : PciBusId(ordinal);
}

int CudaVisibleDeviceCount(std::string* error) {
  int count = 0;  // cudaGetDeviceCount leaves it unchanged on error
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (error) *error = cuda::ErrorText(e);
    return 0;
  }
  if (count <= 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (error)
      *error = std::string("the CUDA runtime sees no GPU") +
               (visible ? std::string(" (CUDA_VISIBLE_DEVICES=\"") + visible + "\")" : std::string());
    return 0;
  }
  return count;
}

StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int local_rank, int local_size) {
  std::string error;
  const int count = CudaVisibleDeviceCount(&error);
  if (count == 0) return Status::NotFound("--device cuda: no usable GPU: " + error);
  const int dev = count == 1 ? 0 : (local_rank % count + count) % count;
  const std::string which = "GPU " + std::to_string(dev) + " of " + std::to_string(count) + " (local rank " +
                            std::to_string(local_rank) + " of " + std::to_string(local_size) + ")";
  cudaError_t e = cudaSetDevice(dev);
  cudaDeviceProp prop{};
  if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, dev);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status::Internal("--device cuda: cannot open " + which + ": " + cuda::ErrorText(e));
  }
  const std::string bus = PciBusId(dev);
  const std::string name = "cuda:" + std::to_string(dev) + " (" + prop.name + ", bus " + (bus.empty() ? "?" : bus) + ")";
  cudaFuncAttributes attr{};
  e = cudaFuncGetAttributes(&attr, probe_kernel);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status::Unimplemented("--device cuda: " + name + " has compute capability " +
                                 std::to_string(prop.major) + "." + std::to_string(prop.minor) +
                                 " but this shardgpt was built for CUDA architectures " SHARDGPT_CUDA_ARCHS
                                 " only (" + cuda::ErrorText(e) +
                                 "); rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + std::to_string(prop.major) +
                                 std::to_string(prop.minor));
  }
  auto device = std::make_unique<CudaDevice>(dev);
  Status st = device->Init(name);
  if (!st.ok()) return st;
  return std::unique_ptr<Device>(std::move(device));
}

}  // namespace shardgpt
