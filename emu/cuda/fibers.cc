// Kernel execution of the CUDA emulation: a grid's blocks run one after another in a seeded
// shuffled order on the host thread that runs the stream; a block's threads are fibers (Boost
// Context's fcontext: a switch is a few register moves) started in a shuffled order, each
// running until it reaches __syncthreads() or a warp collective, or returns.
//
//   __syncthreads(): the fiber waits until every thread of the block waits at the same call
//     site; a thread that returns while others wait (or wait at another site) aborts the run.
//   warp collectives (full mask only): a lane deposits its value and waits; the 32nd lane of
//   the warp to arrive computes every lane's result exactly (CUDA's definitions, width
//   segments included) and releases them. Lanes at different collectives, or a lane that
//   returns or waits at __syncthreads while others of its warp wait at a shuffle, abort.
// Every abort names the kernel, the block, the thread and the call sites
// (cuda_emu::Fail: "shardgpt CUDA emulation: kernel ...").
//
// Each block draws (from the seeded generator) two schedules, so that a missing barrier shows
// in one of them:
//   warps in step: the lanes a collective releases queue behind every other runnable thread,
//     so all warps advance together; or warps run ahead: they queue first, so one warp runs
//     from a barrier to the next before the others move (a warp that refills a shared buffer
//     others still read, without a barrier between, overwrites it);
//   cp.async copies land at the wait that covers their group (the latest a GPU allows: a read
//     before the wait sees stale data) or at once when started (the earliest: a copy into a
//     buffer others still read lands under them).
//
// Fiber stacks are mmap'ed once per host thread (with a guard page below each) and reused.
// Under AddressSanitizer every switch is announced (__sanitizer_*_switch_fiber).
#include <sys/mman.h>

#include <boost/context/detail/fcontext.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda_emu.h"
#include "cuda_runtime.h"

#if defined(__SANITIZE_ADDRESS__)
#define SHARDGPT_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SHARDGPT_EMU_ASAN 1
#endif
#endif
#ifdef SHARDGPT_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

__thread uint3 threadIdx;
__thread uint3 blockIdx;
__thread dim3 blockDim;
__thread dim3 gridDim;

namespace cuda_emu {

size_t MaxDynamicShared(const void* func);  // runtime.cc
void SetLastError(cudaError_t e);
int PointerArgDevice(const void* p);

namespace {

namespace ctx = boost::context::detail;

#ifdef SHARDGPT_EMU_ASAN
constexpr size_t kStackBytes = size_t{1} << 20;
#else
constexpr size_t kStackBytes = size_t{256} << 10;
#endif
constexpr size_t kGuardBytes = 4096;

enum class State { kRunnable, kAtBarrier, kAtWarp, kDone };

struct Fiber {
  ctx::fcontext_t context = nullptr;
  State state = State::kRunnable;
  uint3 tid{};
  // the collective this lane waits at
  WarpOp op{};
  uint64_t value = 0, result = 0;
  int param = 0, width = 32;
  const char* file = nullptr;
  int line = 0;
  void* asan_fake_stack = nullptr;
  // cp.async copies not landed yet: the open group, then the committed ones, oldest first
  struct AsyncCopy {
    void* dst;
    const void* src;
  };
  std::vector<AsyncCopy> open_group;
  std::deque<std::vector<AsyncCopy>> committed;
};

struct Warp {
  int arrived = 0;  // lanes waiting at the current collective
  int at_barrier = 0;
  int done = 0;
  int first_lane = -1;  // a waiting lane (for messages)
};

struct Block {
  const GridLaunch* launch = nullptr;
  int nthreads = 0;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  std::vector<int> runnable;  // a queue, read from `next`
  size_t next = 0;
  int current = -1;
  ctx::fcontext_t scheduler = nullptr;
  int at_barrier = 0, done = 0;
  const char* barrier_file = nullptr;
  int barrier_line = 0;
  void* shared = nullptr;
  uint64_t generation = 0;  // unique per block run in the process (static shared poisoning)
  std::mt19937_64* rng = nullptr;
  bool warps_run_ahead = false;  // released lanes queue first (see the header comment)
  bool cp_async_at_start = false;  // cp.async copies land when started, not at their wait
  const void* scheduler_stack_bottom = nullptr;
  size_t scheduler_stack_size = 0;
  void* scheduler_fake_stack = nullptr;
};

__thread Block* tls_block = nullptr;

// The pattern of shared memory a block has not written yet (dynamic and static alike).
constexpr unsigned char kSharedPoison = 0xff;

// Block generations: distinct over all host threads, so a generation never repeats.
std::atomic<uint64_t> g_block_generations{0};

// For each static shared variable of this host thread (its address), the generation of the
// block that last poisoned it. Per host thread like the variables themselves: host threads run
// grids concurrently (emulated ranks, the NCCL hand-off thread).
thread_local std::unordered_map<const void*, uint64_t> tls_static_shared;

// Fiber stacks of this host thread, grown to the largest block seen.
struct StackPool {
  std::vector<char*> stacks;
  ~StackPool() {
    for (char* s : stacks) munmap(s, kStackBytes + kGuardBytes);
  }
  char* Get(size_t i) {
    while (stacks.size() <= i) {
      void* m = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
      if (m == MAP_FAILED) Fail("cannot map a fiber stack");
      mprotect(m, kGuardBytes, PROT_NONE);  // a kernel overflowing its stack faults here
      stacks.push_back(static_cast<char*>(m));
    }
    return stacks[i];
  }
};
thread_local StackPool tls_stacks;

std::string Dim(uint3 v) { return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")"; }

[[noreturn]] void BlockFail(const Block& b, int thread, const std::string& what) {
  std::string where = std::string("kernel ") + b.launch->name + ", block " + Dim(blockIdx);
  if (thread >= 0) where += ", thread " + Dim(b.fibers[thread].tid) + " (warp " + std::to_string(thread / 32) + ")";
  Fail(where + ": " + what);
}

// __FILE__ of one header may be two pointers (one per translation unit): compare the text.
bool SameFile(const char* a, const char* b) { return a == b || std::strcmp(a, b) == 0; }

std::string Site(const char* file, int line) {
  std::string f = file ? file : "?";
  const size_t slash = f.rfind('/');
  if (slash != std::string::npos) f = f.substr(slash + 1);
  return f + ":" + std::to_string(line);
}

const char* OpName(WarpOp op) {
  switch (op) {
    case WarpOp::kShflSync: return "__shfl_sync";
    case WarpOp::kShflXor: return "__shfl_xor_sync";
    case WarpOp::kShflUp: return "__shfl_up_sync";
    case WarpOp::kShflDown: return "__shfl_down_sync";
    case WarpOp::kBallot: return "__ballot_sync";
    case WarpOp::kAny: return "__any_sync";
    case WarpOp::kAll: return "__all_sync";
    case WarpOp::kSyncWarp: return "__syncwarp";
  }
  return "?";
}

void AsanStart(void** fake_save, const void* bottom, size_t size) {
#ifdef SHARDGPT_EMU_ASAN
  __sanitizer_start_switch_fiber(fake_save, bottom, size);
#else
  (void)fake_save, (void)bottom, (void)size;
#endif
}
void AsanFinish(void* fake, const void** bottom_old, size_t* size_old) {
#ifdef SHARDGPT_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, bottom_old, size_old);
#else
  (void)fake, (void)bottom_old, (void)size_old;
#endif
}

// From a fiber back to the block's scheduler; returns when the fiber is resumed.
void Yield(Block* b) {
  Fiber& f = b->fibers[b->current];
  AsanStart(&f.asan_fake_stack, b->scheduler_stack_bottom, b->scheduler_stack_size);
  const ctx::transfer_t t = ctx::jump_fcontext(b->scheduler, nullptr);
  b->scheduler = t.fctx;
  AsanFinish(f.asan_fake_stack, nullptr, nullptr);
}

void ThreadExited(Block* b, int me) {
  Fiber& f = b->fibers[me];
  f.state = State::kDone;
  b->done++;
  Warp& w = b->warps[me / 32];
  w.done++;
  if (w.arrived > 0) {
    const Fiber& other = b->fibers[w.first_lane];
    BlockFail(*b, me, "returned while other lanes of its warp wait at " + std::string(OpName(other.op)) + " (" +
                          Site(other.file, other.line) + "): a warp collective not reached by every lane");
  }
  if (b->at_barrier > 0)
    BlockFail(*b, me, "returned while other threads of the block wait at __syncthreads() (" +
                          Site(b->barrier_file, b->barrier_line) + "): a barrier not reached by every thread");
}

void FiberMain(ctx::transfer_t t) {
  Block* b = static_cast<Block*>(t.data);
  b->scheduler = t.fctx;
  AsanFinish(nullptr, &b->scheduler_stack_bottom, &b->scheduler_stack_size);
  b->launch->body(b->launch->closure);
  ThreadExited(b, b->current);
  AsanStart(nullptr, b->scheduler_stack_bottom, b->scheduler_stack_size);  // this fiber ends
  ctx::jump_fcontext(b->scheduler, nullptr);
  std::abort();  // never resumed
}

void MakeRunnable(Block* b, int i) {
  b->fibers[i].state = State::kRunnable;
  b->runnable.push_back(i);
}

// The result of lane `lane` of a resolved collective (all 32 lanes' values in `fibers`).
uint64_t Resolve(const Fiber* lanes, int lane) {
  const Fiber& me = lanes[lane];
  const int width = me.width, base = lane / width * width, rel = lane - base;
  switch (me.op) {
    case WarpOp::kShflSync: return lanes[base + ((me.param % width) + width) % width].value;
    case WarpOp::kShflXor: {
      const int src = lane ^ me.param;
      return src >= base + width || src < base ? me.value : lanes[src].value;  // outside the segment: own
    }
    case WarpOp::kShflUp: return rel - me.param >= 0 ? lanes[lane - me.param].value : me.value;
    case WarpOp::kShflDown: return rel + me.param < width ? lanes[lane + me.param].value : me.value;
    case WarpOp::kBallot: {
      uint64_t bits = 0;
      for (int i = 0; i < 32; i++) bits |= (lanes[i].value & 1u) << i;
      return bits;
    }
    case WarpOp::kAny: {
      for (int i = 0; i < 32; i++)
        if (lanes[i].value) return 1;
      return 0;
    }
    case WarpOp::kAll: {
      for (int i = 0; i < 32; i++)
        if (!lanes[i].value) return 0;
      return 1;
    }
    case WarpOp::kSyncWarp: return 0;
  }
  return 0;
}

void RunBlock(Block* b) {
  // Threads start in a shuffled order: code that needs a barrier it lacks sees it.
  b->runnable.clear();
  b->next = 0;
  for (int i = 0; i < b->nthreads; i++) b->runnable.push_back(i);
  std::shuffle(b->runnable.begin(), b->runnable.end(), *b->rng);
  const uint64_t draw = (*b->rng)();
  b->warps_run_ahead = draw & 1;
  b->cp_async_at_start = (draw >> 1) & 1;
  for (int i = 0; i < b->nthreads; i++) {
    Fiber& f = b->fibers[i];
    char* stack = tls_stacks.Get(i);
#ifdef SHARDGPT_EMU_ASAN
    __asan_unpoison_memory_region(stack + kGuardBytes, kStackBytes);
#endif
    f.context = ctx::make_fcontext(stack + kGuardBytes + kStackBytes, kStackBytes, FiberMain);
    f.state = State::kRunnable;
    f.asan_fake_stack = nullptr;
    f.open_group.clear();
    f.committed.clear();
  }
  for (Warp& w : b->warps) w = Warp();
  b->at_barrier = b->done = 0;
  while (b->next < b->runnable.size()) {
    const int i = b->runnable[b->next++];
    if (b->next > 4096 && b->next * 2 > b->runnable.size()) {  // keep the queue short
      b->runnable.erase(b->runnable.begin(), b->runnable.begin() + (long)b->next);
      b->next = 0;
    }
    b->current = i;
    threadIdx = b->fibers[i].tid;
    char* stack = tls_stacks.Get(i);
    AsanStart(&b->scheduler_fake_stack, stack + kGuardBytes, kStackBytes);
    const ctx::transfer_t t = ctx::jump_fcontext(b->fibers[i].context, b);
    AsanFinish(b->scheduler_fake_stack, nullptr, nullptr);
    b->fibers[i].context = t.fctx;
  }
  if (b->done != b->nthreads) {
    // Everyone waits and nothing can release them (the checks above catch the usual cases).
    for (int i = 0; i < b->nthreads; i++)
      if (b->fibers[i].state != State::kDone)
        BlockFail(*b, i, std::string("deadlock: waits at ") +
                             (b->fibers[i].state == State::kAtBarrier ? "__syncthreads()" : OpName(b->fibers[i].op)) +
                             " (" + Site(b->fibers[i].file, b->fibers[i].line) + ") and nothing can release it");
  }
}

std::atomic<uint64_t> g_launches{0};

uint64_t Seed() {
  static const uint64_t seed = [] {
    const char* s = std::getenv("SHARDGPT_CUDA_EMU_SEED");
    return s && *s ? std::strtoull(s, nullptr, 10) : 1;
  }();
  return seed;
}

void RunGrid(const GridLaunch& g) {
  std::mt19937_64 rng(Seed() * 0x9E3779B97F4A7C15ull + g_launches.fetch_add(1));
  const uint64_t nblocks = (uint64_t)g.grid.x * g.grid.y * g.grid.z;
  std::vector<uint64_t> order(nblocks);
  for (uint64_t i = 0; i < nblocks; i++) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  Block b;
  b.launch = &g;
  b.rng = &rng;
  b.nthreads = (int)(g.block.x * g.block.y * g.block.z);
  b.fibers.resize(b.nthreads);
  b.warps.resize((b.nthreads + 31) / 32);
  for (int i = 0; i < b.nthreads; i++)
    b.fibers[i].tid = uint3{(unsigned)i % g.block.x, (unsigned)i / g.block.x % g.block.y,
                            (unsigned)i / (g.block.x * g.block.y)};
  Block* saved = tls_block;
  const uint3 saved_tid = threadIdx, saved_bid = blockIdx;
  const dim3 saved_bdim = blockDim, saved_gdim = gridDim;
  tls_block = &b;
  blockDim = g.block;
  gridDim = g.grid;
  for (uint64_t k = 0; k < nblocks; k++) {
    const uint64_t id = order[k];
    blockIdx = uint3{(unsigned)(id % g.grid.x), (unsigned)(id / g.grid.x % g.grid.y),
                     (unsigned)(id / ((uint64_t)g.grid.x * g.grid.y))};
    // Dynamic shared memory: exactly the launch's bytes, uninitialised (the poison pattern).
    b.shared = g.shared_bytes ? std::malloc(g.shared_bytes) : nullptr;
    if (b.shared) std::memset(b.shared, kSharedPoison, g.shared_bytes);
    b.generation = ++g_block_generations;
    RunBlock(&b);
    std::free(b.shared);
    b.shared = nullptr;
  }
  tls_block = saved;
  threadIdx = saved_tid, blockIdx = saved_bid, blockDim = saved_bdim, gridDim = saved_gdim;
}

}  // namespace

void CheckVectorAccess(const void* p, size_t bytes, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % bytes == 0) return;
  char addr[32];
  std::snprintf(addr, sizeof(addr), "%p", p);
  const std::string msg = std::string(what) + ": a " + std::to_string(bytes * 8) + "-bit access at " + addr +
                          " is not " + std::to_string(bytes) + "-byte aligned (misaligned address on a GPU)";
  if (tls_block != nullptr) BlockFail(*tls_block, tls_block->current, msg);
  Fail(msg);
}

static Fiber& CurrentFiber(const char* what) {
  if (tls_block == nullptr) Fail(std::string(what) + " used outside a kernel");
  return tls_block->fibers[tls_block->current];
}

void CpAsync16(void* shared_dst, const void* global_src) {
  CheckVectorAccess(shared_dst, 16, "cp.async (shared destination)");
  CheckVectorAccess(global_src, 16, "cp.async (global source)");
  Fiber& f = CurrentFiber("cp.async");
  if (tls_block->cp_async_at_start) std::memcpy(shared_dst, global_src, 16);
  else f.open_group.push_back({shared_dst, global_src});
}

void CpAsyncCommit() {
  Fiber& f = CurrentFiber("cp.async.commit_group");
  f.committed.push_back(std::move(f.open_group));
  f.open_group.clear();
}

void CpAsyncWait(int newer_groups_left) {
  Fiber& f = CurrentFiber("cp.async.wait_group");
  while (f.committed.size() > static_cast<size_t>(std::max(0, newer_groups_left))) {
    for (const Fiber::AsyncCopy& c : f.committed.front()) std::memcpy(c.dst, c.src, 16);
    f.committed.pop_front();
  }
}

void* DynamicShared() {
  if (tls_block == nullptr) Fail("dynamic shared memory used outside a kernel");
  return tls_block->shared;
}

void PoisonStaticShared(void* p, size_t bytes) {
  if (tls_block == nullptr) Fail("static shared memory declared outside a kernel");
  uint64_t& poisoned_by = tls_static_shared[p];
  if (poisoned_by == tls_block->generation) return;
  poisoned_by = tls_block->generation;
  std::memset(p, kSharedPoison, bytes);
}

void SyncThreads(const char* file, int line) {
  Block* b = tls_block;
  if (b == nullptr) Fail("__syncthreads() called outside a kernel (" + Site(file, line) + ")");
  const int me = b->current;
  Fiber& f = b->fibers[me];
  Warp& w = b->warps[me / 32];
  if (b->done > 0)
    BlockFail(*b, me, "__syncthreads() (" + Site(file, line) +
                          ") waits for threads that have returned: a barrier not reached by every thread");
  if (w.arrived > 0) {
    const Fiber& other = b->fibers[w.first_lane];
    BlockFail(*b, me, "waits at __syncthreads() (" + Site(file, line) + ") while lanes of its warp wait at " +
                          OpName(other.op) + " (" + Site(other.file, other.line) + ")");
  }
  if (b->at_barrier > 0 && (b->barrier_line != line || !SameFile(b->barrier_file, file)))
    BlockFail(*b, me, "waits at __syncthreads() (" + Site(file, line) + ") while others wait at another one (" +
                          Site(b->barrier_file, b->barrier_line) + ")");
  f.state = State::kAtBarrier;
  f.file = file, f.line = line;
  b->barrier_file = file, b->barrier_line = line;
  b->at_barrier++;
  w.at_barrier++;
  if (b->at_barrier == b->nthreads) {  // the last one: release everybody, in a shuffled order
    std::vector<int> all(b->nthreads);
    for (int i = 0; i < b->nthreads; i++) all[i] = i;
    std::shuffle(all.begin(), all.end(), *b->rng);
    for (int i : all) MakeRunnable(b, i);  // this one too: it resumes in its turn
    b->at_barrier = 0;
    for (Warp& x : b->warps) x.at_barrier = 0;
  }
  Yield(b);
}

uint64_t WarpCollective(WarpOp op, unsigned mask, uint64_t value, int param, int width, const char* file, int line) {
  Block* b = tls_block;
  if (b == nullptr) Fail(std::string(OpName(op)) + " called outside a kernel (" + Site(file, line) + ")");
  const int me = b->current;
  const int warp = me / 32, lane = me % 32;
  Warp& w = b->warps[warp];
  if (mask != 0xffffffffu)
    BlockFail(*b, me, std::string(OpName(op)) + " (" + Site(file, line) +
                          ") with a partial mask: the emulation runs full-mask collectives only");
  if (b->nthreads - warp * 32 < 32)
    BlockFail(*b, me, std::string(OpName(op)) + " (" + Site(file, line) +
                          ") in a partial warp (the block has " + std::to_string(b->nthreads) +
                          " threads): a full mask names lanes that do not exist");
  if (width < 1 || width > 32 || (width & (width - 1)) != 0)
    BlockFail(*b, me, std::string(OpName(op)) + " width " + std::to_string(width) + " is not a power of 2 <= 32");
  if (w.done > 0)
    BlockFail(*b, me, std::string(OpName(op)) + " (" + Site(file, line) +
                          ") is not reached by every lane: some lanes of the warp have returned");
  if (w.at_barrier > 0)
    BlockFail(*b, me, std::string(OpName(op)) + " (" + Site(file, line) +
                          ") while lanes of its warp wait at __syncthreads() (" + Site(b->barrier_file, b->barrier_line) +
                          ")");
  if (w.arrived > 0) {
    const Fiber& other = b->fibers[w.first_lane];
    if (other.op != op || other.line != line || other.width != width || !SameFile(other.file, file))
      BlockFail(*b, me, "lanes of one warp meet at different collectives: this lane at " + std::string(OpName(op)) +
                            " (" + Site(file, line) + "), lane " + std::to_string(w.first_lane % 32) + " at " +
                            OpName(other.op) + " (" + Site(other.file, other.line) + ")");
  }
  Fiber& f = b->fibers[me];
  f.op = op, f.value = value, f.param = param, f.width = width, f.file = file, f.line = line;
  f.state = State::kAtWarp;
  if (w.arrived == 0) w.first_lane = me;
  if (++w.arrived < 32) {
    Yield(b);
    return f.result;
  }
  // The last lane: every lane's result, then release the others.
  Fiber* lanes = &b->fibers[warp * 32];
  uint64_t results[32];
  for (int l = 0; l < 32; l++) results[l] = Resolve(lanes, l);
  int released[31], n = 0;
  for (int l = 0; l < 32; l++) {
    lanes[l].result = results[l];
    if (l != lane) released[n++] = warp * 32 + l;
  }
  if (b->warps_run_ahead) {  // next in the queue: this warp goes on before the others
    for (int i : released) b->fibers[i].state = State::kRunnable;
    b->runnable.insert(b->runnable.begin() + (long)b->next, released, released + n);
  } else {
    for (int i : released) MakeRunnable(b, i);
  }
  w.arrived = 0;
  f.state = State::kRunnable;
  return f.result;
}

void QueueGrid(const GridLaunch& launch, cudaStream_t stream, const void* const* pointer_args, int num_pointers) {
  const dim3 g = launch.grid, k = launch.block;
  const uint64_t threads = (uint64_t)k.x * k.y * k.z;
  // sm_90 limits (the CUDA programming guide's table for compute capability 9.0).
  const bool ok = g.x >= 1 && g.y >= 1 && g.z >= 1 && g.x <= 2147483647u && g.y <= 65535 && g.z <= 65535 &&
                  k.x >= 1 && k.y >= 1 && k.z >= 1 && k.x <= 1024 && k.y <= 1024 && k.z <= 64 && threads <= 1024;
  if (!ok || launch.shared_bytes > MaxDynamicShared(launch.func)) {
    launch.destroy(launch.closure);
    SetLastError(ok ? cudaErrorInvalidValue : cudaErrorInvalidConfiguration);
    return;
  }
  const int device = StreamDevice(stream);
  for (int i = 0; i < num_pointers; i++) {
    const void* p = pointer_args[i];
    if (p == nullptr) continue;
    const int d = PointerArgDevice(p);
    if (d == -2 || (d >= 0 && d != device)) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%p", p);
      Fail(std::string("kernel ") + launch.name + ": pointer argument " + std::to_string(i + 1) + " (" + buf + ") " +
           (d == -2 ? "is not in any device allocation (host memory?)"
                    : "is memory of GPU " + std::to_string(d) + ", the stream is on GPU " + std::to_string(device)));
    }
  }
  const GridLaunch copy = launch;
  Enqueue(
      stream,
      [copy] {
        RunGrid(copy);
        copy.destroy(copy.closure);
      },
      TraceKind::kKernel, launch.name);
}

}  // namespace cuda_emu
