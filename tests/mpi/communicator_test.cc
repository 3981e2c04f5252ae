// MpiCommunicator on 1..4 ranks: exact results of every collective (fp32 and bf16, sum and
// avg, odd counts and count 0), call-order execution, ring-model ledger, real overlap of
// communication with computation, and the agreement helpers. On a device posing as GPU memory
// (the staging path): collectives with an empty side (0 bytes, null pointers) stage nothing,
// and a staging copy that throws on one rank fails that collective's Work on every rank with
// the same message, nobody hangs and the communicator goes on. The issue hook, and the
// (host, GPU bus id) gather behind NCCL's one-GPU-per-rank check.
//
// Values are chosen exactly representable in bf16 at every partial sum, so results are
// compared with ==. Expected values come from a reference that simulates all ranks in double.
#include "parallel/communicator.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/bf16.h"
#include "model/device.h"
#include "parallel/gpu_binding.h"
#include "parallel/mpi_communicator.h"

namespace shardgpt {
namespace {

const size_t kCounts[] = {0, 1, 7, 1031, 100003};
const DType kDTypes[] = {DType::kF32, DType::kBF16};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg};

std::unique_ptr<MpiCommunicator> MakeComm() {
  auto comm = MpiCommunicator::Create(MPI_COMM_WORLD);
  EXPECT_TRUE(comm.ok()) << comm.status().ToString();
  return comm.ok() ? std::move(comm).value() : nullptr;
}

// Element i of rank r's input, for a test-specific salt: multiples of 0.5 in [-3, 3] times
// (r+1). Sums over ranks are multiples of 0.5 with |sum| <= 30, averages multiples of 0.25
// with |avg| <= 7.5: exact in bf16 (8 significant bits) at every partial sum.
double Input(int rank, size_t i, int salt) {
  const int f = static_cast<int>((i * 7 + static_cast<size_t>(salt) * 3) % 13) - 6;
  return 0.5 * f * (rank + 1);
}

double Reduce(int world, size_t i, int salt, ReduceOp op) {
  double s = 0;
  for (int r = 0; r < world; ++r) s += Input(r, i, salt);
  return op == ReduceOp::kAvg ? s / world : s;
}

// A typed host buffer, read and written as double.
class Buffer {
 public:
  Buffer(DType dtype, size_t count) : dtype_(dtype), bytes_(count * DTypeSize(dtype) + 1) {}
  void* data() { return bytes_.data(); }
  void Set(size_t i, double v) {
    if (dtype_ == DType::kF32) {
      const float f = static_cast<float>(v);
      std::memcpy(&bytes_[i * 4], &f, 4);
    } else {
      const uint16_t b = FloatToBf16(static_cast<float>(v));
      std::memcpy(&bytes_[i * 2], &b, 2);
    }
  }
  double Get(size_t i) const {
    if (dtype_ == DType::kF32) {
      float f;
      std::memcpy(&f, &bytes_[i * 4], 4);
      return f;
    }
    uint16_t b;
    std::memcpy(&b, &bytes_[i * 2], 2);
    return Bf16ToFloat(b);
  }

 private:
  DType dtype_;
  std::vector<char> bytes_;  // +1 byte so data() is never null, even for count 0
};

// Counts elements where got != want; reports the first.
template <typename Want>
size_t CountWrong(const Buffer& b, size_t n, Want want, const char* what) {
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    if (b.Get(i) != want(i)) {
      if (wrong == 0) ADD_FAILURE() << what << ": element " << i << " is " << b.Get(i) << ", want " << want(i);
      ++wrong;
    }
  }
  return wrong;
}

TEST(Communicator, CreateRefusesNullComm) {
  auto comm = MpiCommunicator::Create(MPI_COMM_NULL);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), Status::Code::kInvalidArgument);
}

TEST(Communicator, RankAndWorldMatchMpi) {
  auto comm = MakeComm();
  ASSERT_TRUE(comm);
  int rank = -1, world = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  EXPECT_EQ(comm->rank(), rank);
  EXPECT_EQ(comm->world_size(), world);
}

TEST(Communicator, AllReduceExact) {
  auto comm = MakeComm();
  ASSERT_TRUE(comm);
  const int r = comm->rank(), n = comm->world_size();
  int salt = 0;
  for (DType dt : kDTypes) {
    for (ReduceOp op : kOps) {
      for (size_t count : kCounts) {
        ++salt;
        Buffer buf(dt, count);
        for (size_t i = 0; i < count; ++i) buf.Set(i, Input(r, i, salt));
        auto w = comm->AllReduce(buf.data(), count, dt, op);
        w->Wait();
        EXPECT_TRUE(w->IsCompleted());
        EXPECT_TRUE(w->status().ok()) << w->status().ToString();
        EXPECT_EQ(CountWrong(buf, count, [&](size_t i) { return Reduce(n, i, salt, op); }, "all_reduce"), 0u)
            << DTypeName(dt) << " op " << static_cast<int>(op) << " count " << count;
      }
    }
  }
}

TEST(Communicator, ReduceScatterExact) {
  auto comm = MakeComm();
  ASSERT_TRUE(comm);
  const int r = comm->rank(), n = comm->world_size();
  int salt = 100;
  for (DType dt : kDTypes) {
    for (ReduceOp op : kOps) {
      for (size_t count : kCounts) {
        ++salt;
        // Block b of the send buffer is element range [b*count, (b+1)*count): global index.
        Buffer send(dt, count * n), recv(dt, count);
        for (size_t i = 0; i < count * n; ++i) send.Set(i, Input(r, i, salt));
        for (size_t i = 0; i < count; ++i) recv.Set(i, -99);
        auto w = comm->ReduceScatter(send.data(), recv.data(), count, dt, op);
        w->Wait();
        EXPECT_TRUE(w->status().ok()) << w->status().ToString();
        EXPECT_EQ(CountWrong(recv, count, [&](size_t i) { return Reduce(n, r * count + i, salt, op); },
                             "reduce_scatter"),
                  0u)
            << DTypeName(dt) << " op " << static_cast<int>(op) << " count " << count;
        // The send buffer is input only.
        EXPECT_EQ(CountWrong(send, count * n, [&](size_t i) { return Input(r, i, salt); }, "rs send"), 0u);
      }
    }
  }
}

TEST(Communicator, ReduceScatterIntoOwnBlockOfSend) {
  auto comm = MakeComm();
  ASSERT_TRUE(comm);
  const int r = comm->rank(), n = comm->world_size();
  const size_t count = 1031;
  for (DType dt : kDTypes) {
    Buffer buf(dt, count * n);
    for (size_t i = 0; i < count * n; ++i) buf.Set(i, Input(r, i, 7));
    // recv aliases rank r's block of send (a ZeRO-2 gradient buffer reduced in place).
    char* own = static_cast<char*>(buf.data()) + r * count * DTypeSize(dt);
    auto w = comm->ReduceScatter(buf.data(), own, count, dt, ReduceOp::kAvg);
    EXPECT_TRUE(w->status().ok()) << w->status().ToString();
    EXPECT_EQ(CountWrong(buf, count * n,
                         [&](size_t i) {
                           return i / count == static_cast<size_t>(r) ? Reduce(n, i, 7, ReduceOp::kAvg)
                                                                      : Input(r, i, 7);
                         },
                         "rs in place"),
              0u);
  }
}

TEST(Communicator, AllGatherExact) {
  auto comm = MakeComm();
  ASSERT_TRUE(comm);
  const int r = comm->rank(), n = comm->world_size();
  int salt = 200;
  for (DType dt : kDTypes) {
    for (size_t count : kCounts) {
      ++salt;
      Buffer send(dt, count), recv(dt, count * n);
      for (size_t i = 0; i < count; ++i) send.Set(i, Input(r, i, salt));
      for (size_t i = 0; i < count * n; ++i) recv.Set(i, -99);
      auto w = comm->AllGather(send.data(), recv.data(), count, dt);
      w->Wait();
      EXPECT_TRUE(w->status().ok()) << w->status().ToString();
      EXPECT_EQ(CountWrong(recv, count * n, [&](size_t i) { return Input(static_cast<int>(i / count), i % count, salt); },
                           "all_gather"),
                0u)
          << DTypeName(dt) << " count " << count;
    }
  }
}

TEST(Communicator, AllGatherInPlaceFromOwnBlock) {
  auto comm = MakeComm();
  ASSERT_TRUE(comm);
  const int r = comm->rank(), n = comm->world_size();
  const size_t count = 7;
  for (DType dt : kDTypes) {
    Buffer flat(dt, count * n);
    for (size_t i = 0; i < count * n; ++i) flat.Set(i, i / count == static_cast<size_t>(r) ? Input(r, i % count, 3) : -99);
    const char* own = static_cast<char*>(flat.data()) + r * count * DTypeSize(dt);
    auto w = comm->AllGather(own, flat.data(), count, dt);
    EXPECT_TRUE(w->status().ok()) << w->status().ToString();
    EXPECT_EQ(CountWrong(flat, count * n, [&](size_t i) { return Input(static_cast<int>(i / count), i % count, 3); },
                         "all_gather in place"),
              0u);
  }
  // Any other overlap is refused, on every rank alike, and sends nothing.
  if (n > 1) {
    std::vector<float> flat(count * n);
    comm->ledger().Reset();
    auto w = comm->AllGather(flat.data() + 1, flat.data(), count, DType::kF32);
    EXPECT_TRUE(w->IsCompleted());
    EXPECT_EQ(w->status().code(), Status::Code::kInvalidArgument);
    EXPECT_EQ(comm->ledger().Total().calls, 0u);
  }
}

TEST(Communicator, BroadcastExactFromEveryRoot) {
  auto comm = MakeComm();
  ASSERT_TRUE(comm);
  const int r = comm->rank(), n = comm->world_size();
  int salt = 300;
  for (DType dt : kDTypes) {
    for (size_t count : kCounts) {
      for (int root = 0; root < n; ++root) {
        ++salt;
        Buffer buf(dt, count);
        for (size_t i = 0; i < count; ++i) buf.Set(i, Input(r, i, salt));
        auto w = comm->Broadcast(buf.data(), count, dt, root);
        w->Wait();
        EXPECT_TRUE(w->status().ok()) << w->status().ToString();
        EXPECT_EQ(CountWrong(buf, count, [&](size_t i) { return Input(root, i, salt); }, "broadcast"), 0u)
            << DTypeName(dt) << " count " << count << " root " << root;
      }
    }
  }
}

TEST(Communicator, BroadcastRefusesBadRoot) {
  auto comm = MakeComm();
  ASSERT_TRUE(comm);
  float x = 1;
  for (int root : {-1, comm->world_size()}) {
    auto w = comm->Broadcast(&x, 1, DType::kF32, root);
    EXPECT_TRUE(w->IsCompleted());
    EXPECT_EQ(w->status().code(), Status::Code::kInvalidArgument);
    EXPECT_NE(w->status().message().find("root"), std::string::npos) << w->status().message();
  }
  EXPECT_EQ(comm->ledger()[CollKind::kBroadcast].calls, 0u);
  // The communicator still works afterwards.
  EXPECT_TRUE(comm->Barrier().ok());
}

// Chained asynchronous ops, queued back to back without waiting, each reading what an
// earlier one wrote. Round k: all-gather a (the input of this round) twice into g (2N blocks),
// then reduce-scatter (avg) from g shifted by one block into out[k]: rank r gets block r+1 of
// g, i.e. rank (r+1)%N's a. So out[k] on rank r must equal the initial a of rank (r+k+1)%N,
// which only holds if every op ran after the ones queued before it. g is reused every round.
TEST(Communicator, QueuedOpsRunInCallOrder) {
  auto comm = MakeComm();
  ASSERT_TRUE(comm);
  const int r = comm->rank(), n = comm->world_size();
  const size_t c = 1000;
  const int rounds = 24;
  auto initial = [](int rank, size_t i) { return rank * 1000.0 + static_cast<double>(i % 997); };
  std::vector<float> a0(c);
  for (size_t i = 0; i < c; ++i) a0[i] = static_cast<float>(initial(r, i));
  std::vector<float> g(2 * n * c, -1.0f);
  std::vector<std::vector<float>> out(rounds, std::vector<float>(c, -1.0f));
  std::vector<std::shared_ptr<Work>> works;
  const float* in = a0.data();
  for (int k = 0; k < rounds; ++k) {
    works.push_back(comm->AllGather(in, g.data(), c, DType::kF32));
    works.push_back(comm->AllGather(in, g.data() + n * c, c, DType::kF32));
    works.push_back(comm->ReduceScatter(g.data() + c, out[k].data(), c, DType::kF32, ReduceOp::kAvg));
    in = out[k].data();
  }
  // FIFO completion: whenever a later op is complete, every earlier one is too. Read the
  // later flags first so a completion between two reads cannot fake a violation.
  size_t violations = 0;
  for (;;) {
    bool later_done = false;
    for (size_t j = works.size(); j-- > 0;) {
      const bool done = works[j]->IsCompleted();
      if (later_done && !done) ++violations;
      later_done = later_done || done;
    }
    if (works.front()->IsCompleted() && works.back()->IsCompleted()) break;
    std::this_thread::yield();
  }
  EXPECT_EQ(violations, 0u);
  for (auto& w : works) EXPECT_TRUE(w->status().ok());
  for (int k = 0; k < rounds; ++k) {
    const int src = (r + k + 1) % n;
    size_t wrong = 0;
    for (size_t i = 0; i < c; ++i) wrong += out[k][i] != static_cast<float>(initial(src, i));
    EXPECT_EQ(wrong, 0u) << "round " << k << ": want rank " << src << "'s data";
  }
}

TEST(Communicator, LedgerCountsRingBytesPerKind) {
  auto comm = MakeComm();
  ASSERT_TRUE(comm);
  const uint64_t n = static_cast<uint64_t>(comm->world_size());
  comm->ledger().Reset();
  // Counts chosen not divisible by 2, 3 or 4, so the rounding is exercised.
  const size_t ar = 1031, rs = 7, ag = 13, bc = 101;
  std::vector<float> buf_f(1031 * 4 + 16);
  std::vector<uint16_t> buf_h(1031 * 4 + 16);
  std::vector<float> out_f(1031 * 4 + 16);
  std::vector<uint16_t> out_h(1031 * 4 + 16);
  std::vector<std::shared_ptr<Work>> w;
  w.push_back(comm->AllReduce(buf_f.data(), ar, DType::kF32, ReduceOp::kSum));
  w.push_back(comm->AllReduce(buf_h.data(), ar, DType::kBF16, ReduceOp::kAvg));
  w.push_back(comm->ReduceScatter(buf_f.data(), out_f.data(), rs, DType::kF32, ReduceOp::kSum));
  w.push_back(comm->ReduceScatter(buf_h.data(), out_h.data(), rs, DType::kBF16, ReduceOp::kSum));
  w.push_back(comm->AllGather(buf_f.data(), out_f.data(), ag, DType::kF32));
  w.push_back(comm->AllGather(buf_h.data(), out_h.data(), ag, DType::kBF16));
  w.push_back(comm->Broadcast(buf_f.data(), bc, DType::kF32, 0));
  w.push_back(comm->Broadcast(buf_h.data(), bc, DType::kBF16, static_cast<int>(n - 1)));
  w.push_back(comm->AllReduce(buf_f.data(), 0, DType::kF32, ReduceOp::kSum));  // count 0: a call, 0 bytes
  // Counted at enqueue time: the figures are there before anything completed.
  const CommLedger& L = comm->ledger();
  // Written out from the ring model (the header's table), independently of RingBytes.
  const uint64_t want_ar = (2 * (n - 1) * ar / n) * 4 + (2 * (n - 1) * ar / n) * 2;
  const uint64_t want_rs = (n - 1) * rs * 4 + (n - 1) * rs * 2;
  const uint64_t want_ag = (n - 1) * ag * 4 + (n - 1) * ag * 2;
  const uint64_t want_bc = ((n - 1) * bc / n) * 4 + ((n - 1) * bc / n) * 2;
  EXPECT_EQ(L[CollKind::kAllReduce].bytes_sent, want_ar);
  EXPECT_EQ(L[CollKind::kReduceScatter].bytes_sent, want_rs);
  EXPECT_EQ(L[CollKind::kAllGather].bytes_sent, want_ag);
  EXPECT_EQ(L[CollKind::kBroadcast].bytes_sent, want_bc);
  EXPECT_EQ(L[CollKind::kAllReduce].calls, 3u);
  EXPECT_EQ(L[CollKind::kReduceScatter].calls, 2u);
  EXPECT_EQ(L[CollKind::kAllGather].calls, 2u);
  EXPECT_EQ(L[CollKind::kBroadcast].calls, 2u);
  EXPECT_EQ(L.Total().bytes_sent, want_ar + want_rs + want_ag + want_bc);
  EXPECT_EQ(L.Total().calls, 9u);
  if (n == 1) {
    EXPECT_EQ(L.Total().bytes_sent, 0u);
  }
  if (n == 2) {  // N=2: all-reduce sends exactly S, the others S/2 (divisible cases)
    EXPECT_EQ(CommLedger::RingBytes(CollKind::kAllReduce, 1000, DType::kF32, 2), 4000u);
    EXPECT_EQ(CommLedger::RingBytes(CollKind::kReduceScatter, 500, DType::kF32, 2), 2000u);
  }
  for (auto& x : w) EXPECT_TRUE(x->status().ok()) << x->status().ToString();
  // Control traffic is counted apart and leaves the big collectives untouched.
  EXPECT_EQ(L.control.calls, 0u);
  EXPECT_TRUE(comm->AllTrue(true));
  comm->AllReduceScalar(1.0, ReduceOp::kSum);
  EXPECT_TRUE(comm->Barrier().ok());
  EXPECT_EQ(L.control.calls, 3u);
  EXPECT_EQ(L.control.bytes_sent, sizeof(int) + sizeof(double));
  EXPECT_EQ(L.Total().bytes_sent, want_ar + want_rs + want_ag + want_bc);
  EXPECT_STREQ(CollKindName(CollKind::kAllReduce), "all_reduce");
  EXPECT_STREQ(CollKindName(CollKind::kReduceScatter), "reduce_scatter");
  EXPECT_STREQ(CollKindName(CollKind::kAllGather), "all_gather");
  EXPECT_STREQ(CollKindName(CollKind::kBroadcast), "broadcast");
  comm->ledger().Reset();
  EXPECT_EQ(L.Total().calls, 0u);
  EXPECT_EQ(L.control.calls, 0u);
}

// A large all-reduce is launched, then the calling thread only computes (no MPI calls:
// IsCompleted() reads a flag) until the work completes: the collective progressed while we
// computed. Ordered by a message, not by delays: rank 0 launches, checks that its work is in
// flight (no other rank can have launched yet), then tells the others, which launch only once
// told; on those ranks the caller's last MPI call precedes the launch. The loop's cap is far
// above any machine's time: it only turns a collective that never progresses into a failure.
TEST(Communicator, AllReduceProgressesWhileCallerComputes) {
  auto comm = MakeComm();
  ASSERT_TRUE(comm);
  const int r = comm->rank(), n = comm->world_size();
  const size_t count = size_t{2} << 20;  // 8 MB of fp32
  std::vector<float> buf(count, static_cast<float>(r + 1));
  std::vector<float> scratch(4096, 1.0f);
  const double cap_s = 240.0;
  constexpr int kLaunchedTag = 7301;
  ASSERT_TRUE(comm->Barrier().ok());

  using Clock = std::chrono::steady_clock;
  char token = 1;
  if (r != 0) MPI_Recv(&token, 1, MPI_CHAR, 0, kLaunchedTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  const auto t0 = Clock::now();
  auto work = comm->AllReduce(buf.data(), count, DType::kF32, ReduceOp::kSum);
  if (r == 0 && n > 1) {
    EXPECT_FALSE(work->IsCompleted()) << "completed before the other ranks had launched it";
    for (int p = 1; p < n; ++p) MPI_Send(&token, 1, MPI_CHAR, p, kLaunchedTag, MPI_COMM_WORLD);
  }
  double elapsed = 0;
  uint64_t blocks = 0;
  float acc = 0;
  while (!work->IsCompleted()) {
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    if (elapsed > cap_s) break;
    for (int rep = 0; rep < 8; ++rep) {  // pure computation
      for (float& s : scratch) {
        s = s * 0.999f + 0.001f;
        acc += s;
      }
    }
    ++blocks;
  }
  const bool completed_while_computing = work->IsCompleted();
  elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  volatile float sink = acc;  // keeps the computation alive
  (void)sink;
  EXPECT_TRUE(completed_while_computing) << "the all-reduce did not complete within " << cap_s
                                         << " s of computation";
  work->Wait();
  EXPECT_TRUE(work->status().ok()) << work->status().ToString();
  const float want = static_cast<float>(n * (n + 1) / 2);
  size_t wrong = 0;
  for (float v : buf) wrong += v != want;
  EXPECT_EQ(wrong, 0u);
  if (r == 0) {
    std::printf("[overlap] np=%d: rank 0's 8 MB all-reduce completed %.1f ms after launch, %llu compute blocks "
                "done meanwhile\n",
                n, elapsed * 1e3, static_cast<unsigned long long>(blocks));
  }
}

TEST(Communicator, AllTrueAgrees) {
  auto comm = MakeComm();
  ASSERT_TRUE(comm);
  const int r = comm->rank(), n = comm->world_size();
  EXPECT_TRUE(comm->AllTrue(true));
  EXPECT_FALSE(comm->AllTrue(false));
  for (int bad = 0; bad < n; ++bad) {
    EXPECT_FALSE(comm->AllTrue(r != bad)) << "rank " << bad << " said false";
  }
  EXPECT_TRUE(comm->AllTrue(true));
}

TEST(Communicator, AllReduceScalarSumAndAvg) {
  auto comm = MakeComm();
  ASSERT_TRUE(comm);
  const int r = comm->rank(), n = comm->world_size();
  EXPECT_EQ(comm->AllReduceScalar(r + 1.0, ReduceOp::kSum), n * (n + 1) / 2.0);
  EXPECT_EQ(comm->AllReduceScalar(r + 1.0, ReduceOp::kAvg), (n + 1) / 2.0);
}

TEST(Communicator, BlockingHelpersWaitForQueuedWork) {
  auto comm = MakeComm();
  ASSERT_TRUE(comm);
  const int n = comm->world_size();
  std::vector<float> buf(1 << 16, 1.0f);
  auto w = comm->AllReduce(buf.data(), buf.size(), DType::kF32, ReduceOp::kSum);
  // Through the same FIFO: when the scalar comes back, the earlier all-reduce is complete.
  EXPECT_EQ(comm->AllReduceScalar(1.0, ReduceOp::kSum), static_cast<double>(n));
  EXPECT_TRUE(w->IsCompleted());
  EXPECT_EQ(buf.back(), static_cast<float>(n));
}

TEST(Communicator, DestructorDrainsQueue) {
  const int n = [] {
    int s = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    return s;
  }();
  std::vector<float> buf(1 << 16, 1.0f);
  std::shared_ptr<Work> w;
  {
    auto comm = MakeComm();
    ASSERT_TRUE(comm);
    for (int k = 0; k < 4; ++k) w = comm->AllReduce(buf.data(), buf.size(), DType::kF32, ReduceOp::kSum);
  }  // destroyed with work queued
  EXPECT_TRUE(w->IsCompleted());
  EXPECT_EQ(buf[0], static_cast<float>(n * n * n * n));
}

// No message outlives its communicator. Open MPI's ob1 files a message that reaches a rank after
// the rank freed its communicator on one process-wide list of messages "for communicators not
// yet created", which the next communicator given the same context id adopts (a message nobody
// sent on it), and which a thread creating a communicator walks unlocked while another thread's
// progress appends to it (a SEGV in mca_pml_ob1_add_comm under MPI_Comm_dup). The watchdog's
// arrival notes could be such messages. So after every rank destroyed an MpiCommunicator,
// no message addressed to it may remain: fresh duplicates of the world, which take the freed
// context ids (Open MPI hands out the lowest free one), hold none. A communicator used for one
// call leaves one note per peer with sequence number 0, the first a new communicator expects,
// so an adopted note is visible to MPI_Iprobe. Whether a late note would arrive depends on
// scheduling, so the check runs several rounds.
TEST(Communicator, NoMessageOutlivesItsCommunicator) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world < 2) GTEST_SKIP() << "needs 2 or more ranks";
  int stray_rounds = 0;
  for (int round = 0; round < 400; ++round) {
    {
      auto comm = MakeComm();
      ASSERT_TRUE(comm);
      ASSERT_TRUE(comm->Barrier().ok());
    }  // destroyed right after its one call
    MPI_Barrier(MPI_COMM_WORLD);  // every rank destroyed it; messages already sent are in
    MPI_Comm fresh[3];
    for (MPI_Comm& f : fresh) MPI_Comm_dup(MPI_COMM_WORLD, &f);
    int stray = 0;
    for (MPI_Comm& f : fresh) {
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, f, &flag, MPI_STATUS_IGNORE);
      stray |= flag;
    }
    for (MPI_Comm& f : fresh) MPI_Comm_free(&f);
    int any = 0;  // every rank decides the same (an assertion on one rank alone would hang the others)
    MPI_Allreduce(&stray, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    stray_rounds += any;
  }
  EXPECT_EQ(stray_rounds, 0) << "rounds (of 400) in which a new communicator held a message sent "
                                "to a destroyed MpiCommunicator";
  // ... and the side channels kept back for that are freed, not piling up (every peer's closing
  // note is in once all ranks passed a barrier after destroying; a few may still be on their way)
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_LE(MpiCommunicator::RetiredChannels(), 4u);
}

// ---- the staging path (a device whose memory the host cannot address) ----

std::unique_ptr<MpiCommunicator> MakeStagedComm(Device* device) {
  auto comm = MpiCommunicator::Create(MPI_COMM_WORLD, device);
  EXPECT_TRUE(comm.ok()) << comm.status().ToString();
  return comm.ok() ? std::move(comm).value() : nullptr;
}

std::vector<float> ReadBack(Device& dev, const DeviceBuffer& b, size_t n) {
  std::vector<float> out(n);
  if (n) dev.CopyToHost(out.data(), b.data(), n * sizeof(float));
  return out;
}

// Collectives where one side has no bytes: a rank that sends nothing (null send) or receives
// nothing (null recv, or a real buffer with count 0), empty shards (count 0) with null or real
// pointers. Only real spans may be staged; the staged collectives after them must still be right
// (a staging area sized from the distance between a null pointer and a buffer was not).
TEST(CommunicatorStaged, EmptySidesStageNothing) {
  std::unique_ptr<Device> dev = NewCpuDevice(/*pretend_device_memory=*/true);
  auto comm = MakeStagedComm(dev.get());
  ASSERT_TRUE(comm);
  const int r = comm->rank(), n = comm->world_size();
  // all-to-all-v: rank 0 sends nothing, rank n-1 receives nothing, every other pair j -> k sends j+k+1
  auto count = [n](int from, int to) -> size_t { return from == 0 || to == n - 1 ? 0 : size_t(from + to + 1); };
  auto value = [](int from, int to, size_t k) { return static_cast<float>(from * 1000 + to * 100 + k); };
  std::vector<size_t> sc(n), rc(n);
  size_t s_total = 0, r_total = 0;
  for (int j = 0; j < n; j++) sc[j] = count(r, j), rc[j] = count(j, r), s_total += sc[j], r_total += rc[j];
  DeviceBuffer send(dev.get(), nullptr, MemKind::kComm, s_total * sizeof(float), "send");  // null when empty
  DeviceBuffer recv(dev.get(), nullptr, MemKind::kComm, std::max<size_t>(r_total, 16) * sizeof(float), "recv");
  std::vector<float> host;
  for (int j = 0; j < n; j++)
    for (size_t k = 0; k < sc[j]; k++) host.push_back(value(r, j, k));
  if (s_total) dev->CopyToDevice(send.data(), host.data(), s_total * sizeof(float));
  EXPECT_TRUE(comm->AllToAllV(send.data(), sc, recv.data(), rc, DType::kF32)->status().ok());
  const std::vector<float> got = ReadBack(*dev, recv, r_total);
  size_t at = 0, wrong = 0;
  for (int j = 0; j < n; j++)
    for (size_t k = 0; k < rc[j]; k++) wrong += got[at++] != value(j, r, k);
  EXPECT_EQ(wrong, 0u) << "all-to-all-v with empty sides";
  // and with the empty sides' pointers null
  EXPECT_TRUE(comm->AllToAllV(send.data(), sc, r_total ? recv.data() : nullptr, rc, DType::kF32)->status().ok());

  // empty shards: count 0 with one real and one null pointer, each way
  DeviceBuffer real(dev.get(), nullptr, MemKind::kComm, 64 * sizeof(float), "real");
  EXPECT_TRUE(comm->ReduceScatter(real.data(), nullptr, 0, DType::kF32, ReduceOp::kAvg)->status().ok());
  EXPECT_TRUE(comm->ReduceScatter(nullptr, real.data(), 0, DType::kBF16, ReduceOp::kSum)->status().ok());
  EXPECT_TRUE(comm->AllGather(nullptr, real.data(), 0, DType::kF32)->status().ok());
  EXPECT_TRUE(comm->AllGather(real.data(), nullptr, 0, DType::kF32)->status().ok());
  EXPECT_TRUE(comm->AllReduce(nullptr, 0, DType::kF32, ReduceOp::kSum)->status().ok());
  EXPECT_TRUE(comm->Broadcast(nullptr, 0, DType::kF32, 0)->status().ok());

  // real staged collectives afterwards: in-place reduce-scatter and all-gather, an all-reduce
  const size_t shard = 37;
  DeviceBuffer flat(dev.get(), nullptr, MemKind::kComm, shard * n * sizeof(float), "flat");
  std::vector<float> in(shard * n);
  for (size_t i = 0; i < in.size(); i++) in[i] = static_cast<float>(Input(r, i, 5));
  dev->CopyToDevice(flat.data(), in.data(), in.size() * sizeof(float));
  float* own = flat.as<float>() + r * shard;
  EXPECT_TRUE(comm->ReduceScatter(flat.data(), own, shard, DType::kF32, ReduceOp::kSum)->status().ok());
  EXPECT_TRUE(comm->AllGather(own, flat.data(), shard, DType::kF32)->status().ok());
  const std::vector<float> out = ReadBack(*dev, flat, shard * n);
  wrong = 0;
  for (size_t i = 0; i < out.size(); i++) wrong += out[i] != static_cast<float>(Reduce(n, i, 5, ReduceOp::kSum));
  EXPECT_EQ(wrong, 0u) << "staged reduce-scatter + all-gather after the empty ones";
  EXPECT_TRUE(comm->AllReduce(flat.data(), shard * n, DType::kF32, ReduceOp::kAvg)->status().ok());
  EXPECT_TRUE(comm->Barrier().ok());
}

// A device posing as GPU memory whose staging copies, or the wait for the producer event, throw
// (as CudaDevice does on a CUDA error) on the nth call, counted from 1. Everything else forwards.
class FaultyDevice final : public Device {
 public:
  enum class Fault { kNone, kStageToHost, kStageToDevice, kEventWait };
  FaultyDevice(Fault fault, int nth) : inner_(NewCpuDevice(true)), fault_(fault), nth_(nth) {}
  std::string name() const override { return "faulty " + inner_->name(); }
  bool is_cuda() const override { return false; }
  bool host_accessible() const override { return false; }
  void* Allocate(size_t bytes, const std::string& what) override { return inner_->Allocate(bytes, what); }
  void Free(void* p) override { inner_->Free(p); }
  void CopyToDevice(void* d, const void* h, size_t b) override { inner_->CopyToDevice(d, h, b); }
  void CopyToHost(void* h, const void* d, size_t b) override { inner_->CopyToHost(h, d, b); }
  void Copy(void* d, const void* s, size_t b) override { inner_->Copy(d, s, b); }
  void Zero(void* p, size_t b) override { inner_->Zero(p, b); }
  void Synchronize() override { inner_->Synchronize(); }
  std::shared_ptr<DeviceEvent> RecordEvent() override {
    return std::make_shared<Event>(this, inner_->RecordEvent());
  }
  void* AllocateHost(size_t bytes) override { return inner_->AllocateHost(bytes); }
  void FreeHost(void* p) override { inner_->FreeHost(p); }
  void StageToHost(void* h, const void* d, size_t b) override {
    Maybe(Fault::kStageToHost, "cudaMemcpyAsync (device to host)");
    inner_->StageToHost(h, d, b);
  }
  void StageToDevice(void* d, const void* h, size_t b) override {
    Maybe(Fault::kStageToDevice, "cudaMemcpyAsync (host to device)");
    inner_->StageToDevice(d, h, b);
  }
  Kernels& kernels() override { return inner_->kernels(); }

 private:
  class Event final : public DeviceEvent {
   public:
    Event(FaultyDevice* dev, std::shared_ptr<DeviceEvent> inner) : dev_(dev), inner_(std::move(inner)) {}
    void Synchronize() override {
      dev_->Maybe(Fault::kEventWait, "cudaEventSynchronize");
      inner_->Synchronize();
    }

   private:
    FaultyDevice* dev_;
    std::shared_ptr<DeviceEvent> inner_;
  };
  void Maybe(Fault f, const char* call) {
    if (f == fault_ && ++calls_ == nth_)
      throw std::runtime_error(std::string("CUDA: ") + call +
                               ": an illegal memory access was encountered (cudaErrorIllegalAddress, 700)");
  }
  std::unique_ptr<Device> inner_;
  const Fault fault_;
  const int nth_;
  std::atomic<int> calls_{0};
};

// The last rank's device throws in its 2nd collective (in each of the three places). Three
// all-reduces queued back to back: the 1st and 3rd are right on every rank, the 2nd fails on
// EVERY rank with the failing rank's message (no rank waits inside MPI for the one that threw,
// no std::terminate), and the communicator keeps working.
TEST(CommunicatorStaged, StagingExceptionFailsTheWorkOnEveryRank) {
  using Fault = FaultyDevice::Fault;
  int r = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int bad = n - 1;
  const std::pair<Fault, const char*> cases[] = {
      {Fault::kStageToHost, "copying its input to host memory: CUDA: cudaMemcpyAsync (device to host)"},
      {Fault::kStageToDevice, "copying its output back to the device: CUDA: cudaMemcpyAsync (host to device)"},
      {Fault::kEventWait, "copying its input to host memory: CUDA: cudaEventSynchronize"}};
  for (const auto& [fault, what] : cases) {
    SCOPED_TRACE(what);
    FaultyDevice dev(r == bad ? fault : Fault::kNone, 2);
    auto comm = MakeStagedComm(&dev);
    ASSERT_TRUE(comm);
    const size_t count = 1031;
    std::vector<DeviceBuffer> bufs;
    std::vector<std::shared_ptr<Work>> works;
    const std::vector<float> mine(count, static_cast<float>(r + 1));
    for (int k = 0; k < 3; k++) {
      bufs.emplace_back(&dev, nullptr, MemKind::kComm, count * sizeof(float), "buf");
      dev.CopyToDevice(bufs.back().data(), mine.data(), count * sizeof(float));
    }
    for (int k = 0; k < 3; k++) works.push_back(comm->AllReduce(bufs[k].data(), count, DType::kF32, ReduceOp::kSum));
    const float want = static_cast<float>(n * (n + 1) / 2);
    for (int k : {0, 2}) {
      EXPECT_TRUE(works[k]->status().ok()) << "all-reduce " << k << ": " << works[k]->status().message();
      const std::vector<float> got = ReadBack(dev, bufs[k], count);
      size_t wrong = 0;
      for (float v : got) wrong += v != want;
      EXPECT_EQ(wrong, 0u) << "all-reduce " << k;
    }
    const Status failed = works[1]->status();
    EXPECT_FALSE(failed.ok());
    const std::string head = "all_reduce failed on rank " + std::to_string(bad) + ": ";
    EXPECT_EQ(failed.message().rfind(head + what, 0), 0u) << failed.message();
    EXPECT_NE(failed.message().find("an illegal memory access"), std::string::npos) << failed.message();
    // the same text on every rank
    const std::vector<uint64_t> lengths = AllGatherU64(*comm, {failed.message().size()});
    for (int j = 0; j < n; j++) EXPECT_EQ(lengths[j], lengths[0]) << "rank " << j;
    EXPECT_TRUE(comm->Barrier().ok());
    EXPECT_TRUE(comm->AllTrue(true));
  }
}

// The issue hook sees every accepted data-plane collective, in issue order, on the issuing
// thread, with the communicator it was issued on (also one made by Split); refused calls and
// control calls are not collectives. MPI is not stream-ordered.
TEST(Communicator, IssueHookRecordsTheIssueOrder) {
  auto comm = MakeComm();
  ASSERT_TRUE(comm);
  EXPECT_FALSE(comm->stream_ordered());
  auto half = comm->Split(comm->rank() % 2, comm->rank());
  ASSERT_TRUE(half.ok()) << half.status().message();
  const int n = comm->world_size(), h = half.value()->world_size();
  struct Seen {
    const Communicator* comm;
    CollKind kind;
    size_t count;
    std::thread::id thread;
  };
  std::vector<Seen> seen;
  CollectiveIssueHookSlot() = [&seen](const Communicator& c, CollKind k, size_t count) {
    seen.push_back({&c, k, count, std::this_thread::get_id()});
  };
  std::vector<float> a(8 * n, 1.0f), b(8 * n, 0.0f);
  std::vector<std::shared_ptr<Work>> w;
  w.push_back(comm->ReduceScatter(a.data(), b.data(), 8, DType::kF32, ReduceOp::kSum));
  w.push_back(half.value()->AllReduce(b.data(), 8, DType::kF32, ReduceOp::kAvg));
  w.push_back(comm->Broadcast(a.data(), 3, DType::kF32, n));  // refused: bad root
  w.push_back(comm->AllGather(b.data(), a.data(), 8, DType::kF32));
  w.push_back(half.value()->Broadcast(b.data(), 5, DType::kF32, h - 1));
  std::vector<size_t> counts(n, 1);
  w.push_back(comm->AllToAllV(a.data(), counts, b.data(), counts, DType::kF32));
  EXPECT_TRUE(comm->Barrier().ok());
  for (auto& x : w) x->Wait();
  CollectiveIssueHookSlot() = nullptr;
  ASSERT_EQ(seen.size(), 5u);
  const Communicator* c = comm.get();
  const Communicator* g = half.value().get();
  const Seen want[] = {{c, CollKind::kReduceScatter, 8, {}}, {g, CollKind::kAllReduce, 8, {}},
                       {c, CollKind::kAllGather, 8, {}},     {g, CollKind::kBroadcast, 5, {}},
                       {c, CollKind::kAllToAll, size_t(n), {}}};
  for (size_t i = 0; i < seen.size(); i++) {
    EXPECT_EQ(seen[i].comm, want[i].comm) << i;
    EXPECT_EQ(seen[i].kind, want[i].kind) << i;
    EXPECT_EQ(seen[i].count, want[i].count) << i;
    EXPECT_EQ(seen[i].thread, std::this_thread::get_id()) << i;
  }
}

// NCCL's one-GPU-per-rank check gathers (host, bus id) over the control plane: every rank gets
// every rank's, so every rank decides alike.
TEST(GpuBinding, GatherGivesEveryRankTheSameList) {
  auto comm = MakeComm();
  ASSERT_TRUE(comm);
  const int r = comm->rank(), n = comm->world_size();
  auto bus = [](int k) {
    char b[16];
    std::snprintf(b, sizeof(b), "0000:%02x:00.0", 0x19 + k);
    return std::string(b);
  };
  const std::string long_host(300, 'h');  // cut at 255 bytes
  auto all = GatherRankGpus(*comm, RankGpu{r == 0 ? long_host : "node" + std::to_string(r / 2), bus(r % 2),
                                           "boot-" + std::to_string(r / 2)});
  ASSERT_TRUE(all.ok()) << all.status().message();
  ASSERT_EQ(all.value().size(), static_cast<size_t>(n));
  for (int j = 0; j < n; j++) {
    EXPECT_EQ(all.value()[j].host, j == 0 ? long_host.substr(0, 255) : "node" + std::to_string(j / 2)) << j;
    EXPECT_EQ(all.value()[j].bus_id, bus(j % 2)) << j;
    EXPECT_EQ(all.value()[j].machine, "boot-" + std::to_string(j / 2)) << j;
  }
  EXPECT_EQ(SharedGpuError(all.value()), "");  // two GPUs per host, one rank on each
  // every rank on GPU 0 of one host (a lost binding): refused on every rank alike
  auto same = GatherRankGpus(*comm, RankGpu{"n1", bus(0)});
  ASSERT_TRUE(same.ok());
  const std::string err = SharedGpuError(same.value());
  if (n == 1) EXPECT_EQ(err, "");
  if (n == 2) EXPECT_EQ(err.rfind("--comm nccl: ranks 0 and 1 on host n1 share GPU 0000:19:00.0; ", 0), 0u) << err;
  if (n == 3) EXPECT_EQ(err.rfind("--comm nccl: ranks 0, 1 and 2 on host n1 share GPU 0000:19:00.0; ", 0), 0u) << err;
}

}  // namespace
}  // namespace shardgpt
