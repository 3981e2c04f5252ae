// HSDP on stream-ordered communicators (what NCCL is: one communication stream per rank for the
// shard and the replica group), on the CPU. A test communicator runs every call of a rank's
// communicator family (the world and the groups split from it) one at a time, in issue order, on
// one thread: an emulated stream. As on one NCCL stream, two ranks that issue the two groups'
// collectives in different orders then wait for each other forever, so the test checks:
//  - every rank issues the same sequence of (communicator, collective, count), recorded by the
//    issue hook, while each rank's stream and training thread run with their own random delays
//    (so completion steps, which run whenever a collective happens to be retired, fall at
//    different points per rank: issuing the replica all-reduce from one fails this test);
//  - the results are bitwise those of the same run over plain MPI communicators (the replica
//    all-reduce sees the finished shard: issued right after the reduce-scatter, or for
//    EveryMicroReduceScatter after the accumulate);
//  - nothing hangs (a stream that waits 60 s for one collective ends the job with a message).
// Stages 1 (LastMicroReduceScatter), 2 and 3 (EveryMicroReduceScatter), accumulation 1 and 2,
// the per-param layout and bf16 with an fp32 reduction. Runs at 4 ranks (G = 2, R = 2).
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "model/kernels_cpu.h"
#include "parallel/engine.h"
#include "parallel/mpi_communicator.h"
#include "tests/mpi/engine_harness.h"

namespace shardgpt {
namespace {

using harness::Trajectory;

constexpr int kGlobalBatch = 16, kT = 16, kSteps = 3;
constexpr float kLr = 1e-2f;
const GPTConfig kConfig{2, 2, 32, 16, 256};
const harness::Harness kHarness(kConfig, kGlobalBatch, kT, kSteps, kLr);

int WorldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// One thread running pushed calls one at a time in push order. Before each data-plane call it
// sleeps a pseudo-random 0-2 ms (seeded by the rank), so that collectives complete at different
// times on different ranks.
class EmulatedStream {
 public:
  explicit EmulatedStream(uint64_t seed) : rng_(seed), thread_([this] { Run(); }) {}
  ~EmulatedStream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Push(std::function<void()> f, bool jitter) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({std::move(f), jitter});
    }
    cv_.notify_all();
  }

 private:
  struct Item {
    std::function<void()> f;
    bool jitter;
  };
  void Run() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      if (item.jitter) {
        rng_ = rng_ * 6364136223846793005ull + 1442695040888963407ull;
        std::this_thread::sleep_for(std::chrono::microseconds((rng_ >> 33) % 2000));
      }
      item.f();
    }
  }
  uint64_t rng_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  std::thread thread_;
};

class StreamWork final : public Work {
 public:
  void Wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
  }
  bool IsCompleted() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  Status status() override {
    Wait();
    return status_;
  }
  void Complete(Status s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = std::move(s), done_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

// An MPI communicator whose calls all run on the family's EmulatedStream, each after the one
// issued before it on any communicator of the family (stream_ordered() is true).
class StreamOrderedComm final : public Communicator {
 public:
  StreamOrderedComm(std::unique_ptr<Communicator> inner, std::shared_ptr<EmulatedStream> stream)
      : inner_(std::move(inner)), stream_(std::move(stream)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  bool stream_ordered() const override { return true; }

  std::shared_ptr<Work> AllReduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    NoteIssued(CollKind::kAllReduce, count);
    return Data([=] { return inner_->AllReduce(buf, count, dtype, op); });
  }
  std::shared_ptr<Work> ReduceScatter(const void* send, void* recv, size_t recv_count, DType dtype,
                                      ReduceOp op) override {
    NoteIssued(CollKind::kReduceScatter, recv_count);
    return Data([=] { return inner_->ReduceScatter(send, recv, recv_count, dtype, op); });
  }
  std::shared_ptr<Work> AllGather(const void* send, void* recv, size_t send_count, DType dtype) override {
    NoteIssued(CollKind::kAllGather, send_count);
    return Data([=] { return inner_->AllGather(send, recv, send_count, dtype); });
  }
  std::shared_ptr<Work> Broadcast(void* buf, size_t count, DType dtype, int root) override {
    NoteIssued(CollKind::kBroadcast, count);
    return Data([=] { return inner_->Broadcast(buf, count, dtype, root); });
  }
  std::shared_ptr<Work> AllToAllV(const void* send, const std::vector<size_t>& sc, void* recv,
                                  const std::vector<size_t>& rc, DType dtype) override {
    size_t sent = 0;
    for (size_t c : sc) sent += c;
    NoteIssued(CollKind::kAllToAll, sent);
    return Data([=] { return inner_->AllToAllV(send, sc, recv, rc, dtype); });
  }
  Status Barrier() override {
    return Sync([this] { return inner_->Barrier(); });
  }
  bool AllTrue(bool local) override {
    return Sync([this, local] { return inner_->AllTrue(local); });
  }
  double AllReduceScalar(double value, ReduceOp op) override {
    return Sync([this, value, op] { return inner_->AllReduceScalar(value, op); });
  }
  Status ControlAllGather(const void* send, void* recv, size_t bytes) override {
    return Sync([=] { return inner_->ControlAllGather(send, recv, bytes); });
  }
  Status ControlBroadcast(void* buf, size_t bytes, int root) override {
    return Sync([=] { return inner_->ControlBroadcast(buf, bytes, root); });
  }
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    auto part = Sync([=] { return inner_->Split(color, key); });
    if (!part.ok()) return part.status();
    return std::unique_ptr<Communicator>(new StreamOrderedComm(std::move(part).value(), stream_));
  }
  CommLedger& ledger() override { return inner_->ledger(); }

 private:
  // The collective runs on the stream after everything issued before it; the stream waits for
  // it (up to 60 s: longer means the ranks' issue orders differ, the deadlock under test).
  std::shared_ptr<Work> Data(std::function<std::shared_ptr<Work>()> issue) {
    auto w = std::make_shared<StreamWork>();
    stream_->Push(
        [issue, w] {
          std::shared_ptr<Work> inner = issue();
          const auto t0 = std::chrono::steady_clock::now();
          while (!inner->IsCompleted()) {
            if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) {
              std::fprintf(stderr, "rank %d: a collective waited 60 s on the emulated stream: the ranks issued "
                                   "the groups' collectives in different orders (deadlock)\n", WorldRank());
              std::fflush(stderr);
              MPI_Abort(MPI_COMM_WORLD, 1);
            }
            std::this_thread::sleep_for(std::chrono::microseconds(50));
          }
          w->Complete(inner->status());
        },
        true);
    // and the issuing (training) thread goes on after a random 0-3 ms, so that by its next
    // retire point the collectives issued so far have completed on some ranks and not on others
    host_rng_ = host_rng_ * 6364136223846793005ull + 1442695040888963407ull;
    std::this_thread::sleep_for(std::chrono::microseconds((host_rng_ >> 33) % 3000));
    return w;
  }
  template <typename F>
  auto Sync(F f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto result = task.get_future();
    stream_->Push([&task] { task(); }, false);
    return result.get();
  }

  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<EmulatedStream> stream_;
  uint64_t host_rng_ = 99 + 1000003ull * WorldRank();
};

std::unique_ptr<Communicator> StreamOrderedWorld() {
  return std::make_unique<StreamOrderedComm>(harness::Comm(), std::make_shared<EmulatedStream>(1234 + 77 * WorldRank()));
}

// The sequence of data-plane collectives this thread issues, communicators numbered by first
// appearance (so the numbers mean the same on every rank when the orders agree).
class IssueRecorder {
 public:
  IssueRecorder() : thread_(std::this_thread::get_id()) {
    CollectiveIssueHookSlot() = [this](const Communicator& c, CollKind k, size_t n) {
      if (std::this_thread::get_id() != thread_) return;  // the inner MPI calls, on the stream threads
      auto it = ids_.emplace(&c, static_cast<int>(ids_.size())).first;
      seq_.push_back({it->second, k, n});
    };
  }
  ~IssueRecorder() { CollectiveIssueHookSlot() = nullptr; }
  struct Call {
    int comm;
    CollKind kind;
    size_t count;
  };
  const std::vector<Call>& calls() const { return seq_; }
  uint64_t Hash() const {
    uint64_t h = 1469598103934665603ull;
    for (const Call& c : seq_)
      for (uint64_t v : {uint64_t(c.comm), uint64_t(c.kind), uint64_t(c.count)}) h = (h ^ v) * 1099511628211ull;
    return h;
  }

 private:
  std::thread::id thread_;
  std::map<const Communicator*, int> ids_;
  std::vector<Call> seq_;
};

uint64_t BytesHash(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const uint8_t*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

class HsdpStreamOrdered : public ::testing::TestWithParam<std::tuple<int, int, ShardLayout, bool>> {};

TEST_P(HsdpStreamOrdered, SameIssueOrderOnEveryRankAndTheMpiResult) {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n != 4) GTEST_SKIP() << "runs at 4 ranks";
  SetComputeThreads(1);
  auto [stage, A, shard_layout, bf16] = GetParam();
  EngineOptions eo;
  eo.zero_stage = stage;
  eo.shard_layout = shard_layout;
  eo.shard_group_size = 2;
  if (bf16) eo.dtype = DType::kBF16, eo.reduce_dtype = DType::kF32;

  auto plain = harness::Comm();
  const Trajectory want = harness::RunEngine(kHarness, *plain, eo, A, 1.0f, nullptr);

  auto world = StreamOrderedWorld();
  Trajectory got;
  std::vector<IssueRecorder::Call> calls;
  uint64_t order = 0;
  {
    IssueRecorder rec;
    got = harness::RunEngine(kHarness, *world, eo, A, 1.0f, nullptr);
    calls = rec.calls();
    order = rec.Hash();
  }
  // the same issue sequence on every rank
  const std::vector<uint64_t> orders = AllGatherU64(*plain, {order, calls.size()});
  for (int r = 1; r < n; r++) {
    EXPECT_EQ(orders[2 * r + 1], orders[1]) << "rank " << r << " issued another number of collectives";
    EXPECT_EQ(orders[2 * r], orders[0]) << "rank " << r << " issued the groups' collectives in another order";
  }
  // the replica group was used: one all-reduce per unit and step (stages >= 1 have no other)
  int all_reduces = 0;
  for (const IssueRecorder::Call& c : calls) all_reduces += c.kind == CollKind::kAllReduce ? 1 : 0;
  EXPECT_EQ(all_reduces, static_cast<int>(kHarness.layout.units().size()) * kSteps);
  // bitwise the plain MPI run's results
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t s = 0; s < want.losses.size(); s++) {
    EXPECT_EQ(got.losses[s], want.losses[s]) << "step " << s;
    EXPECT_EQ(got.norms[s], want.norms[s]) << "step " << s;
  }
  EXPECT_EQ(BytesHash(got.params), BytesHash(want.params)) << "parameters differ from the MPI run";
}

INSTANTIATE_TEST_SUITE_P(
    Policies, HsdpStreamOrdered,
    ::testing::Values(std::make_tuple(1, 1, ShardLayout::kFlat, false), std::make_tuple(1, 2, ShardLayout::kPerParam, false),
                      std::make_tuple(2, 1, ShardLayout::kFlat, false), std::make_tuple(2, 2, ShardLayout::kFlat, true),
                      std::make_tuple(3, 1, ShardLayout::kFlat, false), std::make_tuple(3, 2, ShardLayout::kPerParam, false),
                      std::make_tuple(3, 2, ShardLayout::kFlat, true)));

}  // namespace
}  // namespace shardgpt
