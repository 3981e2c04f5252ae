// Device: where tensors live and kernels run. One interface for the CPU (host memory, the
// OpenBLAS/OpenMP kernels) and CUDA (device memory, streams, cuBLASLt and our kernels), so the
// model, the engine, the optimizer and the checkpoint code exist once for both.
//
// Memory: Allocate/Free are raw; DeviceBuffer (below) is the owning handle that also counts its
// bytes in a MemoryLedger. Out of memory is an error naming the buffer, the bytes asked and the
// bytes free (DeviceOutOfMemory, thrown: allocations happen deep inside the engine's hooks,
// which have no error path; RunTrain turns it into one error line).
//
// Ordering: kernels, Copy and Zero run in order on the compute stream. CopyToDevice and
// CopyToHost are synchronous for the host (they return when the host buffer may be reused /
// read); CopyToDeviceAsync returns at once. Stage* copies run on a side stream and may be
// called from another thread (the MPI
// communicator's), after WaitFor(event) has made that thread wait for the producer.
//
// Thread contract: one training thread drives the compute stream; RecordEvent/Stage*/
// AllocateHost/FreeHost may also be called from one communication thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "base/memory_ledger.h"
#include "model/kernels.h"

namespace shardgpt {

// Thrown by Device::Allocate when the device is out of memory; what() is the one error line.
class DeviceOutOfMemory : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A point in a device's compute stream; Synchronize() blocks the calling thread until the work
// recorded before it has finished.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  virtual void Synchronize() = 0;
};

// What a device did at the host's request since it was made (or since the process started,
// where that is what the backend can count): allocations and frees of device memory (and of
// pinned host memory), and host synchronisations (the host blocked on device work). known:
// allocations and frees are counted; host_syncs_known: host_syncs is counted too. Differences
// between two readings say what a step cost; a training step in steady state should allocate,
// free and wait for nothing beyond what its results need (the loss, the gradient norm).
struct DeviceCounters {
  uint64_t allocations = 0, frees = 0, host_syncs = 0;
  bool known = false;
  bool host_syncs_known = false;
};

class Device {
 public:
  virtual ~Device() = default;
  // "cpu", or "cuda:0 (NVIDIA H200, bus 0000:19:00.0)".
  virtual std::string name() const = 0;
  virtual bool is_cuda() const = 0;
  // True when device pointers may be read and written by the host (CPU memory).
  virtual bool host_accessible() const = 0;

  // Zero-filled. `what` names the buffer in the out-of-memory error. bytes may be 0 (nullptr).
  virtual void* Allocate(size_t bytes, const std::string& what) = 0;
  // Allocate without the zero fill, for a buffer its first use overwrites whole (a pass over
  // the memory saved: the fp32 compute copies of bf16 parameters). Contents undefined.
  virtual void* AllocateUnfilled(size_t bytes, const std::string& what) { return Allocate(bytes, what); }
  // May be called while work queued on the compute stream still uses p (CUDA reuses the memory
  // in stream order, without waiting); work on any other stream that uses p must be complete, or
  // the compute stream ordered after it (Work::WaitStream), before Free.
  virtual void Free(void* p) = 0;
  // Bytes free on the device (0 where unknown).
  virtual uint64_t free_bytes() const { return 0; }
  // Monotonic counts (see DeviceCounters); nothing known by default (the CPU device).
  virtual DeviceCounters counters() const { return {}; }

  virtual void CopyToDevice(void* dst, const void* host_src, size_t bytes) = 0;
  // CopyToDevice without the host waiting: host_src may be reused as soon as this returns, and
  // the copy lands in compute-stream order (CUDA: through a ring of pinned staging slots, a slot
  // reused once an event says its last copy ran; the training inputs' path). CPU: CopyToDevice.
  virtual void CopyToDeviceAsync(void* dst, const void* host_src, size_t bytes) { CopyToDevice(dst, host_src, bytes); }
  virtual void CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void Copy(void* dst, const void* src, size_t bytes) = 0;  // device to device
  virtual void Zero(void* p, size_t bytes) = 0;
  // Blocks until everything queued on the compute stream has finished.
  virtual void Synchronize() = 0;

  // For the MPI communicator's staging of device buffers through host memory.
  virtual std::shared_ptr<DeviceEvent> RecordEvent() = 0;
  virtual void* AllocateHost(size_t bytes) = 0;  // pinned on CUDA
  virtual void FreeHost(void* p) = 0;
  virtual void StageToHost(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void StageToDevice(void* dst, const void* host_src, size_t bytes) = 0;

  virtual Kernels& kernels() = 0;
};

// The CPU device: host memory and the kernels of model/kernels_cpu.h. One per process.
// `pretend_device_memory` makes host_accessible() false so that code paths written for device
// memory (the communicator's staging) can be tested on machines without a GPU.
Device& CpuDevice();
std::unique_ptr<Device> NewCpuDevice(bool pretend_device_memory);

// A device allocation whose bytes are counted in a MemoryLedger while it lives. Move-only.
// The device and the ledger (may be null) must outlive the buffer.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device* device, MemoryLedger* ledger, MemKind kind, size_t bytes, const std::string& what,
               bool zero_filled = true)
      : device_(device), ledger_(ledger), kind_(kind), bytes_(bytes) {
    data_ = zero_filled ? device_->Allocate(bytes, what) : device_->AllocateUnfilled(bytes, what);
    if (ledger_) ledger_->Add(kind_, bytes_);
  }
  ~DeviceBuffer() { Free(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Free();
      std::swap(device_, o.device_), std::swap(ledger_, o.ledger_), std::swap(kind_, o.kind_);
      std::swap(bytes_, o.bytes_), std::swap(data_, o.data_);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void Free() {
    if (data_ == nullptr && bytes_ == 0) return;
    if (data_) device_->Free(data_);
    if (ledger_) ledger_->Sub(kind_, bytes_);
    data_ = nullptr, bytes_ = 0;
  }
  bool empty() const { return data_ == nullptr; }
  size_t bytes() const { return bytes_; }
  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }

 private:
  Device* device_ = nullptr;
  MemoryLedger* ledger_ = nullptr;
  MemKind kind_ = MemKind::kParams;
  size_t bytes_ = 0;
  void* data_ = nullptr;
};

}  // namespace shardgpt
