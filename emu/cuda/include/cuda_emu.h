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
#include <utility>
#include <vector>

#include "cuda_runtime.h"

namespace cuda_emu {

// What a stream operation (or a host-side trace entry) is, for the trace below.
enum class TraceKind {
  kKernel,       // a kernel launch (name: the kernel)
  kLibrary,      // a library call's work (name: e.g. cublasLtMatmul)
  kCollective,   // an emulated NCCL operation (name: e.g. ncclAllGather)
  kCopy,         // cudaMemcpy(Async)
  kMemset,       // cudaMemset(Async)
  kEventRecord,  // cudaEventRecord; a timing event is a stream op, a non-timing one only marks
                 // the stream's last op (stream-side entry with index 0, ref = the marked op)
  kWait,         // the stream waits for op ref of stream ref_stream (cudaStreamWaitEvent, and the
                 // legacy default stream's implicit ordering)
  kHostFunc,     // cudaLaunchHostFunc or any other closure
  kHostSync,     // host-side: the host blocks until op ref of ref_stream has run (the calls that
                 // GetCounters counts as host_syncs, and cudaFree's device synchronisation)
  kMark,         // host-side: TraceMark(name), a label in the host's enqueue order
};
const char* TraceKindName(TraceKind k);

// Appends `op` to stream s (nullptr: the current device's default stream). It runs, in stream
// order, on whichever host thread next waits on the stream; it may itself wait on other streams
// and may block (an emulated NCCL collective blocks in MPI). kind/name: what the trace calls it.
void Enqueue(cudaStream_t s, std::function<void()> op, TraceKind kind = TraceKind::kHostFunc,
             const char* name = nullptr);

// Opt-in trace of stream operations, for tests of the ORDER of device work (which waits precede
// which kernels, what a collective depends on). Off by default; while off it costs one atomic
// load per operation. TraceStart clears and starts it; TraceStop stops it and returns it.
//   enqueued: every entry in the host's enqueue order (all threads, all streams, one sequence),
//             host-side entries (kHostSync, kMark, non-timing kEventRecord) included;
//   executed: the stream ops in the order their closures FINISHED running (stream, index).
// The emulation runs a stream only when a host thread waits on it, so `executed` is one valid
// execution; what a GPU may overlap follows from `enqueued` alone: two ops may run at the same
// time exactly when neither is ordered before the other by stream order, the waits and the
// host syncs (tests/gpu/overlap_emu_test.cc computes this).
struct TraceOp {
  uint64_t seq = 0;  // position in `enqueued`
  TraceKind kind = TraceKind::kHostFunc;
  int stream = -1;      // StreamId of its stream; -1 for kHostSync and kMark
  uint64_t index = 0;   // 1-based position in its stream's FIFO; 0 when it is not a stream op
  int ref_stream = -1;  // kWait, kHostSync, non-timing kEventRecord: the op it refers to ...
  uint64_t ref_index = 0;  // ... (0: nothing, the stream was empty)
  std::string name;
};
struct Trace {
  std::vector<TraceOp> enqueued;
  std::vector<std::pair<int, uint64_t>> executed;  // (stream id, index)
};
void TraceStart();
Trace TraceStop();
// A host-side label in the enqueue order (e.g. "forward 3 begins"); no-op while not tracing.
void TraceMark(const std::string& name);
// A stable small id of stream s (nullptr: the current device's legacy default stream), as the
// trace names streams.
int StreamId(cudaStream_t s);

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

// A vector access of `bytes` (16: a 128-bit load or store) at p, from a kernel: a GPU faults
// ("misaligned address") unless p is a multiple of `bytes`, so a misaligned one ends the run
// (Fail) naming `what`, the address, the kernel, the block and the thread.
void CheckVectorAccess(const void* p, size_t bytes, const char* what);

// cp.async (sm_80): a 16-byte copy from global to shared memory that does not pass through
// registers and completes asynchronously. Modelled at its latest: each thread's copies are held
// in groups (CpAsyncCommit closes one) and land only when that thread's CpAsyncWait(n) leaves
// at most n newer groups pending, so a kernel that reads a tile before waiting for it (or
// before the barrier after the other threads' waits) reads stale shared memory, as a GPU may.
// Both addresses must be 16-byte aligned (checked as CheckVectorAccess does).
void CpAsync16(void* shared_dst, const void* global_src);
void CpAsyncCommit();
void CpAsyncWait(int newer_groups_left);

// Ends the process: prints "shardgpt CUDA emulation: <what>" on stderr and aborts. For a misuse
// that a real GPU would punish with a crash, a hang or undefined behaviour.
[[noreturn]] void Fail(const std::string& what);

}  // namespace cuda_emu
