// The CUDA emulation's own interface (not part of CUDA): what the emulated libraries
// (cublasLt.h, nccl.h) and the emulation's tests use to reach the emulated runtime.
//
// The emulation (emu/cuda/, build option SHARDGPT_CUDA_EMULATION) runs the CUDA programming
// model on the CPU for tests: device memory is host memory allocated to the exact size, a
// stream is a deferred queue of host closures that runs only when a host thread waits on it
// (cudaStreamSynchronize, cudaEventSynchronize, cudaEventQuery, a blocking copy), kernels run
// their blocks one after another with each block's threads as fibers. See emu/cuda/README.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "cuda_runtime.h"

namespace cuda_emu {

// Appends `op` to stream s (nullptr: the current device's default stream). It runs, in stream
// order, on whichever host thread next waits on the stream; it may itself wait on other streams
// and may block (an emulated NCCL collective blocks in MPI).
void Enqueue(cudaStream_t s, std::function<void()> op);

// The emulated device (0-based physical index) whose cudaMalloc allocation contains the
// bytes [p, p + bytes), or -1 when they are not inside one device allocation. A pointer to
// the end of an allocation with bytes == 0 counts as inside it.
int DeviceOf(const void* p, size_t bytes);
// True when [p, p + bytes) lies inside one cudaMallocHost allocation.
bool IsPinnedHost(const void* p, size_t bytes);

// Device numbers here are PHYSICAL indices of the emulated GPUs (0 .. SHARDGPT_CUDA_EMU_DEVICES-1),
// not the CUDA_VISIBLE_DEVICES-relative ordinals of cudaSetDevice.
// The device a stream belongs to; for nullptr, the calling thread's current device.
int StreamDevice(cudaStream_t s);
// The calling thread's current device (cudaSetDevice's choice, as a physical index).
int CurrentDevice();
// Runs everything queued so far on every stream of every device (cudaFreeHost, finalisers).
void SynchronizeAll();

// What the program asked of the emulated runtime since the process started, counted with
// atomics on every thread (all devices together): what a test asserts when it says "nothing is
// allocated, freed or synchronised with the host inside a step".
//   device_allocations: successful cudaMalloc and cudaMallocHost calls;
//   device_frees:       successful cudaFree and cudaFreeHost calls (their own internal
//                       synchronisation is not a host_sync: it is part of the free);
//   host_syncs:         calls that block the host on device work: cudaStreamSynchronize,
//                       cudaEventSynchronize, cudaDeviceSynchronize, the blocking cudaMemcpy and
//                       cudaMemset, and cudaMemcpyAsync to pageable host memory. Queries
//                       (cudaEventQuery, cudaStreamQuery) do not block and are not counted.
struct Counters {
  uint64_t device_allocations = 0, device_frees = 0, host_syncs = 0;
};
Counters GetCounters();

// Ends the process: prints "shardgpt CUDA emulation: <what>" on stderr and aborts. For a misuse
// that a real GPU would punish with a crash, a hang or undefined behaviour.
[[noreturn]] void Fail(const std::string& what);

}  // namespace cuda_emu
