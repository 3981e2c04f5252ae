// The CUDA emulation's runtime (emu/cuda/): that it executes the programming model as defined
// (built-ins, barriers, exact shuffles, launch limits, deferred streams and events with their
// cross-stream meaning, copies' host semantics, CUDA_VISIBLE_DEVICES) and that it stops, naming
// the kernel, on what a GPU would punish: a barrier or a shuffle not reached by everybody, a
// kernel argument that is host memory, a copy past an allocation's end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "cuda_emu.h"
#include "cuda_runtime.h"
#include "model/cuda/device_util.cuh"
#include "model/cuda/launch.cuh"

namespace {

#define CHECK_CUDA(x) ASSERT_EQ((x), cudaSuccess) << #x

// ---- kernels under test ----

// out[global id] = linear id of the thread's (block, thread) coordinates
__global__ void ids_kernel(int* out) {
  const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int bid = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  out[bid * blockDim.x * blockDim.y * blockDim.z + tid] = bid * 1000 + tid;
}

// Reverses each block's slice through shared memory: needs the barrier between write and read.
__global__ void reverse_kernel(int* data) {
  SHARDGPT_SHARED(int, s, [256]);
  const int t = threadIdx.x, base = blockIdx.x * blockDim.x;
  s[t] = data[base + t];
  __syncthreads();
  data[base + t] = s[blockDim.x - 1 - t];
}

// The same without the barrier: reads slots other threads have not written yet.
__global__ void reverse_no_barrier_kernel(int* data) {
  SHARDGPT_SHARED(int, s, [256]);
  const int t = threadIdx.x, base = blockIdx.x * blockDim.x;
  s[t] = data[base + t];
  data[base + t] = s[blockDim.x - 1 - t];
}

// Every block stages the same values (s[t] = 3 t + 1) in static shared memory. Each thread
// records what its slot held before its write (out[0][b][t]) and, after the barrier when
// `barrier`, what its mirror slot holds (out[1][b][t]).
__global__ void stage_alike_kernel(int* out, int barrier) {
  SHARDGPT_SHARED(int, s, [256]);
  const int t = threadIdx.x, n = blockDim.x, b = blockIdx.x;
  out[b * n + t] = s[t];
  s[t] = 3 * t + 1;
  if (barrier) __syncthreads();
  out[(gridDim.x + b) * n + t] = s[n - 1 - t];
}

// out[4 * lane + k]: the four shuffles of lane's value lane * 10 + 1
__global__ void shuffles_kernel(int* out) {
  const int lane = threadIdx.x % 32;
  const int v = lane * 10 + 1;
  out[4 * threadIdx.x + 0] = __shfl_xor_sync(0xffffffffu, v, 5);
  out[4 * threadIdx.x + 1] = __shfl_down_sync(0xffffffffu, v, 3);
  out[4 * threadIdx.x + 2] = __shfl_up_sync(0xffffffffu, v, 2, 8);
  out[4 * threadIdx.x + 3] = __shfl_sync(0xffffffffu, v, 7, 16);
}

__global__ void ballot_kernel(unsigned* out) {
  const unsigned b = __ballot_sync(0xffffffffu, threadIdx.x % 3 == 0);
  const int any = __any_sync(0xffffffffu, threadIdx.x == 17);
  const int all = __all_sync(0xffffffffu, threadIdx.x < 32);
  if (threadIdx.x == 0) out[0] = b, out[1] = any, out[2] = all;
}

// Lanes 0..15 return early, the others shuffle: not reached by every lane.
__global__ void divergent_shuffle_kernel(float* out) {
  if (threadIdx.x % 32 < 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

// Thread 0 skips the barrier.
__global__ void divergent_barrier_kernel(float* out) {
  if (threadIdx.x == 0) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__global__ void dynamic_shared_kernel(float* out, int n) {
  SHARDGPT_DYNAMIC_SHARED(float, smem);
  for (int i = threadIdx.x; i < n; i += blockDim.x) smem[i] = (float)i;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0;
    for (int i = 0; i < n; i++) s += smem[i];
    out[0] = s;
  }
}

// x[i..i+8) += 1 through the 128-bit loads and stores of the element-wise kernels.
__global__ void add_one_vec_kernel(float* x) {
  float v[shardgpt::cuda::kVec];
  const size_t i = threadIdx.x * shardgpt::cuda::kVec;
  shardgpt::cuda::load8(v, x + i);
  for (float& f : v) f += 1.0f;
  shardgpt::cuda::store8(x + i, v);
}

// One warp: three cp.async groups (group g: each lane 16 bytes of src into its slot s[g][lane]),
// then out[(stage * 3 + g) * 32 + lane] = the first int of s[g][lane] as the lane sees it before
// any wait (stage 0), after wait<2> (1), wait<1> (2) and wait<0> (3). Each lane reads only what
// it copied: no barrier is needed.
__global__ void cp_async_kernel(int* out, const int* src, int offset) {
  SHARDGPT_SHARED(__align__(16) int, s, [3][32][4]);
  const int lane = threadIdx.x;
  for (int g = 0; g < 3; g++)
    for (int k = 0; k < 4; k++) s[g][lane][k] = -1;
  for (int g = 0; g < 3; g++) {
    shardgpt::cuda::cp_async16(s[g][lane], src + offset + (g * 32 + lane) * 4);
    shardgpt::cuda::cp_async_commit();
  }
  auto record = [&](int stage) {
    for (int g = 0; g < 3; g++) out[(stage * 3 + g) * 32 + lane] = s[g][lane][0];
  };
  record(0);
  shardgpt::cuda::cp_async_wait<2>();
  record(1);
  shardgpt::cuda::cp_async_wait<1>();
  record(2);
  shardgpt::cuda::cp_async_wait<0>();
  record(3);
}

// Two warps pass three shuffles each; lane 0 of warp w writes, after its k-th, the block's tick
// count into out[3 w + k]: the order in which the two warps advanced.
__global__ void schedule_kernel(int* out) {
  SHARDGPT_SHARED(int, ticks, );
  if (threadIdx.x == 0) ticks = 0;
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int k = 0; k < 3; k++) {
    __shfl_xor_sync(0xffffffffu, lane, 1);
    if (lane == 0) out[3 * warp + k] = ticks++;
  }
}

__global__ void add_one_kernel(float* x, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] += 1.0f;
}

std::vector<int> Download(const int* d, size_t n) {
  std::vector<int> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// ---- tests ----

TEST(CudaEmulation, BuiltInsCoverEveryThreadOfA3dGrid) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  const int n = 12 * 24;
  int* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, n * sizeof(int)));
  SHARDGPT_LAUNCH(ids_kernel, grid, block, 0, nullptr)(d);
  CHECK_CUDA(cudaGetLastError());
  const std::vector<int> h = Download(d, n);
  for (int b = 0; b < 12; b++)
    for (int t = 0; t < 24; t++) ASSERT_EQ(h[b * 24 + t], b * 1000 + t);
  CHECK_CUDA(cudaFree(d));
}

TEST(CudaEmulation, BarrierOrdersSharedMemoryAndItsAbsenceShows) {
  const int blocks = 4, threads = 256, n = blocks * threads;
  std::vector<int> h(n);
  std::iota(h.begin(), h.end(), 0);
  int* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, n * sizeof(int)));
  CHECK_CUDA(cudaMemcpy(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  SHARDGPT_LAUNCH(reverse_kernel, blocks, threads, 0, nullptr)(d);
  std::vector<int> r = Download(d, n);
  for (int b = 0; b < blocks; b++)
    for (int t = 0; t < threads; t++) ASSERT_EQ(r[b * threads + t], b * threads + threads - 1 - t);
  // Without the barrier, threads run to completion one after another in a shuffled order, so
  // some read a slot before its owner has written it (stale shared memory of the last block).
  CHECK_CUDA(cudaMemcpy(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  SHARDGPT_LAUNCH(reverse_no_barrier_kernel, blocks, threads, 0, nullptr)(d);
  r = Download(d, n);
  int wrong = 0;
  for (int b = 0; b < blocks; b++)
    for (int t = 0; t < threads; t++) wrong += r[b * threads + t] != b * threads + threads - 1 - t;
  EXPECT_GT(wrong, 0) << "a missing __syncthreads() went unnoticed";
  CHECK_CUDA(cudaFree(d));
}

// Static shared memory holds the poison pattern (0xff bytes) at every block start, not the
// previous block's values: a missing barrier over data that every block stages alike shows.
TEST(CudaEmulation, StaticSharedIsPoisonedAtEveryBlockStart) {
  const int blocks = 4, threads = 128, n = blocks * threads;
  int* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, 2 * n * sizeof(int)));
  for (int barrier : {1, 0}) {
    SHARDGPT_LAUNCH(stage_alike_kernel, blocks, threads, 0, nullptr)(d, barrier);
    const std::vector<int> r = Download(d, 2 * n);
    int wrong = 0;
    for (int i = 0; i < n; i++) {
      EXPECT_EQ(r[i], -1) << "block " << i / threads << " thread " << i % threads << " (barrier " << barrier << ")";
      wrong += r[n + i] != 3 * (threads - 1 - i % threads) + 1;
    }
    if (barrier) EXPECT_EQ(wrong, 0) << "a block's own writes before its barrier were lost";
    else EXPECT_GT(wrong, 0) << "a missing __syncthreads() over data every block stages alike went unnoticed";
  }
  CHECK_CUDA(cudaFree(d));
}

TEST(CudaEmulation, ShufflesAreExactWithWidthSegments) {
  const int threads = 64;
  int* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, 4 * threads * sizeof(int)));
  SHARDGPT_LAUNCH(shuffles_kernel, 1, threads, 0, nullptr)(d);
  const std::vector<int> h = Download(d, 4 * threads);
  for (int t = 0; t < threads; t++) {
    const int lane = t % 32;
    auto val = [](int l) { return l * 10 + 1; };
    EXPECT_EQ(h[4 * t + 0], val(lane ^ 5)) << t;
    EXPECT_EQ(h[4 * t + 1], lane + 3 < 32 ? val(lane + 3) : val(lane)) << t;      // down: own value past the end
    EXPECT_EQ(h[4 * t + 2], lane % 8 >= 2 ? val(lane - 2) : val(lane)) << t;      // up within segments of 8
    EXPECT_EQ(h[4 * t + 3], val(lane / 16 * 16 + 7)) << t;                        // lane 7 of each 16-segment
  }
  CHECK_CUDA(cudaFree(d));
}

TEST(CudaEmulation, BallotAnyAll) {
  unsigned* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, 3 * sizeof(unsigned)));
  SHARDGPT_LAUNCH(ballot_kernel, 1, 32, 0, nullptr)(d);
  unsigned h[3];
  CHECK_CUDA(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
  unsigned expect = 0;
  for (int i = 0; i < 32; i += 3) expect |= 1u << i;
  EXPECT_EQ(h[0], expect);
  EXPECT_EQ(h[1], 1u);
  EXPECT_EQ(h[2], 1u);
  CHECK_CUDA(cudaFree(d));
}

TEST(CudaEmulationDeathTest, ShuffleNotReachedByEveryLaneNamesTheKernel) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64 * sizeof(float)), cudaSuccess);
  EXPECT_DEATH(
      {
        SHARDGPT_LAUNCH(divergent_shuffle_kernel, 1, 64, 0, nullptr)(d);
        cudaDeviceSynchronize();
      },
      "kernel divergent_shuffle_kernel.*__shfl_xor_sync");
}

TEST(CudaEmulationDeathTest, BarrierNotReachedByEveryThreadNamesTheKernel) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64 * sizeof(float)), cudaSuccess);
  EXPECT_DEATH(
      {
        SHARDGPT_LAUNCH(divergent_barrier_kernel, 1, 64, 0, nullptr)(d);
        cudaDeviceSynchronize();
      },
      "kernel divergent_barrier_kernel.*__syncthreads");
}

// 128-bit accesses: at a 16-byte aligned address they move 4 floats each; at a misaligned one
// a GPU faults ("misaligned address"), so the emulation stops naming the kernel and the access.
TEST(CudaEmulation, VectorAccessesMoveFourFloats) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 68 * sizeof(float)), cudaSuccess);
  std::vector<float> h(68);
  std::iota(h.begin(), h.end(), 0.0f);
  CHECK_CUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  SHARDGPT_LAUNCH(add_one_vec_kernel, 1, 8, 0, nullptr)(d + 4);  // 16 bytes in: aligned
  CHECK_CUDA(cudaMemcpy(h.data(), d, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < 68; i++) EXPECT_EQ(h[i], i + (i >= 4 && i < 68 ? 1.0f : 0.0f)) << i;
  CHECK_CUDA(cudaFree(d));
}

TEST(CudaEmulationDeathTest, MisalignedVectorAccessNamesTheKernel) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 72 * sizeof(float)), cudaSuccess);
  EXPECT_DEATH(
      {
        SHARDGPT_LAUNCH(add_one_vec_kernel, 1, 8, 0, nullptr)(d + 1);
        cudaDeviceSynchronize();
      },
      "kernel add_one_vec_kernel.*load128: a 128-bit access at .* is not 16-byte aligned");
  CHECK_CUDA(cudaFree(d));
}

// Blocks draw one of two schedules: warps in step (each warp's shuffles interleave with the
// other's) or warps running ahead (one warp passes all its shuffles before the other its first),
// so that a warp refilling a shared buffer without a barrier shows in one of them.
TEST(CudaEmulation, WarpsRunInStepOrAhead) {
  int* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 6 * sizeof(int)), cudaSuccess);
  int ahead = 0, in_step = 0;
  for (int launch = 0; launch < 16; launch++) {
    SHARDGPT_LAUNCH(schedule_kernel, 1, 64, 0, nullptr)(out);
    const std::vector<int> t = Download(out, 6);
    const int max0 = std::max({t[0], t[1], t[2]}), min0 = std::min({t[0], t[1], t[2]});
    const int max1 = std::max({t[3], t[4], t[5]}), min1 = std::min({t[3], t[4], t[5]});
    if (max0 < min1 || max1 < min0) ahead++;
    else in_step++;
  }
  EXPECT_GT(ahead, 0);
  EXPECT_GT(in_step, 0);
  CHECK_CUDA(cudaFree(out));
}

// cp.async copies land at one of the two extremes a GPU allows, drawn per block: at the wait
// that leaves their group no longer among the allowed newer ones (never before: a kernel reading
// early reads stale data), or at once when started. Over 16 launches both occur, each exactly.
TEST(CudaEmulation, CpAsyncLandsAtItsWaitOrAtOnce) {
  int *src = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMalloc(&src, 3 * 32 * 4 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, 4 * 3 * 32 * sizeof(int)), cudaSuccess);
  std::vector<int> h(3 * 32 * 4);
  std::iota(h.begin(), h.end(), 0);
  CHECK_CUDA(cudaMemcpy(src, h.data(), h.size() * sizeof(int), cudaMemcpyHostToDevice));
  int at_wait = 0, at_start = 0;
  for (int launch = 0; launch < 16; launch++) {
    SHARDGPT_LAUNCH(cp_async_kernel, 1, 32, 0, nullptr)(out, src, 0);
    const std::vector<int> seen = Download(out, 4 * 3 * 32);
    bool latest = true, earliest = true;
    for (int stage = 0; stage < 4; stage++)
      for (int g = 0; g < 3; g++)
        for (int lane = 0; lane < 32; lane++) {
          const int v = seen[(stage * 3 + g) * 32 + lane], copied = (g * 32 + lane) * 4;
          latest = latest && v == (g < stage ? copied : -1);
          earliest = earliest && v == copied;
        }
    EXPECT_TRUE(latest || earliest) << "launch " << launch << ": neither at the waits nor at once";
    at_wait += latest, at_start += earliest;
  }
  EXPECT_GT(at_wait, 0);
  EXPECT_GT(at_start, 0);
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(out));
}

TEST(CudaEmulationDeathTest, MisalignedCpAsyncNamesTheKernel) {
  int *src = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMalloc(&src, (3 * 32 * 4 + 4) * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, 4 * 3 * 32 * sizeof(int)), cudaSuccess);
  EXPECT_DEATH(
      {
        SHARDGPT_LAUNCH(cp_async_kernel, 1, 32, 0, nullptr)(out, src, 1);
        cudaDeviceSynchronize();
      },
      "kernel cp_async_kernel.*cp.async \\(global source\\): a 128-bit access at .* is not 16-byte aligned");
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(out));
}

TEST(CudaEmulationDeathTest, HostPointerArgumentIsRefused) {
  std::vector<float> host(64);
  EXPECT_DEATH(SHARDGPT_LAUNCH(add_one_kernel, 1, 64, 0, nullptr)(host.data(), 64),
               "kernel add_one_kernel: pointer argument 1 .* not in any device allocation");
}

TEST(CudaEmulationDeathTest, CopyPastTheEndOfAnAllocationIsRefused) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 10 * sizeof(float)), cudaSuccess);
  std::vector<float> host(11);
  EXPECT_DEATH(cudaMemcpy(d, host.data(), 11 * sizeof(float), cudaMemcpyHostToDevice),
               "runs past the end of its 40-byte device allocation");
}

TEST(CudaEmulation, LaunchLimitsAreThoseOfSm90) {
  float* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, 1024 * sizeof(float)));
  SHARDGPT_LAUNCH(add_one_kernel, 1, 1025, 0, nullptr)(d, 1024);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  SHARDGPT_LAUNCH(add_one_kernel, dim3(1, 65536), 32, 0, nullptr)(d, 1024);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  SHARDGPT_LAUNCH(add_one_kernel, 1, dim3(1, 1, 65), 0, nullptr)(d, 1024);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  // 48 KiB of dynamic shared memory without opting in; up to 227 KiB with.
  const int n = 60 * 1024 / 4;
  SHARDGPT_LAUNCH(dynamic_shared_kernel, 1, 256, n * sizeof(float), nullptr)(d, n);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  CHECK_CUDA(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n * 4));
  SHARDGPT_LAUNCH(dynamic_shared_kernel, 1, 256, n * sizeof(float), nullptr)(d, n);
  CHECK_CUDA(cudaGetLastError());
  float s = 0;
  CHECK_CUDA(cudaMemcpy(&s, d, sizeof(float), cudaMemcpyDeviceToHost));
  float expect = 0;  // the kernel's own order of float additions
  for (int i = 0; i < n; i++) expect += (float)i;
  EXPECT_EQ(s, expect);
  EXPECT_EQ(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024),
            cudaErrorInvalidValue);
  CHECK_CUDA(cudaFree(d));
}

TEST(CudaEmulation, StreamsRunOnlyWhenWaitedOnAndEventsOrderThem) {
  const int n = 1000;
  float* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, n * sizeof(float)));
  cudaStream_t a = nullptr, b = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  CHECK_CUDA(cudaMemsetAsync(d, 0, n * sizeof(float), a));
  SHARDGPT_LAUNCH(add_one_kernel, 4, 128, 0, a)(d, n);
  // Nothing has run yet: stream b reads the buffer without waiting for a.
  float* pinned = nullptr;
  CHECK_CUDA(cudaMallocHost(&pinned, n * sizeof(float)));
  CHECK_CUDA(cudaMemcpyAsync(pinned, d, n * sizeof(float), cudaMemcpyDeviceToHost, b));
  CHECK_CUDA(cudaStreamSynchronize(b));
  EXPECT_NE(pinned[0], 1.0f) << "stream b saw stream a's work without an event";
  EXPECT_EQ(cudaStreamQuery(a), cudaSuccess);  // a query makes progress, like a GPU that runs
  // With the event: b's copy waits for a's kernel.
  cudaEvent_t done = nullptr;
  CHECK_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  SHARDGPT_LAUNCH(add_one_kernel, 4, 128, 0, a)(d, n);
  CHECK_CUDA(cudaEventRecord(done, a));
  CHECK_CUDA(cudaStreamWaitEvent(b, done, 0));
  CHECK_CUDA(cudaMemcpyAsync(pinned, d, n * sizeof(float), cudaMemcpyDeviceToHost, b));
  EXPECT_NE(pinned[0], 2.0f) << "a pinned copy ran before its stream was waited on";
  CHECK_CUDA(cudaStreamSynchronize(b));
  for (int i = 0; i < n; i++) ASSERT_EQ(pinned[i], 2.0f) << i;
  // The event's meaning is fixed at record time: work queued on a later does not delay it.
  SHARDGPT_LAUNCH(add_one_kernel, 4, 128, 0, a)(d, n);
  CHECK_CUDA(cudaEventSynchronize(done));
  EXPECT_EQ(cudaStreamQuery(a), cudaSuccess);
  CHECK_CUDA(cudaEventDestroy(done));
  CHECK_CUDA(cudaStreamDestroy(a));
  CHECK_CUDA(cudaStreamDestroy(b));
  CHECK_CUDA(cudaFreeHost(pinned));
  CHECK_CUDA(cudaFree(d));
}

TEST(CudaEmulation, PageableCopiesFollowTheHostSemanticsOfCuda) {
  float* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, sizeof(float)));
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float v = 5.0f;
  CHECK_CUDA(cudaMemcpyAsync(d, &v, sizeof(float), cudaMemcpyHostToDevice, s));
  v = 7.0f;  // a pageable source is captured at the call
  float back = 0;
  CHECK_CUDA(cudaMemcpyAsync(&back, d, sizeof(float), cudaMemcpyDeviceToHost, s));
  EXPECT_EQ(back, 5.0f);  // a pageable destination is written when the call returns
  EXPECT_EQ(cudaMemcpyAsync(&back, &v, sizeof(float), cudaMemcpyHostToDevice, s), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  CHECK_CUDA(cudaStreamDestroy(s));
  CHECK_CUDA(cudaFree(d));
}

TEST(CudaEmulation, DevicesHaveTheirOwnBusIdsAndMemory) {
  int count = 0;
  CHECK_CUDA(cudaGetDeviceCount(&count));
  ASSERT_GE(count, 2) << "the default emulation has 8 GPUs unless CUDA_VISIBLE_DEVICES says otherwise";
  char bus0[32], bus1[32];
  CHECK_CUDA(cudaDeviceGetPCIBusId(bus0, sizeof(bus0), 0));
  CHECK_CUDA(cudaDeviceGetPCIBusId(bus1, sizeof(bus1), 1));
  EXPECT_STRNE(bus0, bus1);
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  EXPECT_NE(std::string(prop.name).find("emulation"), std::string::npos);
  // Memory of GPU 1 is not GPU 0's: a kernel on GPU 0 given it is refused.
  CHECK_CUDA(cudaSetDevice(1));
  float* d1 = nullptr;
  CHECK_CUDA(cudaMalloc(&d1, 16));
  EXPECT_EQ(cuda_emu::DeviceOf(d1, 16), cuda_emu::CurrentDevice());
  CHECK_CUDA(cudaSetDevice(0));
  EXPECT_DEATH(SHARDGPT_LAUNCH(add_one_kernel, 1, 32, 0, nullptr)(d1, 4), "memory of GPU 1, the stream is on GPU 0");
  size_t free_b = 0, total_b = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
  void* huge = nullptr;
  EXPECT_EQ(cudaMalloc(&huge, total_b + 1), cudaErrorMemoryAllocation);
  CHECK_CUDA(cudaSetDevice(1));
  CHECK_CUDA(cudaFree(d1));
  CHECK_CUDA(cudaSetDevice(0));
}

// The trace (cuda_emu::TraceStart): each operation with its stream, FIFO index, kind and name,
// a wait with the op it waits for, a host sync with what it blocks on, marks in enqueue order,
// and every op again once it ran; nothing is recorded while it is off.
TEST(CudaEmulation, TraceRecordsOpsWaitsAndHostSyncsInEnqueueOrder) {
  CHECK_CUDA(cudaSetDevice(0));
  float* x = nullptr;
  CHECK_CUDA(cudaMalloc(&x, 64 * sizeof(float)));
  cudaStream_t a = nullptr, b = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  cudaEvent_t e = nullptr;
  CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  SHARDGPT_LAUNCH(add_one_kernel, 1, 32, 0, a)(x, 64);  // not traced: before TraceStart
  cuda_emu::TraceStart();
  cuda_emu::TraceMark("begin");
  SHARDGPT_LAUNCH(add_one_kernel, 1, 32, 0, a)(x, 64);
  CHECK_CUDA(cudaEventRecord(e, a));
  CHECK_CUDA(cudaStreamWaitEvent(b, e, 0));
  CHECK_CUDA(cudaMemsetAsync(x, 0, 16, b));
  CHECK_CUDA(cudaStreamSynchronize(b));
  const cuda_emu::Trace t = cuda_emu::TraceStop();
  cuda_emu::TraceMark("after the stop");  // not recorded
  const int sa = cuda_emu::StreamId(a), sb = cuda_emu::StreamId(b);
  ASSERT_NE(sa, sb);
  using K = cuda_emu::TraceKind;
  std::vector<K> kinds;
  for (const cuda_emu::TraceOp& op : t.enqueued) kinds.push_back(op.kind);
  ASSERT_EQ(kinds, (std::vector<K>{K::kMark, K::kKernel, K::kEventRecord, K::kWait, K::kMemset, K::kHostSync}));
  for (size_t i = 0; i < t.enqueued.size(); i++) EXPECT_EQ(t.enqueued[i].seq, i);
  const auto& k = t.enqueued[1];
  EXPECT_EQ(k.name, "add_one_kernel");
  EXPECT_EQ(k.stream, sa);
  EXPECT_EQ(k.index, 2u);  // the untraced launch was op 1 of stream a
  EXPECT_EQ(t.enqueued[0].name, "begin");
  EXPECT_EQ(t.enqueued[0].stream, -1);
  const auto& rec = t.enqueued[2];  // non-timing: no op of its own, marks the kernel
  EXPECT_EQ(rec.index, 0u);
  EXPECT_EQ(rec.ref_stream, sa);
  EXPECT_EQ(rec.ref_index, k.index);
  const auto& w = t.enqueued[3];
  EXPECT_EQ(w.stream, sb);
  EXPECT_EQ(w.ref_stream, sa);
  EXPECT_EQ(w.ref_index, k.index);
  const auto& m = t.enqueued[4];
  EXPECT_EQ(m.stream, sb);
  EXPECT_EQ(m.index, w.index + 1);
  const auto& sync = t.enqueued[5];
  EXPECT_EQ(sync.name, "cudaStreamSynchronize");
  EXPECT_EQ(sync.ref_stream, sb);
  EXPECT_EQ(sync.ref_index, m.index);
  // executed: the untraced kernel and the traced one on a (run by b's wait), then b's wait and memset
  std::vector<std::pair<int, uint64_t>> want = {{sa, 1}, {sa, 2}, {sb, w.index}, {sb, m.index}};
  EXPECT_EQ(t.executed, want);
  CHECK_CUDA(cudaEventDestroy(e));
  CHECK_CUDA(cudaStreamDestroy(a));
  CHECK_CUDA(cudaStreamDestroy(b));
  CHECK_CUDA(cudaFree(x));
}

}  // namespace
