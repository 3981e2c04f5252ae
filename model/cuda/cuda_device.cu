// CudaDevice: one GPU. Memory comes from a caching allocator over cudaMalloc (zero-filled on the
// compute stream), kernels, Copy and Zero run in order on one compute stream, the communicator's
// staging copies run on a side stream guarded by a mutex, events are cudaEvents, host staging
// memory is pinned.
#include <cuda_runtime.h>

#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "model/cuda/cuda_device.h"
#include "model/cuda/attention_cudnn.h"
#include "model/cuda/kernels_cuda.h"
#include "model/device_factory.h"

#ifdef SHARDGPT_CUDA_EMULATION
#include "cuda_emu.h"
#endif

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

// The bytes a block for a request of `bytes` has, and whether a cached block of `block` bytes
// may serve a request whose block size is `size`. On a GPU: multiples of 512 bytes up to 1 MiB,
// of 2 MiB (cudaMalloc's page) above; a cached block fits when it wastes at most an eighth.
// Under the emulation blocks are exactly the bytes asked and fit only the same size, so that
// its bounds checks (copies, kernel arguments, AddressSanitizer) still see each buffer's own
// end; the engine asks the same sizes every step, so the cache still serves every request.
#ifdef SHARDGPT_CUDA_EMULATION
constexpr bool kExactBlocks = true;
#else
constexpr bool kExactBlocks = false;
#endif
size_t BlockBytes(size_t bytes) {
  if (kExactBlocks) return bytes;
  const size_t align = bytes <= (size_t{1} << 20) ? 512 : size_t{2} << 20;
  if (bytes > SIZE_MAX - align) return bytes;  // no GPU has it: cudaMalloc says so
  return (bytes + align - 1) / align * align;
}
bool Fits(size_t block, size_t size) { return block >= size && block - size <= (kExactBlocks ? 0 : size / 8); }

// A caching, stream-ordered allocator of one GPU's memory, in the spirit of PyTorch's: Free
// keeps the block in a pool, Allocate hands out the best-fitting pooled block, so the engine's
// buffers made and dropped per unit and micro-batch (bf16 compute copies, gradient scratch,
// stage 3's gathered units, reduce buffers) cost no cudaMalloc, no cudaFree and no host wait
// once the first step has filled the pool.
//
// Why reuse needs no wait: a block is handed out in the compute stream's order (Allocate's
// zero-fill is queued there), and everything that touches device memory is ordered with the
// compute stream:
//   - kernels, Copy and Zero run on the compute stream itself;
//   - a NCCL collective's stream waits on an event of the compute stream recorded when the
//     collective is issued, and the engine retires a collective (IsCompleted, Wait) or orders
//     the compute stream after it (Work::WaitStream) before it drops the collective's buffers;
//   - the MPI communicator's staging copies (side stream) start after an event of the compute
//     stream and finish before the collective's Work completes.
// So when Free(p) is called, every use of p on another stream is finished or ordered before
// the compute stream's current position, and any later use of the block on another stream
// starts after a compute event recorded after its next Allocate. That is the contract for
// callers (PyTorch's record_stream, made a rule): never drop a buffer that another stream may
// still use and the compute stream has not been ordered after.
//
// Out of memory: the pool is emptied (after one wait for the compute stream) and cudaMalloc
// retried once. Thread-safe (a mutex): buffers normally come and go on the training thread.
class CachingAllocator {
 public:
  // Counts its cudaMalloc and cudaFree calls in *mallocs and *frees. The caller makes the GPU
  // current before every call.
  CachingAllocator(std::atomic<uint64_t>* mallocs, std::atomic<uint64_t>* frees) : mallocs_(mallocs), frees_(frees) {}
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (> 0) from the pool or cudaMalloc; nullptr when the GPU is out
  // of memory even with the pool emptied. `compute` is waited for before the pool is emptied.
  void* Allocate(size_t bytes, cudaStream_t compute) {
    const size_t size = BlockBytes(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cached_.lower_bound(size);  // best fit: the smallest cached block that is large enough
    if (it != cached_.end() && Fits(it->first, size)) {
      void* p = it->second;
      live_[p] = it->first;
      cached_bytes_ -= it->first;
      cached_.erase(it);
      return p;
    }
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation && !cached_.empty()) {
      cudaGetLastError();  // not sticky; clear it
      SHARDGPT_CUDA_CHECK(cudaStreamSynchronize(compute));
      ReleaseCached();
      e = cudaMalloc(&p, size);
    }
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    SHARDGPT_CUDA_CHECK(e);
    (*mallocs_)++;
    live_[p] = size;
    return p;
  }

  // Back into the pool, no wait (see the class comment). False when p is not a live block here.
  bool Free(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return false;
    cached_.emplace(it->second, p);
    cached_bytes_ += it->second;
    live_.erase(it);
    return true;
  }

  // The bytes of live block p (0 when p is not one): what CudaDevice::Free poisons (emulation)
  // and what the kernels forget.
  size_t bytes_of(void* p) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    return it == live_.end() ? 0 : it->second;
  }

  // Bytes in the pool: free for the program, though cudaMemGetInfo counts them as used.
  uint64_t cached_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_bytes_;
  }

  // cudaFree of every block, pooled or live. The streams must be idle (the device's destructor).
  void ReleaseAll() {
    std::lock_guard<std::mutex> lock(mu_);
    ReleaseCached();
    for (auto& kv : live_) FreeBlock(kv.first);
    live_.clear();
  }

 private:
  // Under mu_. cudaFree waits for the GPU anyway; the callers have waited for the compute stream.
  void ReleaseCached() {
    for (auto& kv : cached_) FreeBlock(kv.second);
    cached_.clear();
    cached_bytes_ = 0;
  }
  void FreeBlock(void* p) {
    const cudaError_t e = cudaFree(p);
    if (e == cudaSuccess) (*frees_)++;
    else std::fprintf(stderr, "shardgpt: warning: CUDA: cudaFree: %s\n", cuda::ErrorText(e).c_str());
  }

  std::atomic<uint64_t>* const mallocs_;  // the device's counters
  std::atomic<uint64_t>* const frees_;
  mutable std::mutex mu_;                   // guards everything below
  std::multimap<size_t, void*> cached_;     // block bytes -> free block
  std::unordered_map<void*, size_t> live_;  // handed-out block -> its bytes
  uint64_t cached_bytes_ = 0;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int device) : device_(device), pool_(&allocations_, &frees_) {}
  ~CudaDevice() override {
    // No throwing here: errors are ignored (the GPU may be gone already).
    cudaSetDevice(device_);
    if (compute_) cudaStreamSynchronize(compute_);
    if (side_) cudaStreamSynchronize(side_);
    kernels_.reset();  // before the stream it uses
    for (StagingSlot& slot : staging_) {
      if (slot.event) cudaEventDestroy(slot.event);
      if (slot.host) cudaFreeHost(slot.host);
    }
    if (readback_) cudaFreeHost(readback_);
    pool_.ReleaseAll();
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
    void* p = AllocateUnfilled(bytes, what);
    // Zero-filled in stream order: every later kernel, copy or recorded event sees the zeros.
    if (p) SHARDGPT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, compute_));
    return p;
  }
  void* AllocateUnfilled(size_t bytes, const std::string& what) override {
    if (bytes == 0) return nullptr;
    Bind();
    void* p = pool_.Allocate(bytes, compute_);
    if (p == nullptr) {
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw DeviceOutOfMemory("out of GPU memory on " + name_ + " allocating " + what + ": " +
                              std::to_string(bytes) + " bytes (" + GiB(bytes) + ") asked, " + std::to_string(free_b) +
                              " bytes (" + GiB(free_b) + ") free of " + GiB(total_b) +
                              "; try a higher --zero-stage or a smaller --micro-batch");
    }
    return p;
  }

  // Into the pool: queued kernels may still use p, and need not have finished (stream order
  // protects the block's next user; see CachingAllocator). Called from destructors: reports,
  // never throws.
  void Free(void* p) override {
    if (p == nullptr) return;
    const size_t bytes = pool_.bytes_of(p);
    if (kernels_ && bytes > 0) kernels_->ForgetMemory(p, bytes);  // nothing derived from p is read again
#ifdef SHARDGPT_CUDA_EMULATION
    // Poisoned (NaN as fp32 and bf16) in stream order, as a fresh emulated allocation is: a
    // kernel or a collective reading p after its Free, or one on another stream that was not
    // ordered before this point (the pool's contract), reads NaN and the tests see it.
    cudaSetDevice(device_);
    if (bytes > 0 && cudaMemsetAsync(p, 0xff, bytes, compute_) != cudaSuccess) cudaGetLastError();
#endif
    if (!pool_.Free(p))
      std::fprintf(stderr, "shardgpt: warning: CUDA: Free of %p, which %s did not allocate (or freed already)\n", p,
                   name_.c_str());
  }

  // The emulation counts every allocation, free and host wait of the process (the kernel
  // scratch's, the NCCL communicator's and the checkpoint writer's included). On a GPU only
  // this device's own cudaMalloc/cudaMallocHost and cudaFree/cudaFreeHost calls are counted
  // (not the kernels' scratch, not the libraries'), and host waits are not: they happen in
  // CudaKernels, the communicators and here, and nothing sees them all.
  DeviceCounters counters() const override {
    DeviceCounters c;
#ifdef SHARDGPT_CUDA_EMULATION
    const cuda_emu::Counters e = cuda_emu::GetCounters();
    c.allocations = e.device_allocations, c.frees = e.device_frees, c.host_syncs = e.host_syncs;
    c.host_syncs_known = true;
#else
    c.allocations = allocations_.load(), c.frees = frees_.load();
#endif
    c.known = true;
    return c;
  }

  // The pool's blocks count as free: Allocate reuses them, or returns them to CUDA when it must.
  uint64_t free_bytes() const override {
    cudaSetDevice(device_);
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return free_b + pool_.cached_bytes();
  }

  // Synchronous for the host, ordered after the kernels already queued.
  void CopyToDevice(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    Bind();
    SHARDGPT_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, compute_));
    SHARDGPT_CUDA_CHECK(cudaStreamSynchronize(compute_));
  }
  // Through the pinned staging ring: the bytes are copied into the next slot on the host, then
  // a cudaMemcpyAsync from pinned memory (truly asynchronous) is queued on the compute stream
  // and an event recorded after it. A slot is written again only once its event has passed:
  // queried first (no wait when the copy ran, the usual case with kStagingSlots slots), waited
  // for only when the ring has lapped the device. A slot grows (once) to the largest copy.
  void CopyToDeviceAsync(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    Bind();
    const int at = next_staging_;
    StagingSlot& slot = staging_[at];
    next_staging_ = (next_staging_ + 1) % kStagingSlots;
    if (slot.event) {
      const cudaError_t q = cudaEventQuery(slot.event);
      if (q == cudaErrorNotReady) {
        cudaGetLastError();
        SHARDGPT_CUDA_CHECK(cudaEventSynchronize(slot.event));
      } else {
        SHARDGPT_CUDA_CHECK(q);
      }
    } else {
      SHARDGPT_CUDA_CHECK(cudaEventCreateWithFlags(&slot.event, cudaEventDisableTiming));
    }
    if (!staging_sized_) {  // the whole ring at the first copy, so later steps allocate nothing
      staging_sized_ = true;
      for (int i = 0; i < kStagingSlots; i++) GrowStaging(i, bytes);
    }
    GrowStaging(at, bytes);
    std::memcpy(slot.host, host_src, bytes);
    SHARDGPT_CUDA_CHECK(cudaMemcpyAsync(dst, slot.host, bytes, cudaMemcpyHostToDevice, compute_));
    SHARDGPT_CUDA_CHECK(cudaEventRecord(slot.event, compute_));
  }
  // Small reads (a step's loss and norm) go through a pinned buffer: the copy is queued and one
  // stream synchronisation waits for it (a pageable destination would make cudaMemcpyAsync
  // itself wait too). Larger ones (checkpoints) copy straight into host_dst.
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    Bind();
    if (bytes <= kReadbackBytes) {
      if (readback_ == nullptr) {
        SHARDGPT_CUDA_CHECK(cudaMallocHost(&readback_, kReadbackBytes));
        allocations_++;
      }
      SHARDGPT_CUDA_CHECK(cudaMemcpyAsync(readback_, src, bytes, cudaMemcpyDeviceToHost, compute_));
      SHARDGPT_CUDA_CHECK(cudaStreamSynchronize(compute_));
      std::memcpy(host_dst, readback_, bytes);
      return;
    }
    SHARDGPT_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, compute_));
    SHARDGPT_CUDA_CHECK(cudaStreamSynchronize(compute_));
  }
  // A staging slot of at least `bytes`, reallocated (after its last copy) when smaller.
  void GrowStaging(int i, size_t bytes) {
    StagingSlot& slot = staging_[i];
    if (slot.bytes >= bytes) return;
    if (slot.event == nullptr) SHARDGPT_CUDA_CHECK(cudaEventCreateWithFlags(&slot.event, cudaEventDisableTiming));
    {
      if (slot.host) {
        SHARDGPT_CUDA_CHECK(cudaFreeHost(slot.host));
        frees_++;
        slot.host = nullptr, slot.bytes = 0;
      }
      const cudaError_t e = cudaMallocHost(&slot.host, bytes);
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        slot.host = nullptr;
        throw DeviceOutOfMemory("out of pinned host memory allocating " + std::to_string(bytes) +
                                " bytes of input staging for " + name_);
      }
      SHARDGPT_CUDA_CHECK(e);
      allocations_++;
      slot.bytes = bytes;
    }
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
    allocations_++;
    return p;
  }
  void FreeHost(void* p) override {
    if (p == nullptr) return;
    cudaSetDevice(device_);
    const cudaError_t e = cudaFreeHost(p);
    if (e == cudaSuccess) frees_++;
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
  // CopyToDeviceAsync's pinned staging ring (training thread only): slot i is reusable once
  // its event (recorded after its last copy) has passed.
  struct StagingSlot {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t event = nullptr;
  };
  static constexpr int kStagingSlots = 8;
  StagingSlot staging_[kStagingSlots];
  int next_staging_ = 0;
  bool staging_sized_ = false;
  static constexpr size_t kReadbackBytes = 4096;
  void* readback_ = nullptr;  // CopyToHost's pinned buffer for small reads
  // cudaMalloc/cudaMallocHost and cudaFree/cudaFreeHost calls made here and by pool_
  // (AllocateHost and FreeHost may run on the communication thread).
  std::atomic<uint64_t> allocations_{0}, frees_{0};
  CachingAllocator pool_;  // after the counters it updates
};

}  // namespace

bool CudnnAttentionInBuild() { return cuda::CudnnAttentionBuilt(); }

Status UseCudnnAttention(Device& device) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  if (!cuda) return Status::InvalidArgument("--attention cudnn: needs --device cuda");
  if (!cuda::CudnnAttentionBuilt())
    return Status::Unimplemented("--attention cudnn: this build has no cuDNN frontend");
  static_cast<CudaKernels&>(cuda->kernels()).set_cudnn_attention(true);
  return Status::OK();
}

uint64_t CudaGeluEpilogueCalls(Device& device) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  return cuda ? static_cast<CudaKernels&>(cuda->kernels()).gelu_in_epilogue() : 0;
}

uint64_t CudaGemmFallbacks(Device& device) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  return cuda ? static_cast<CudaKernels&>(cuda->kernels()).gemm_fallbacks() : 0;
}

TcAttentionCalls CudaTcAttentionCalls(Device& device) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  if (!cuda) return {};
  const auto& k = static_cast<CudaKernels&>(cuda->kernels());
  return {k.tc_attention_forwards(), k.tc_attention_backwards()};
}

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

bool CudaSetDeviceQuietly(int ordinal) {
  if (cudaSetDevice(ordinal) == cudaSuccess) return true;
  cudaGetLastError();
  return false;
}

StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int local_rank, int local_size) {
  std::string error;
  const int count = CudaVisibleDeviceCount(&error);
  if (count == 0) return Status::NotFound("--device cuda: no usable GPU: " + error);
  const int dev = GpuForLocalRank(local_rank, count);
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
