// The CUDA emulation's cuda_runtime.h: the subset of the CUDA runtime, the kernel built-ins and
// the warp/block intrinsics that shardgpt's .cu files use, executed on the CPU for tests.
// Same names and error codes as CUDA 13; only what is used is declared. What it proves and
// what it cannot: emu/cuda/README.md.
//
// Kernels: __global__ functions become host functions; a launch goes through
// SHARDGPT_LAUNCH (model/cuda/launch.cuh), which here queues the grid on the stream. When the
// stream runs, blocks run one after another in a seeded shuffled order; the threads of a block
// are fibers on one host thread that switch only at __syncthreads() and at warp collectives
// (__shfl_*_sync, __ballot_sync, ...), which must be reached by every thread (resp. every lane)
// or the process aborts naming the kernel.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- qualifiers ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __constant__
// Static shared memory is declared with SHARDGPT_SHARED (model/cuda/launch.cuh), which gives
// each host thread its own copy and fills it with the poison pattern when a block first reaches
// the declaration. A bare __shared__ would keep the previous block's values and hide a missing
// barrier, so it does not compile here.
#define __shared__ static_assert(false, "declare static shared memory with SHARDGPT_SHARED (model/cuda/launch.cuh)");
#define __align__(n) __attribute__((aligned(n)))

// ---- vector types and built-ins ----
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
// Set by the block scheduler before each fiber runs (plain TLS: fibers share their host thread).
extern __thread uint3 threadIdx;
extern __thread uint3 blockIdx;
extern __thread dim3 blockDim;
extern __thread dim3 gridDim;
constexpr int warpSize = 32;

// ---- errors ----
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoKernelImageForDevice = 209,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchFailure = 719,
};
typedef cudaError_t cudaError;
const char* cudaGetErrorString(cudaError_t e);
const char* cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();

// ---- devices ----
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int major, minor;
  int multiProcessorCount;
  int pciDomainID, pciBusID, pciDeviceID;
  size_t l2CacheSize;
  int maxThreadsPerMultiProcessor;
};
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetPCIBusId(char* bus, int len, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaRuntimeGetVersion(int* v);
cudaError_t cudaDriverGetVersion(int* v);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);

// ---- memory ----
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
cudaError_t cudaMalloc(void** p, size_t bytes);
template <typename T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocHost(void** p, size_t bytes);
template <typename T>
cudaError_t cudaMallocHost(T** p, size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFreeHost(void* p);

// ---- streams and events ----
struct CUstream_st;
struct CUevent_st;
typedef CUstream_st* cudaStream_t;
typedef CUevent_st* cudaEvent_t;
constexpr unsigned cudaStreamDefault = 0x0;
constexpr unsigned cudaStreamNonBlocking = 0x1;
constexpr unsigned cudaEventDefault = 0x0;
constexpr unsigned cudaEventBlockingSync = 0x1;
constexpr unsigned cudaEventDisableTiming = 0x2;
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s = nullptr);
typedef void (*cudaHostFn_t)(void* user_data);
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* user_data);

// ---- kernel attributes ----
enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};
struct cudaFuncAttributes {
  size_t sharedSizeBytes, constSizeBytes, localSizeBytes;
  int maxThreadsPerBlock, numRegs, ptxVersion, binaryVersion;
  int maxDynamicSharedSizeBytes;
};
namespace cuda_emu {
cudaError_t FuncSetAttribute(const void* func, cudaFuncAttribute attr, int value);
cudaError_t FuncGetAttributes(cudaFuncAttributes* attr, const void* func);
}  // namespace cuda_emu
template <typename F>
cudaError_t cudaFuncSetAttribute(F* func, cudaFuncAttribute attr, int value) {
  return cuda_emu::FuncSetAttribute(reinterpret_cast<const void*>(func), attr, value);
}
template <typename F>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, F* func) {
  return cuda_emu::FuncGetAttributes(attr, reinterpret_cast<const void*>(func));
}

// ---- device maths (the host's; CUDA's differ in the last ulp for some) ----
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline int __float_as_int(float f) { return static_cast<int>(__float_as_uint(f)); }
inline float __int_as_float(int i) { return __uint_as_float(static_cast<unsigned>(i)); }
template <typename T>
inline T __ldg(const T* p) { return *p; }

// ---- block barrier and warp collectives (emu/cuda/fibers.cc) ----
// Each records its call site so that lanes meeting at different collectives are reported.
namespace cuda_emu {
enum class WarpOp { kShflSync, kShflXor, kShflUp, kShflDown, kBallot, kAny, kAll, kSyncWarp };
// Every lane of the calling thread's warp passes `value` (the low `size` bytes of a 64-bit
// slot); returns what this lane receives. For ballot/any/all, value is the predicate (0/1).
uint64_t WarpCollective(WarpOp op, unsigned mask, uint64_t value, int param, int width, const char* file, int line);
void SyncThreads(const char* file, int line);
// Fills the static shared variable at p (bytes long, this host thread's copy) with the poison
// pattern of uninitialised shared memory (0xff bytes) the first time a thread of the running
// block calls it, and does nothing for the block's other threads. Every thread executes a
// declaration before it can touch the variable, so no thread of the block has written it yet.
void PoisonStaticShared(void* p, size_t bytes);
template <typename T>
uint64_t ToBits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type wider than 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
T FromBits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}
}  // namespace cuda_emu

inline void __syncthreads_at(const char* file, int line) { cuda_emu::SyncThreads(file, line); }
#define __syncthreads() __syncthreads_at(__FILE__, __LINE__)
template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
  return cuda_emu::FromBits<T>(cuda_emu::WarpCollective(cuda_emu::WarpOp::kShflSync, mask, cuda_emu::ToBits(var),
                                                        src_lane, width, file, line));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
  return cuda_emu::FromBits<T>(cuda_emu::WarpCollective(cuda_emu::WarpOp::kShflXor, mask, cuda_emu::ToBits(var),
                                                        lane_mask, width, file, line));
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
  return cuda_emu::FromBits<T>(cuda_emu::WarpCollective(cuda_emu::WarpOp::kShflUp, mask, cuda_emu::ToBits(var),
                                                        (int)delta, width, file, line));
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
  return cuda_emu::FromBits<T>(cuda_emu::WarpCollective(cuda_emu::WarpOp::kShflDown, mask, cuda_emu::ToBits(var),
                                                        (int)delta, width, file, line));
}
inline unsigned __ballot_sync(unsigned mask, int pred, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  return (unsigned)cuda_emu::WarpCollective(cuda_emu::WarpOp::kBallot, mask, pred != 0, 0, 32, file, line);
}
inline int __any_sync(unsigned mask, int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return (int)cuda_emu::WarpCollective(cuda_emu::WarpOp::kAny, mask, pred != 0, 0, 32, file, line);
}
inline int __all_sync(unsigned mask, int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return (int)cuda_emu::WarpCollective(cuda_emu::WarpOp::kAll, mask, pred != 0, 0, 32, file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  cuda_emu::WarpCollective(cuda_emu::WarpOp::kSyncWarp, mask, 0, 0, 32, file, line);
}

// ---- dynamic shared memory and launches (used through model/cuda/launch.cuh) ----
namespace cuda_emu {
// The current block's dynamic shared memory (exactly the launch's bytes, filled with 0xff).
void* DynamicShared();

// One queued grid: runs `body(closure)` for every thread of every block.
struct GridLaunch {
  const char* name;
  const void* func;
  dim3 grid, block;
  size_t shared_bytes;
  void (*body)(void* closure);
  void* closure;
  void (*destroy)(void* closure);
};
// Checks the configuration as sm_90 does (cudaErrorInvalidConfiguration into the last error on
// failure, nothing queued) and that every pointer argument is device memory; queues the grid.
void QueueGrid(const GridLaunch& launch, cudaStream_t stream, const void* const* pointer_args, int num_pointers);

template <typename... P>
class Launcher {
 public:
  Launcher(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream)
      : name_(name), kernel_(kernel), grid_(grid), block_(block), shared_(shared_bytes), stream_(stream) {}
  void operator()(P... args) const {
    struct Closure {
      void (*kernel)(P...);
      std::tuple<P...> args;
    };
    auto* c = new Closure{kernel_, std::tuple<P...>(args...)};
    GridLaunch g{name_, reinterpret_cast<const void*>(kernel_), grid_, block_, shared_,
                 [](void* p) {
                   auto* cl = static_cast<Closure*>(p);
                   std::apply(cl->kernel, cl->args);
                 },
                 c, [](void* p) { delete static_cast<Closure*>(p); }};
    const void* ptrs[sizeof...(P) + 1] = {};
    int n = 0;
    (CollectPointer(args, ptrs, &n), ...);
    QueueGrid(g, stream_, ptrs, n);
  }

 private:
  template <typename T>
  static void CollectPointer(const T& v, const void** out, int* n) {
    if constexpr (std::is_pointer<T>::value) out[(*n)++] = static_cast<const void*>(v);
  }
  const char* name_;
  void (*kernel_)(P...);
  dim3 grid_, block_;
  size_t shared_;
  cudaStream_t stream_;
};
template <typename... P>
Launcher<P...> MakeLauncher(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes,
                            cudaStream_t stream) {
  return Launcher<P...>(name, kernel, grid, block, shared_bytes, stream);
}
}  // namespace cuda_emu
