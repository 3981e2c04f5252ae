// The emulated CUDA runtime: devices, memory, streams as deferred queues, events, copies.
//
// Devices: SHARDGPT_CUDA_EMU_DEVICES emulated GPUs (default 8), each with its own PCI bus id
// and SHARDGPT_CUDA_EMU_MEMORY bytes (default 16 GiB, counted, not reserved); CUDA_VISIBLE_DEVICES
// picks and orders the visible ones as CUDA does. 0 devices: cudaGetDeviceCount fails as on a
// machine without a GPU.
//
// Memory: cudaMalloc is host memory of exactly the bytes asked (so AddressSanitizer sees one
// byte past the end), 256-byte aligned like the real allocator, filled with 0xff (NaN as fp32
// and bf16) because device memory starts uninitialised. Every allocation is registered, so
// copies, memsets, kernel arguments and library calls check that their bytes are device memory.
//
// Streams: a FIFO of host closures that runs only when a host thread waits on it (stream or
// event synchronisation, a blocking copy, an event query), on that thread. Nothing runs behind
// the program's back, so a missing cudaStreamWaitEvent reads data that is not there yet
// instead of working by luck. Copies follow CUDA's documented host semantics: from pageable
// memory to the device the source is captured at the call; from the device to pageable memory
// the call returns when the copy is done; pinned memory is read and written when the copy runs.
//
// Trace (cuda_emu::TraceStart/TraceStop): when on, every queued op, host synchronisation and
// mark is appended under TraceMu() in enqueue order, and every op again when it has run.
//
// Counters (cuda_emu::GetCounters): allocations, frees and host synchronisations the program
// asked for. The runtime's own waits (cudaFree's device synchronisation, cudaMemcpy's wait
// after its copy) go through uncounted internal helpers, so each call counts once.
#include <execinfo.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cuda_emu.h"
#include "cuda_runtime.h"

struct CUstream_st {
  int id = 0;  // position in Emulator::streams: what the trace calls the stream
  int device = 0;
  bool non_blocking = false;
  bool legacy = false;
  struct Op {
    uint64_t index;  // 1-based, in queue order
    std::function<void()> run;
    bool collective;  // an NCCL operation: a query never runs it on its own thread (RunUntil)
  };
  std::mutex queue_mu;  // guards ops, enqueued
  std::deque<Op> ops;
  uint64_t enqueued = 0;
  std::mutex run_mu;  // held by the thread running the queue
  std::atomic<uint64_t> executed{0};
  std::mutex progress_mu;              // with `progress`: executed grew, or run_mu was let go
  std::condition_variable progress;
  std::atomic<std::thread::id> runner{};
  bool destroyed = false;
};

struct CUevent_st {
  CUstream_st* stream = nullptr;  // where it was last recorded (null: never)
  uint64_t target = 0;            // done when stream->executed >= target
  bool timing = true;
  std::chrono::steady_clock::time_point when{};
};

namespace cuda_emu {

namespace {

struct Allocation {
  size_t bytes;
  int device;  // -1: pinned host memory
};

struct Emulator {
  std::mutex mu;  // guards everything below except the streams' own queues
  int physical = 0;
  size_t memory_per_device = 0;
  std::vector<int> visible;  // visible ordinal -> physical index
  std::vector<size_t> used;  // per physical device
  std::map<uintptr_t, Allocation> allocations;
  std::vector<std::unique_ptr<CUstream_st>> streams;  // never freed: events may outlive streams
  std::vector<CUstream_st*> legacy;                   // per physical device
  std::unordered_map<const void*, int> max_dynamic_shared;

  Emulator() {
    physical = EnvInt("SHARDGPT_CUDA_EMU_DEVICES", 8);
    memory_per_device = (size_t)EnvInt("SHARDGPT_CUDA_EMU_MEMORY_MIB", 16 * 1024) << 20;
    used.assign(physical, 0);
    const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
    if (v == nullptr) {
      for (int i = 0; i < physical; i++) visible.push_back(i);
    } else {
      // CUDA's rule: a comma-separated list of indices; an invalid entry ends the list.
      std::string s(v);
      size_t pos = 0;
      while (pos <= s.size() && !s.empty()) {
        const size_t comma = s.find(',', pos);
        const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        char* end = nullptr;
        const long idx = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || idx < 0 || idx >= physical) break;
        visible.push_back((int)idx);
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    }
    for (int d = 0; d < physical; d++) {
      streams.push_back(std::make_unique<CUstream_st>());
      streams.back()->id = d;
      streams.back()->device = d;
      streams.back()->legacy = true;
      legacy.push_back(streams.back().get());
    }
  }
  static int EnvInt(const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::atoi(v) : fallback;
  }
};

Emulator& Emu() {
  static Emulator* e = new Emulator();  // never destroyed: streams may run from exit handlers
  return *e;
}

thread_local int tls_device = 0;  // visible ordinal
thread_local cudaError_t tls_last_error = cudaSuccess;

// GetCounters' figures; constant-initialised, so usable from static constructors too.
std::atomic<uint64_t> g_device_allocations{0}, g_device_frees{0}, g_host_syncs{0};

// The trace; g_tracing is read without the lock (a stale read loses or adds an entry at the
// edges of TraceStart/TraceStop only).
std::atomic<bool> g_tracing{false};
std::mutex& TraceMu() {
  static std::mutex* m = new std::mutex();
  return *m;
}
Trace& TheTrace() {
  static Trace* t = new Trace();
  return *t;
}
void TraceAdd(TraceKind kind, int stream, uint64_t index, const CUstream_st* ref, uint64_t ref_index,
              const char* name) {
  std::lock_guard<std::mutex> l(TraceMu());
  Trace& t = TheTrace();
  TraceOp op;
  op.seq = t.enqueued.size();
  op.kind = kind, op.stream = stream, op.index = index;
  op.ref_stream = ref ? ref->id : -1, op.ref_index = ref_index;
  if (name) op.name = name;
  t.enqueued.push_back(std::move(op));
}
// The host blocks until op `target` of s has run.
void TraceHostSync(const CUstream_st* s, uint64_t target, const char* call) {
  if (g_tracing.load(std::memory_order_relaxed)) TraceAdd(TraceKind::kHostSync, -1, 0, s, target, call);
}
void TraceExecuted(const CUstream_st* s, uint64_t index) {
  if (!g_tracing.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> l(TraceMu());
  TheTrace().executed.emplace_back(s->id, index);
}
// One counted host synchronisation by the CUDA call `what`. With SHARDGPT_CUDA_EMU_TRACE_SYNCS
// set (non-empty, not "0"), each one is also written to stderr with the call stack, so that a
// step's syncs can be traced to their callers (addr2line / c++filt on the frames).
void CountHostSync(const char* what) {
  g_host_syncs++;
  static const bool trace = [] {
    const char* v = std::getenv("SHARDGPT_CUDA_EMU_TRACE_SYNCS");
    return v && *v && std::string(v) != "0";
  }();
  if (!trace) return;
  void* frames[24];
  const int n = backtrace(frames, 24);
  std::fprintf(stderr, "cuda_emu: host sync #%llu: %s (pid %d)\n", (unsigned long long)g_host_syncs.load(), what,
               (int)getpid());
  backtrace_symbols_fd(frames + 1, n - 1, 2);
}

cudaError_t Record(cudaError_t e) {
  if (e != cudaSuccess) tls_last_error = e;
  return e;
}

int Physical(int ordinal) {
  cuda_emu::Emulator& em = Emu();
  return ordinal >= 0 && ordinal < (int)em.visible.size() ? em.visible[ordinal] : -1;
}

CUstream_st* Resolve(cudaStream_t s) {
  if (s != nullptr) return s;
  const int d = Physical(tls_device);
  if (d < 0) Fail("the current device " + std::to_string(tls_device) + " is not a visible GPU");
  return Emu().legacy[d];
}

// Wakes the threads waiting in RunUntil for stream s to progress.
void NotifyProgress(CUstream_st* s) {
  { std::lock_guard<std::mutex> l(s->progress_mu); }
  s->progress.notify_all();
}

// Runs stream s until `target` closures have run. blocking = false: give up (false) when
// another thread is running the queue (cudaEventQuery must not block); and when the next
// closure is an NCCL operation, hand the rest of the run to a new thread and give up: a
// collective whose peers never arrive then hangs on that thread, as a kernel on a GPU, and
// the queries go on answering "not ready" (a watchdog that polls its events sees it hang).
//
// A blocking waiter whose stream another thread is running waits for `executed` to reach its
// target rather than for the queue: that thread may run past the target into a closure that
// waits on a stream this one is running (compute waits for NCCL op q while the watchdog's
// query runs NCCL ops beyond q, one of which waits for a later compute op): a valid order,
// which waiting for the whole queue would deadlock.
bool RunUntil(CUstream_st* s, uint64_t target, bool blocking) {
  if (s->executed.load() >= target) return true;
  if (s->runner.load() == std::this_thread::get_id())
    Fail("a stream waits on work queued after its own current operation (a cycle of stream waits)");
  std::unique_lock<std::mutex> run(s->run_mu, std::defer_lock);
  while (!run.try_lock()) {
    if (!blocking) return s->executed.load() >= target;
    std::unique_lock<std::mutex> l(s->progress_mu);
    // notified after every closure and when the runner lets go; the timeout only re-tries the lock
    s->progress.wait_for(l, std::chrono::milliseconds(1), [&] { return s->executed.load() >= target; });
    if (s->executed.load() >= target) return true;
  }
  s->runner = std::this_thread::get_id();
  bool handed_off = false;
  while (s->executed.load() < target) {
    CUstream_st::Op op;
    {
      std::lock_guard<std::mutex> q(s->queue_mu);
      if (!blocking && s->ops.front().collective) {
        handed_off = true;
        break;
      }
      op = std::move(s->ops.front());
      s->ops.pop_front();
    }
    op.run();
    s->executed = op.index;
    TraceExecuted(s, op.index);
    NotifyProgress(s);
  }
  s->runner = std::thread::id();
  run.unlock();
  NotifyProgress(s);
  if (!handed_off) return true;
  const int device = tls_device;
  std::thread([s, target, device] {
    tls_device = device;
    RunUntil(s, target, true);
  }).detach();
  return false;
}

uint64_t Enqueued(CUstream_st* s) {
  std::lock_guard<std::mutex> q(s->queue_mu);
  return s->enqueued;
}

// The host blocks until op `target` of s has run: traced (TraceHostSync), then run there. The
// CUDA call that blocks counts itself once (CountHostSync), however many streams it waits for.
void HostWait(CUstream_st* s, uint64_t target, const char* call) {
  TraceHostSync(s, target, call);
  RunUntil(s, target, true);
}
// The host blocks until everything queued so far on s has run.
void HostWaitAll(CUstream_st* s, const char* call) { HostWait(s, Enqueued(s), call); }
// The same for every stream `pick` selects, each up to what was queued when the call began.
template <typename Pick>
void HostWaitStreams(Pick pick, const char* call) {
  std::vector<std::pair<CUstream_st*, uint64_t>> picked;
  {
    std::lock_guard<std::mutex> lock(Emu().mu);
    for (auto& s : Emu().streams)
      if (pick(*s)) picked.emplace_back(s.get(), Enqueued(s.get()));
  }
  for (auto& s : picked) HostWait(s.first, s.second, call);
}

// Queues op on s; kind, name and (for waits) the op waited for are what the trace records.
uint64_t Push(CUstream_st* s, std::function<void()> op, TraceKind kind = TraceKind::kHostFunc,
              const char* name = nullptr, const CUstream_st* ref = nullptr, uint64_t ref_index = 0) {
  std::lock_guard<std::mutex> q(s->queue_mu);
  if (s->destroyed) Fail("work queued on a destroyed stream");
  s->ops.push_back(CUstream_st::Op{++s->enqueued, std::move(op), kind == TraceKind::kCollective});
  // under queue_mu, so that the trace's order of one stream's ops is their FIFO order
  if (g_tracing.load(std::memory_order_relaxed)) TraceAdd(kind, s->id, s->enqueued, ref, ref_index, name);
  return s->enqueued;
}

// The legacy default stream waits for the blocking streams of its device and they for it.
void OrderWithLegacy(CUstream_st* s) {
  if (s->non_blocking) return;
  cuda_emu::Emulator& em = Emu();
  std::vector<std::pair<CUstream_st*, uint64_t>> waits;
  {
    std::lock_guard<std::mutex> lock(em.mu);
    if (s->legacy) {
      for (auto& other : em.streams)
        if (!other->legacy && !other->non_blocking && !other->destroyed && other->device == s->device)
          waits.emplace_back(other.get(), Enqueued(other.get()));
    } else {
      waits.emplace_back(em.legacy[s->device], Enqueued(em.legacy[s->device]));
    }
  }
  for (auto& w : waits)
    if (w.second > 0)
      Push(s, [w] { RunUntil(w.first, w.second, true); }, TraceKind::kWait, "legacy stream order", w.first, w.second);
}

std::string Hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

// The allocation holding [p, p+bytes), or null.
const Allocation* Find(const void* p, size_t bytes, uintptr_t* base) {
  cuda_emu::Emulator& em = Emu();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = em.allocations.upper_bound(a);
  if (it == em.allocations.begin()) return nullptr;
  --it;
  if (a + bytes > it->first + it->second.bytes || a < it->first) return nullptr;
  if (bytes == 0 && a == it->first + it->second.bytes && it->second.bytes != 0) {
    // the end of this allocation: inside it
  }
  *base = it->first;
  return &it->second;
}

enum class Where { kDevice, kPinned, kPageable };

Where Classify(const void* p, size_t bytes, int* device) {
  std::lock_guard<std::mutex> lock(Emu().mu);
  uintptr_t base = 0;
  const Allocation* a = Find(p, bytes, &base);
  if (a == nullptr) {
    // Not wholly inside one allocation: if it starts inside a device one, it overruns it.
    const Allocation* start = Find(p, 0, &base);
    if (start != nullptr && start->device >= 0)
      Fail("a copy or memset of " + std::to_string(bytes) + " bytes at " + Hex(p) + " runs past the end of its " +
           std::to_string(start->bytes) + "-byte device allocation at " + Hex(reinterpret_cast<void*>(base)));
    return Where::kPageable;
  }
  *device = a->device;
  return a->device >= 0 ? Where::kDevice : Where::kPinned;
}

}  // namespace

void Fail(const std::string& what) {
  std::fprintf(stderr, "shardgpt CUDA emulation: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

void Enqueue(cudaStream_t s, std::function<void()> op, TraceKind kind, const char* name) {
  CUstream_st* st = Resolve(s);
  OrderWithLegacy(st);
  Push(st, std::move(op), kind, name);
}

const char* TraceKindName(TraceKind k) {
  switch (k) {
    case TraceKind::kKernel: return "kernel";
    case TraceKind::kLibrary: return "library";
    case TraceKind::kCollective: return "collective";
    case TraceKind::kCopy: return "copy";
    case TraceKind::kMemset: return "memset";
    case TraceKind::kEventRecord: return "event_record";
    case TraceKind::kWait: return "wait";
    case TraceKind::kHostFunc: return "host_func";
    case TraceKind::kHostSync: return "host_sync";
    case TraceKind::kMark: return "mark";
  }
  return "?";
}

void TraceStart() {
  std::lock_guard<std::mutex> l(TraceMu());
  TheTrace() = Trace();
  g_tracing = true;
}
Trace TraceStop() {
  std::lock_guard<std::mutex> l(TraceMu());
  g_tracing = false;
  Trace t = std::move(TheTrace());
  TheTrace() = Trace();
  return t;
}
void TraceMark(const std::string& name) {
  if (g_tracing.load(std::memory_order_relaxed)) TraceAdd(TraceKind::kMark, -1, 0, nullptr, 0, name.c_str());
}
int StreamId(cudaStream_t s) { return Resolve(s)->id; }

int DeviceOf(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(Emu().mu);
  uintptr_t base = 0;
  const Allocation* a = Find(p, bytes, &base);
  return a ? a->device : -1;
}

bool IsPinnedHost(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(Emu().mu);
  uintptr_t base = 0;
  const Allocation* a = Find(p, bytes, &base);
  return a && a->device < 0;
}

int StreamDevice(cudaStream_t s) { return Resolve(s)->device; }
int CurrentDevice() { return Physical(tls_device); }

Counters GetCounters() {
  Counters c;
  c.device_allocations = g_device_allocations.load();
  c.device_frees = g_device_frees.load();
  c.host_syncs = g_host_syncs.load();
  return c;
}

void SynchronizeAll() {
  HostWaitStreams([](const CUstream_st&) { return true; }, "synchronize all devices");
}

cudaError_t FuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || value > 227 * 1024) return Record(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(Emu().mu);
  Emu().max_dynamic_shared[func] = value;
  return cudaSuccess;
}

cudaError_t FuncGetAttributes(cudaFuncAttributes* attr, const void* func) {
  if (attr == nullptr || func == nullptr) return Record(cudaErrorInvalidValue);
  std::memset(attr, 0, sizeof(*attr));
  attr->maxThreadsPerBlock = 1024;
  attr->ptxVersion = attr->binaryVersion = 90;
  std::lock_guard<std::mutex> lock(Emu().mu);
  auto it = Emu().max_dynamic_shared.find(func);
  attr->maxDynamicSharedSizeBytes = it == Emu().max_dynamic_shared.end() ? 48 * 1024 : it->second;
  return cudaSuccess;
}

// For fibers.cc: the largest dynamic shared memory a launch of func may ask for.
size_t MaxDynamicShared(const void* func) {
  std::lock_guard<std::mutex> lock(Emu().mu);
  auto it = Emu().max_dynamic_shared.find(func);
  return it == Emu().max_dynamic_shared.end() ? 48 * 1024 : (size_t)it->second;
}
// For fibers.cc: the last-error slot of the calling thread.
void SetLastError(cudaError_t e) { Record(e); }
// For fibers.cc: where a kernel's pointer argument points (device index, -1 pinned, -2 neither).
int PointerArgDevice(const void* p) {
  std::lock_guard<std::mutex> lock(Emu().mu);
  uintptr_t base = 0;
  const Allocation* a = Find(p, 0, &base);
  return a ? a->device : -2;
}

}  // namespace cuda_emu

using cuda_emu::Emu;
using cuda_emu::Record;

// ---- errors ----
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoKernelImageForDevice: return "no kernel image is available for execution on the device";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unknown error";
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoKernelImageForDevice: return "cudaErrorNoKernelImageForDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = cuda_emu::tls_last_error;
  cuda_emu::tls_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return cuda_emu::tls_last_error; }

// ---- devices ----
cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return Record(cudaErrorInvalidValue);
  if (Emu().visible.empty()) return Record(cudaErrorNoDevice);  // *count left unchanged, as CUDA
  *count = (int)Emu().visible.size();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (cuda_emu::Physical(device) < 0) return Record(Emu().visible.empty() ? cudaErrorNoDevice : cudaErrorInvalidDevice);
  cuda_emu::tls_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return Record(cudaErrorInvalidValue);
  if (Emu().visible.empty()) return Record(cudaErrorNoDevice);
  *device = cuda_emu::tls_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  const int d = cuda_emu::Physical(device);
  if (prop == nullptr) return Record(cudaErrorInvalidValue);
  if (d < 0) return Record(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "CUDA emulation on the CPU, for tests (sm_90 limits)");
  prop->totalGlobalMem = Emu().memory_per_device;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->sharedMemPerBlockOptin = 227 * 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024, prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647, prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->major = 9, prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->pciBusID = 0x10 + d;
  prop->l2CacheSize = 50u << 20;
  prop->maxThreadsPerMultiProcessor = 2048;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* bus, int len, int device) {
  const int d = cuda_emu::Physical(device);
  if (bus == nullptr || len <= 0) return Record(cudaErrorInvalidValue);
  if (d < 0) return Record(cudaErrorInvalidDevice);
  std::snprintf(bus, (size_t)len, "0000:%02X:00.0", 0x10 + d);  // domain:bus:device.function, as CUDA
  return cudaSuccess;
}
namespace {
// Runs everything queued so far on the streams of physical device d (not counted: cudaFree's).
void SynchronizeDevice(int d, const char* call) {
  cuda_emu::HostWaitStreams([d](const CUstream_st& s) { return s.device == d; }, call);
}
}  // namespace

cudaError_t cudaDeviceSynchronize() {
  const int d = cuda_emu::Physical(cuda_emu::tls_device);
  if (d < 0) return Record(cudaErrorNoDevice);
  cuda_emu::CountHostSync("cudaDeviceSynchronize");
  SynchronizeDevice(d, "cudaDeviceSynchronize");
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  if (v) *v = 13000;
  return v ? cudaSuccess : Record(cudaErrorInvalidValue);
}
cudaError_t cudaDriverGetVersion(int* v) {
  if (v) *v = 13000;
  return v ? cudaSuccess : Record(cudaErrorInvalidValue);
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  const int d = cuda_emu::Physical(cuda_emu::tls_device);
  if (d < 0) return Record(cudaErrorNoDevice);
  std::lock_guard<std::mutex> lock(Emu().mu);
  if (free_bytes) *free_bytes = Emu().memory_per_device - Emu().used[d];
  if (total_bytes) *total_bytes = Emu().memory_per_device;
  return cudaSuccess;
}

// ---- memory ----
namespace {
cudaError_t Allocate(void** p, size_t bytes, int device) {
  if (p == nullptr) return Record(cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  cuda_emu::Emulator& em = Emu();
  {
    std::lock_guard<std::mutex> lock(em.mu);
    if (device >= 0 && bytes > em.memory_per_device - em.used[device]) return Record(cudaErrorMemoryAllocation);
    if (device >= 0) em.used[device] += bytes;
  }
  void* mem = nullptr;
  if (posix_memalign(&mem, 256, bytes) != 0) {
    std::lock_guard<std::mutex> lock(em.mu);
    if (device >= 0) em.used[device] -= bytes;
    return Record(cudaErrorMemoryAllocation);
  }
  if (device >= 0) std::memset(mem, 0xff, bytes);  // uninitialised device memory
  std::lock_guard<std::mutex> lock(em.mu);
  em.allocations[reinterpret_cast<uintptr_t>(mem)] = cuda_emu::Allocation{bytes, device};
  *p = mem;
  cuda_emu::g_device_allocations++;
  return cudaSuccess;
}
cudaError_t Release(void* p, bool pinned) {
  if (p == nullptr) return cudaSuccess;
  cuda_emu::Emulator& em = Emu();
  int device = -1;
  {
    std::lock_guard<std::mutex> lock(em.mu);
    auto it = em.allocations.find(reinterpret_cast<uintptr_t>(p));
    if (it == em.allocations.end() || (it->second.device < 0) != pinned)
      return Record(pinned ? cudaErrorInvalidValue : cudaErrorInvalidDevicePointer);
    device = it->second.device;
  }
  // cudaFree / cudaFreeHost synchronise: queued work may still use the memory.
  if (pinned) {
    cuda_emu::SynchronizeAll();
  } else {
    SynchronizeDevice(device, "cudaFree");
  }
  std::lock_guard<std::mutex> lock(em.mu);
  auto it = em.allocations.find(reinterpret_cast<uintptr_t>(p));
  if (device >= 0) em.used[device] -= it->second.bytes;
  em.allocations.erase(it);
  std::free(p);
  cuda_emu::g_device_frees++;
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMalloc(void** p, size_t bytes) {
  const int d = cuda_emu::Physical(cuda_emu::tls_device);
  if (d < 0) return Record(cudaErrorNoDevice);
  return Allocate(p, bytes, d);
}
cudaError_t cudaFree(void* p) { return Release(p, false); }
cudaError_t cudaMallocHost(void** p, size_t bytes) { return Allocate(p, bytes, -1); }
cudaError_t cudaFreeHost(void* p) { return Release(p, true); }

// ---- streams and events ----
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  if (s == nullptr) return Record(cudaErrorInvalidValue);
  const int d = cuda_emu::Physical(cuda_emu::tls_device);
  if (d < 0) return Record(cudaErrorNoDevice);
  auto st = std::make_unique<CUstream_st>();
  st->device = d;
  st->non_blocking = (flags & cudaStreamNonBlocking) != 0;
  std::lock_guard<std::mutex> lock(Emu().mu);
  st->id = (int)Emu().streams.size();
  *s = st.get();
  Emu().streams.push_back(std::move(st));
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s == nullptr || s->legacy) return Record(cudaErrorInvalidResourceHandle);
  // Work already queued still completes (as CUDA documents); then the stream is gone.
  cuda_emu::HostWaitAll(s, "cudaStreamDestroy");
  std::lock_guard<std::mutex> q(s->queue_mu);
  if (s->destroyed) return Record(cudaErrorInvalidResourceHandle);
  s->destroyed = true;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  CUstream_st* st = cuda_emu::Resolve(s);
  cuda_emu::CountHostSync("cudaStreamSynchronize");
  cuda_emu::HostWaitAll(st, "cudaStreamSynchronize");
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  CUstream_st* st = cuda_emu::Resolve(s);
  return cuda_emu::RunUntil(st, cuda_emu::Enqueued(st), false) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  if (e == nullptr) return Record(cudaErrorInvalidResourceHandle);
  if (e->stream == nullptr) return cudaSuccess;  // never recorded: nothing to wait for
  CUstream_st* src = e->stream;
  const uint64_t target = e->target;  // the event as recorded now, as CUDA
  CUstream_st* st = cuda_emu::Resolve(s);
  cuda_emu::OrderWithLegacy(st);
  cuda_emu::Push(st, [src, target] { cuda_emu::RunUntil(src, target, true); }, cuda_emu::TraceKind::kWait,
                 "cudaStreamWaitEvent", src, target);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  if (e == nullptr) return Record(cudaErrorInvalidValue);
  *e = new CUevent_st();
  (*e)->timing = (flags & cudaEventDisableTiming) == 0;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  // The queue does not refer to the event (waits copy its target), so it may go now.
  if (e == nullptr) return Record(cudaErrorInvalidResourceHandle);
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (e == nullptr) return Record(cudaErrorInvalidResourceHandle);
  CUstream_st* st = cuda_emu::Resolve(s);
  cuda_emu::OrderWithLegacy(st);
  if (e->timing) {
    e->target = cuda_emu::Push(st, [e] { e->when = std::chrono::steady_clock::now(); },
                               cuda_emu::TraceKind::kEventRecord, "cudaEventRecord");
  } else {
    e->target = cuda_emu::Enqueued(st);
    if (cuda_emu::g_tracing.load(std::memory_order_relaxed))
      cuda_emu::TraceAdd(cuda_emu::TraceKind::kEventRecord, st->id, 0, st, e->target, "cudaEventRecord");
  }
  e->stream = st;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (e == nullptr) return Record(cudaErrorInvalidResourceHandle);
  cuda_emu::CountHostSync("cudaEventSynchronize");
  if (e->stream) cuda_emu::HostWait(e->stream, e->target, "cudaEventSynchronize");
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (e == nullptr) return Record(cudaErrorInvalidResourceHandle);
  if (e->stream == nullptr) return cudaSuccess;
  return cuda_emu::RunUntil(e->stream, e->target, false) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return Record(cudaErrorInvalidValue);
  if (!start->timing || !end->timing) return Record(cudaErrorInvalidResourceHandle);
  if (cudaEventQuery(start) != cudaSuccess || cudaEventQuery(end) != cudaSuccess) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}

// ---- copies ----
namespace {
// Checks a copy's direction against where its pointers are; false with the error set.
bool CheckDirection(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cuda_emu::Where* dw,
                    cuda_emu::Where* sw) {
  int dd = -1, sd = -1;
  *dw = cuda_emu::Classify(dst, bytes, &dd);
  *sw = cuda_emu::Classify(src, bytes, &sd);
  const bool dst_dev = *dw == cuda_emu::Where::kDevice, src_dev = *sw == cuda_emu::Where::kDevice;
  switch (kind) {
    case cudaMemcpyHostToDevice: return dst_dev && !src_dev;
    case cudaMemcpyDeviceToHost: return src_dev && !dst_dev;
    case cudaMemcpyDeviceToDevice: return dst_dev && src_dev;
    case cudaMemcpyHostToHost: return !dst_dev && !src_dev;
    case cudaMemcpyDefault: return true;
  }
  return false;
}
}  // namespace

namespace {
// cudaMemcpyAsync without counting; *blocked: it waited for the stream (pageable destination).
cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s, bool* blocked) {
  *blocked = false;
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return Record(cudaErrorInvalidValue);
  cuda_emu::Where dw, sw;
  if (!CheckDirection(dst, src, bytes, kind, &dw, &sw)) return Record(cudaErrorInvalidValue);
  CUstream_st* st = cuda_emu::Resolve(s);
  if (sw == cuda_emu::Where::kPageable) {
    // Pageable source: staged at the call, so the caller may reuse it at once.
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    cuda_emu::Enqueue(st, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); },
                      cuda_emu::TraceKind::kCopy, "cudaMemcpyAsync");
  } else {
    cuda_emu::Enqueue(st, [dst, src, bytes] { std::memmove(dst, src, bytes); }, cuda_emu::TraceKind::kCopy,
                      "cudaMemcpyAsync");
  }
  // Pageable destination: the call returns once the bytes are there.
  if (dw == cuda_emu::Where::kPageable) {
    *blocked = true;
    cuda_emu::HostWaitAll(st, "cudaMemcpyAsync to pageable memory");
  }
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  bool blocked = false;
  const cudaError_t e = MemcpyAsync(dst, src, bytes, kind, s, &blocked);
  if (blocked) cuda_emu::CountHostSync("cudaMemcpyAsync");
  return e;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  bool blocked = false;
  const cudaError_t e = MemcpyAsync(dst, src, bytes, kind, nullptr, &blocked);
  if (e != cudaSuccess) return e;
  cuda_emu::CountHostSync("cudaMemcpy");  // one blocking call, whether or not the copy itself waited
  cuda_emu::HostWaitAll(cuda_emu::Resolve(nullptr), "cudaMemcpy");
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  if (bytes == 0) return cudaSuccess;
  int d = -1;
  if (cuda_emu::Classify(p, bytes, &d) != cuda_emu::Where::kDevice) return Record(cudaErrorInvalidValue);
  cuda_emu::Enqueue(s, [p, value, bytes] { std::memset(p, value, bytes); }, cuda_emu::TraceKind::kMemset,
                    "cudaMemsetAsync");
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  const cudaError_t e = cudaMemsetAsync(p, value, bytes, nullptr);
  if (e != cudaSuccess) return e;
  cuda_emu::CountHostSync("cudaMemset");
  cuda_emu::HostWaitAll(cuda_emu::Resolve(nullptr), "cudaMemset");
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* user_data) {
  if (fn == nullptr) return Record(cudaErrorInvalidValue);
  cuda_emu::Enqueue(s, [fn, user_data] { fn(user_data); }, cuda_emu::TraceKind::kHostFunc, "cudaLaunchHostFunc");
  return cudaSuccess;
}
