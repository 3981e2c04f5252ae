// The emulated NCCL (emu/cuda/nccl.cc) on 1..3 ranks, through the standard CUDA runtime and
// NCCL APIs as shardgpt uses them: every collective in fp32 and bf16 (sum and avg) against
// host-computed values, in-place variants, other types and ops, grouped send/receive
// all-to-all-v, split, non-blocking init/finalize, abort, queries that never run a collective on
// their own thread, failure injection, and the misuse
// that ends the process. Linked with tests/mpi/mpi_main.cc; every rank runs every test.
//
// Exactness: each element's contributions are either small integers on every rank (every
// partial sum exact) or non-zero on at most two ranks, so that whatever order MPI pairs them
// in, the sum is fp32(a + b) and the bf16 sum is bf16(fp32(a) + fp32(b)) (fp32 sum, then one
// rounding), the emulation's documented maths.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "base/bf16.h"

namespace {

using shardgpt::Bf16ToFloat;
using shardgpt::FloatToBf16;
using shardgpt::RoundToBf16;

constexpr size_t kN = 37;  // elements per rank block: odd, not a multiple of anything

// MPI_Allreduce seen through the MPI profiling interface: while g_watch_allreduce is set, the
// first thread that enters MPI_Allreduce (an emulated ncclAllReduce's closure) sets
// g_entered_allreduce before MPI runs it. A test waits for that event instead of sleeping.
std::atomic<bool> g_watch_allreduce{false};
std::atomic<bool> g_entered_allreduce{false};

}  // namespace

extern "C" int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                             MPI_Comm comm) {
  if (g_watch_allreduce.load()) g_entered_allreduce.store(true);
  return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
}

namespace {

int WorldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int WorldSize() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

uint32_t Mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Rank r's contribution to element i (see the file comment): every third element a small
// integer on every rank, the others a random non-zero value (bf16-representable when bf16)
// on at most two ranks and 0 elsewhere.
float Value(int r, size_t i, int world, bool bf16) {
  if (i % 3 == 0) return static_cast<float>((r + 1) * (static_cast<int>(i % 7) - 3));
  const int a = static_cast<int>(i % world), b = static_cast<int>((i / 3 + 1) % world);
  if (r != a && r != b) return 0.0f;
  const uint32_t h = Mix(static_cast<uint32_t>(i * 131 + r * 7 + 1));
  const float mantissa = 1.0f + static_cast<float>(h & 0x7fffff) / 8388608.0f;
  const float v = std::ldexp(mantissa, static_cast<int>(h >> 24) % 9 - 4) * ((h >> 23) & 1 ? -1.0f : 1.0f);
  return bf16 ? RoundToBf16(v) : v;
}

// The emulation's result for element i of a sum or avg over all ranks.
float Expected(size_t i, int world, bool bf16, ncclRedOp_t op) {
  float sum = 0.0f;
  for (int r = 0; r < world; ++r) sum += Value(r, i, world, bf16);  // at most one rounding step
  if (bf16) sum = RoundToBf16(sum);
  if (op != ncclAvg) return sum;
  return bf16 ? RoundToBf16(sum / static_cast<float>(world)) : sum / static_cast<float>(world);
}

std::vector<float> Contribution(int r, size_t n, int world, bool bf16) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = Value(r, i, world, bf16);
  return v;
}

std::vector<float> ExpectedAll(size_t n, int world, bool bf16, ncclRedOp_t op) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = Expected(i, world, bf16, op);
  return v;
}

// Bitwise equality of two float vectors (so -0 and NaN payloads count).
void ExpectSame(const std::vector<float>& want, const std::vector<float>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &want[i], 4);
    std::memcpy(&b, &got[i], 4);
    EXPECT_EQ(a, b) << "element " << i << ": want " << want[i] << ", got " << got[i];
  }
}

// A device allocation holding floats as fp32 or as bf16 bits.
class Buf {
 public:
  Buf(size_t n, bool bf16) : n_(n), esize_(bf16 ? 2 : 4), bf16_(bf16) {
    EXPECT_EQ(cudaMalloc(&p_, n_ * esize_ + 1), cudaSuccess);  // +1: n == 0 still allocates
  }
  ~Buf() { cudaFree(p_); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;

  char* at(size_t i) const { return static_cast<char*>(p_) + i * esize_; }
  void* get() const { return p_; }

  void Put(const std::vector<float>& v, size_t offset = 0) {
    std::vector<char> bytes(v.size() * esize_);
    for (size_t i = 0; i < v.size(); ++i) {
      if (bf16_) {
        const uint16_t b = FloatToBf16(v[i]);
        std::memcpy(&bytes[i * 2], &b, 2);
      } else {
        std::memcpy(&bytes[i * 4], &v[i], 4);
      }
    }
    EXPECT_EQ(cudaMemcpy(at(offset), bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<float> Get(size_t count, size_t offset = 0) const {
    std::vector<char> bytes(count * esize_);
    EXPECT_EQ(cudaMemcpy(bytes.data(), at(offset), bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) {
      if (bf16_) {
        uint16_t b;
        std::memcpy(&b, &bytes[i * 2], 2);
        v[i] = Bf16ToFloat(b);
      } else {
        std::memcpy(&v[i], &bytes[i * 4], 4);
      }
    }
    return v;
  }

 private:
  void* p_ = nullptr;
  size_t n_, esize_;
  bool bf16_;
};

// Makes a communicator over every rank of the job (rank 0's id, broadcast over MPI).
ncclResult_t InitAll(ncclComm_t* comm, ncclConfig_t* config) {
  ncclUniqueId id{};
  if (WorldRank() == 0) {
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  return ncclCommInitRankConfig(comm, WorldSize(), id, WorldRank(), config);
}

// Polls a non-blocking comm as the caller does: ncclInProgress until done.
ncclResult_t Poll(ncclComm_t comm) {
  ncclResult_t r = ncclInProgress;
  for (int i = 0; i < 1000 && r == ncclInProgress; ++i) EXPECT_EQ(ncclCommGetAsyncError(comm, &r), ncclSuccess);
  return r;
}

struct Case {
  bool bf16;
  ncclRedOp_t op;
  const char* name;
};
const Case kCases[] = {{false, ncclSum, "fp32 sum"}, {false, ncclAvg, "fp32 avg"},
                       {true, ncclSum, "bf16 sum"},  {true, ncclAvg, "bf16 avg"}};

ncclDataType_t TypeOf(bool bf16) { return bf16 ? ncclBfloat16 : ncclFloat32; }

class NcclEmuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rank_ = WorldRank();
    world_ = WorldSize();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(InitAll(&comm_, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (comm_ != nullptr) {
      EXPECT_EQ(ncclCommDestroy(comm_), ncclSuccess);
    }
    cudaStreamDestroy(stream_);
  }
  void Sync() { ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess); }

  int rank_ = 0, world_ = 1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

TEST_F(NcclEmuTest, VersionAndQueries) {
  int v = 0, n = 0, r = -1, d = -1;
  EXPECT_EQ(ncclGetVersion(&v), ncclSuccess);
  EXPECT_EQ(v, 22809);
  EXPECT_EQ(ncclCommCount(comm_, &n), ncclSuccess);
  EXPECT_EQ(n, world_);
  EXPECT_EQ(ncclCommUserRank(comm_, &r), ncclSuccess);
  EXPECT_EQ(r, rank_);
  EXPECT_EQ(ncclCommCuDevice(comm_, &d), ncclSuccess);
  EXPECT_EQ(d, 0);
  ncclResult_t async = ncclInternalError;
  EXPECT_EQ(ncclCommGetAsyncError(comm_, &async), ncclSuccess);
  EXPECT_EQ(async, ncclSuccess);
  EXPECT_STREQ(ncclGetErrorString(ncclRemoteError), "remote process exited or there was a network error");
}

TEST_F(NcclEmuTest, AllReduce) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    Buf send(kN, c.bf16), recv(kN, c.bf16), inplace(kN, c.bf16);
    send.Put(Contribution(rank_, kN, world_, c.bf16));
    inplace.Put(Contribution(rank_, kN, world_, c.bf16));
    ASSERT_EQ(ncclAllReduce(send.get(), recv.get(), kN, TypeOf(c.bf16), c.op, comm_, stream_), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(inplace.get(), inplace.get(), kN, TypeOf(c.bf16), c.op, comm_, stream_), ncclSuccess);
    Sync();
    ExpectSame(ExpectedAll(kN, world_, c.bf16, c.op), recv.Get(kN));
    ExpectSame(ExpectedAll(kN, world_, c.bf16, c.op), inplace.Get(kN));
    ExpectSame(Contribution(rank_, kN, world_, c.bf16), send.Get(kN));  // not in place: input kept
  }
}

TEST_F(NcclEmuTest, ReduceScatter) {
  const size_t total = kN * world_;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    Buf send(total, c.bf16), recv(kN, c.bf16), inplace(total, c.bf16);
    send.Put(Contribution(rank_, total, world_, c.bf16));
    inplace.Put(Contribution(rank_, total, world_, c.bf16));
    ASSERT_EQ(ncclReduceScatter(send.get(), recv.get(), kN, TypeOf(c.bf16), c.op, comm_, stream_), ncclSuccess);
    void* own = inplace.at(static_cast<size_t>(rank_) * kN);  // NCCL's in-place form
    ASSERT_EQ(ncclReduceScatter(inplace.get(), own, kN, TypeOf(c.bf16), c.op, comm_, stream_), ncclSuccess);
    Sync();
    const std::vector<float> all = ExpectedAll(total, world_, c.bf16, c.op);
    const std::vector<float> mine(all.begin() + rank_ * kN, all.begin() + (rank_ + 1) * kN);
    ExpectSame(mine, recv.Get(kN));
    ExpectSame(mine, inplace.Get(kN, static_cast<size_t>(rank_) * kN));
  }
}

TEST_F(NcclEmuTest, AllGather) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    Buf send(kN, bf16), recv(kN * world_, bf16), inplace(kN * world_, bf16);
    send.Put(Contribution(rank_, kN, world_, bf16));
    inplace.Put(Contribution(rank_, kN, world_, bf16), static_cast<size_t>(rank_) * kN);
    ASSERT_EQ(ncclAllGather(send.get(), recv.get(), kN, TypeOf(bf16), comm_, stream_), ncclSuccess);
    void* own = inplace.at(static_cast<size_t>(rank_) * kN);
    ASSERT_EQ(ncclAllGather(own, inplace.get(), kN, TypeOf(bf16), comm_, stream_), ncclSuccess);
    Sync();
    std::vector<float> want;
    for (int r = 0; r < world_; ++r) {
      const std::vector<float> v = Contribution(r, kN, world_, bf16);
      want.insert(want.end(), v.begin(), v.end());
    }
    ExpectSame(want, recv.Get(kN * world_));
    ExpectSame(want, inplace.Get(kN * world_));
  }
}

TEST_F(NcclEmuTest, Broadcast) {
  const int root = world_ - 1;
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    Buf send(kN, bf16), recv(kN, bf16), inplace(kN, bf16);
    send.Put(Contribution(rank_, kN, world_, bf16));
    inplace.Put(Contribution(rank_, kN, world_, bf16));
    // sendbuff only matters on the root: the others pass NULL
    ASSERT_EQ(ncclBroadcast(rank_ == root ? send.get() : nullptr, recv.get(), kN, TypeOf(bf16), root, comm_, stream_),
              ncclSuccess);
    ASSERT_EQ(ncclBroadcast(inplace.get(), inplace.get(), kN, TypeOf(bf16), root, comm_, stream_), ncclSuccess);
    Sync();
    ExpectSame(Contribution(root, kN, world_, bf16), recv.Get(kN));
    ExpectSame(Contribution(root, kN, world_, bf16), inplace.Get(kN));
  }
}

TEST_F(NcclEmuTest, Reduce) {
  const int root = world_ / 2;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    Buf send(kN, c.bf16), recv(kN, c.bf16), inplace(kN, c.bf16);
    send.Put(Contribution(rank_, kN, world_, c.bf16));
    inplace.Put(Contribution(rank_, kN, world_, c.bf16));
    ASSERT_EQ(ncclReduce(send.get(), rank_ == root ? recv.get() : nullptr, kN, TypeOf(c.bf16), c.op, root, comm_,
                         stream_),
              ncclSuccess);
    ASSERT_EQ(ncclReduce(inplace.get(), inplace.get(), kN, TypeOf(c.bf16), c.op, root, comm_, stream_), ncclSuccess);
    Sync();
    if (rank_ == root) {
      ExpectSame(ExpectedAll(kN, world_, c.bf16, c.op), recv.Get(kN));
      ExpectSame(ExpectedAll(kN, world_, c.bf16, c.op), inplace.Get(kN));
    } else {
      ExpectSame(Contribution(rank_, kN, world_, c.bf16), inplace.Get(kN));  // only the root's changes
    }
  }
}

// bf16 rounding by hand (independent of base/bf16.h): ties go to even, NaN stays NaN.
TEST_F(NcclEmuTest, Bf16RoundsToNearestEven) {
  if (world_ < 2) GTEST_SKIP() << "needs two contributions";
  const float tiny = 0.00390625f;  // 2^-8: half an ulp of bf16 at 1.0
  std::vector<float> mine(3, 0.0f);
  if (rank_ == 0) mine = {1.0f, 1.0078125f, std::numeric_limits<float>::quiet_NaN()};
  if (rank_ == 1) mine = {tiny, tiny, 1.0f};
  Buf buf(3, true);
  buf.Put(mine);
  ASSERT_EQ(ncclAllReduce(buf.get(), buf.get(), 3, ncclBfloat16, ncclSum, comm_, stream_), ncclSuccess);
  Sync();
  const std::vector<float> got = buf.Get(3);
  EXPECT_EQ(got[0], 1.0f);       // 1 + 2^-8: tie, even is 1.0
  EXPECT_EQ(got[1], 1.015625f);  // 1.0078125 + 2^-8: tie, even is 1.015625
  EXPECT_TRUE(std::isnan(got[2]));
}

// Max, min and product (fp32 and bf16), and the integer and fp64 types with sum and avg.
TEST_F(NcclEmuTest, OtherOpsAndTypes) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    std::vector<float> mine(kN), vmax(kN), vmin(kN), vprod(kN, 1.0f);
    for (size_t i = 0; i < kN; ++i) {
      for (int r = 0; r < world_; ++r) {
        // powers of two: every product exact
        const float v = std::ldexp((i + r) % 2 ? -1.0f : 1.0f, static_cast<int>((i * 3 + r) % 7) - 3);
        if (r == rank_) mine[i] = v;
        vmax[i] = r == 0 ? v : std::max(vmax[i], v);
        vmin[i] = r == 0 ? v : std::min(vmin[i], v);
        vprod[i] *= v;
      }
    }
    Buf a(kN, bf16), b(kN, bf16), p(kN, bf16);
    a.Put(mine), b.Put(mine), p.Put(mine);
    ASSERT_EQ(ncclAllReduce(a.get(), a.get(), kN, TypeOf(bf16), ncclMax, comm_, stream_), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(b.get(), b.get(), kN, TypeOf(bf16), ncclMin, comm_, stream_), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(p.get(), p.get(), kN, TypeOf(bf16), ncclProd, comm_, stream_), ncclSuccess);
    Sync();
    ExpectSame(vmax, a.Get(kN));
    ExpectSame(vmin, b.Get(kN));
    ExpectSame(vprod, p.Get(kN));
  }
  // int32 sum and avg (avg truncates), uint8 sum, fp64 avg
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64), cudaSuccess);
  int32_t ints[2] = {rank_ + 1, -(rank_ + 1)};
  ASSERT_EQ(cudaMemcpy(d, ints, sizeof(ints), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(ncclAllReduce(d, d, 2, ncclInt32, ncclAvg, comm_, stream_), ncclSuccess);
  Sync();
  ASSERT_EQ(cudaMemcpy(ints, d, sizeof(ints), cudaMemcpyDeviceToHost), cudaSuccess);
  const int tri = world_ * (world_ + 1) / 2;
  EXPECT_EQ(ints[0], tri / world_);
  EXPECT_EQ(ints[1], -tri / world_);
  uint8_t bytes[3] = {1, 2, static_cast<uint8_t>(rank_)};
  ASSERT_EQ(cudaMemcpy(d, bytes, sizeof(bytes), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(ncclAllReduce(d, d, 3, ncclUint8, ncclSum, comm_, stream_), ncclSuccess);
  Sync();
  ASSERT_EQ(cudaMemcpy(bytes, d, sizeof(bytes), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(bytes[0], world_);
  EXPECT_EQ(bytes[1], 2 * world_);
  EXPECT_EQ(bytes[2], world_ * (world_ - 1) / 2);
  double dbl = 0.1 * (rank_ + 1);
  ASSERT_EQ(cudaMemcpy(d, &dbl, sizeof(dbl), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(ncclAllReduce(d, d, 1, ncclFloat64, ncclAvg, comm_, stream_), ncclSuccess);
  Sync();
  ASSERT_EQ(cudaMemcpy(&dbl, d, sizeof(dbl), cudaMemcpyDeviceToHost), cudaSuccess);
  double sum = 0;
  for (int r = 0; r < world_; ++r) sum += 0.1 * (r + 1);
  EXPECT_NEAR(dbl, sum / world_, 1e-15);
  cudaFree(d);
}

TEST_F(NcclEmuTest, ArgumentErrorsReturn) {
  Buf buf(kN, false);
  EXPECT_EQ(ncclAllReduce(buf.get(), buf.get(), 0, ncclFloat32, ncclSum, comm_, stream_), ncclSuccess);  // no-op
  EXPECT_EQ(ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, comm_, stream_), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(nullptr, buf.get(), kN, ncclFloat32, ncclSum, comm_, stream_), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comm_)).find("sendbuff is NULL"), std::string::npos)
      << ncclGetLastError(comm_);
  EXPECT_EQ(ncclAllReduce(buf.get(), buf.get(), kN, ncclFloat32, static_cast<ncclRedOp_t>(9), comm_, stream_),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(buf.get(), buf.get(), kN, ncclFloat16, ncclSum, comm_, stream_), ncclInvalidArgument);
  EXPECT_EQ(ncclBroadcast(buf.get(), buf.get(), kN, ncclFloat32, world_, comm_, stream_), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(buf.get(), kN, ncclFloat32, -1, comm_, stream_), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(buf.get(), buf.get(), kN, ncclFloat32, ncclSum, nullptr, stream_), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  // a failed call inside a group fails the group, which queues nothing
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(buf.get(), buf.get(), kN, ncclFloat32, ncclSum, comm_, stream_), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(buf.get(), buf.get(), kN, ncclFloat32, ncclSum, nullptr, stream_), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  Sync();
}

// The caller's pattern (parallel/nccl/nccl_communicator.cc): one group of ncclSend/ncclRecv
// to every peer, some counts zero, the self block included. Large enough blocks that MPI
// needs the receiver (no eager send), so unfused sends would deadlock.
TEST_F(NcclEmuTest, GroupedSendRecvAllToAllV) {
  const size_t scale = 40000;
  // ranks 0 and 1 send each other non-empty blocks first: unfused, both would wait forever
  auto count = [&](int s, int d) -> size_t {
    if (s == d) return (s % 2) * scale;  // rank 0's self block is empty, rank 1's is not
    if (s == 0 && d == 2) return 0;
    return (1 + (s + d) % 2) * scale;
  };
  auto value = [](int s, int d, size_t k) {
    return static_cast<float>(s * 1000000 + d * 100000 + static_cast<int>(k % 99991));
  };
  size_t stotal = 0, rtotal = 0;
  for (int j = 0; j < world_; ++j) stotal += count(rank_, j), rtotal += count(j, rank_);
  Buf send(stotal, false), recv(rtotal, false);
  std::vector<float> host;
  for (int j = 0; j < world_; ++j)
    for (size_t k = 0; k < count(rank_, j); ++k) host.push_back(value(rank_, j, k));
  send.Put(host);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);  // nested: only the outermost end queues
  size_t so = 0, ro = 0;
  for (int j = 0; j < world_; ++j) {
    if (count(rank_, j) > 0) {
      ASSERT_EQ(ncclSend(send.at(so), count(rank_, j), ncclFloat32, j, comm_, stream_), ncclSuccess);
    }
    if (count(j, rank_) > 0) {
      ASSERT_EQ(ncclRecv(recv.at(ro), count(j, rank_), ncclFloat32, j, comm_, stream_), ncclSuccess);
    }
    so += count(rank_, j), ro += count(j, rank_);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  Sync();
  std::vector<float> want;
  for (int j = 0; j < world_; ++j)
    for (size_t k = 0; k < count(j, rank_); ++k) want.push_back(value(j, rank_, k));
  ExpectSame(want, recv.Get(rtotal));
}

// Outside a group each send and receive is its own closure (small: MPI sends eagerly).
TEST_F(NcclEmuTest, UngroupedSendRecvRing) {
  const int next = (rank_ + 1) % world_, prev = (rank_ + world_ - 1) % world_;
  Buf send(4, false), recv(4, false);
  send.Put({1.0f * rank_, 2.0f, 3.0f, 4.0f});
  ASSERT_EQ(ncclSend(send.get(), 4, ncclFloat32, next, comm_, stream_), ncclSuccess);
  ASSERT_EQ(ncclRecv(recv.get(), 4, ncclFloat32, prev, comm_, stream_), ncclSuccess);
  Sync();
  ExpectSame({1.0f * prev, 2.0f, 3.0f, 4.0f}, recv.Get(4));
}

// A group queues nothing until its outermost end; collectives keep their call order.
TEST_F(NcclEmuTest, GroupDefersCollectives) {
  Buf a(kN, false), b(kN, false);
  a.Put(Contribution(rank_, kN, world_, false));
  b.Put(Contribution(rank_, kN, world_, false));
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(a.get(), a.get(), kN, ncclFloat32, ncclSum, comm_, stream_), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(b.get(), b.get(), kN, ncclFloat32, ncclAvg, comm_, stream_), ncclSuccess);
  Sync();
  ExpectSame(Contribution(rank_, kN, world_, false), a.Get(kN));  // not queued yet
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  Sync();
  ExpectSame(ExpectedAll(kN, world_, false, ncclSum), a.Get(kN));
  ExpectSame(ExpectedAll(kN, world_, false, ncclAvg), b.Get(kN));
}

// Two groups by parity, ordered by descending world rank; a child comm works beside its parent.
TEST_F(NcclEmuTest, SplitIntoTwoGroups) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t part = nullptr;
  ncclResult_t r = ncclCommSplit(comm_, rank_ % 2, world_ - rank_, &part, &config);
  ASSERT_EQ(r, ncclInProgress) << ncclGetLastError(comm_);
  ASSERT_NE(part, nullptr);
  EXPECT_EQ(Poll(part), ncclSuccess);
  std::vector<int> members;
  for (int j = world_ - 1; j >= 0; --j)
    if (j % 2 == rank_ % 2) members.push_back(j);
  int n = 0, me = -1, dev = -1;
  ASSERT_EQ(ncclCommCount(part, &n), ncclSuccess);
  ASSERT_EQ(ncclCommUserRank(part, &me), ncclSuccess);
  ASSERT_EQ(ncclCommCuDevice(part, &dev), ncclSuccess);
  EXPECT_EQ(n, static_cast<int>(members.size()));
  ASSERT_GE(me, 0);
  EXPECT_EQ(members[me], rank_);
  EXPECT_EQ(dev, 0);
  cudaStream_t s2 = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  Buf child(1, false), parent(1, false);
  child.Put({static_cast<float>(rank_)});
  parent.Put({1.0f});
  ASSERT_EQ(ncclAllReduce(child.get(), child.get(), 1, ncclFloat32, ncclSum, part, s2), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(parent.get(), parent.get(), 1, ncclFloat32, ncclSum, comm_, stream_), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s2), cudaSuccess);
  Sync();
  float sum = 0;
  for (int j : members) sum += static_cast<float>(j);
  EXPECT_EQ(child.Get(1)[0], sum);
  EXPECT_EQ(parent.Get(1)[0], static_cast<float>(world_));
  EXPECT_EQ(ncclCommDestroy(part), ncclSuccess);
  cudaStreamDestroy(s2);
  // NCCL_SPLIT_NOCOLOR: no communicator for the odd ranks (blocking, inherited)
  ASSERT_EQ(ncclCommSplit(comm_, rank_ % 2 ? NCCL_SPLIT_NOCOLOR : 0, rank_, &part, nullptr), ncclSuccess);
  EXPECT_EQ(part == nullptr, rank_ % 2 == 1);
  if (part != nullptr) {
    ASSERT_EQ(ncclCommCount(part, &n), ncclSuccess);
    EXPECT_EQ(n, (world_ + 1) / 2);
    EXPECT_EQ(ncclCommDestroy(part), ncclSuccess);
  }
}

// The caller's non-blocking lifecycle: init polled to ncclSuccess, a collective, finalize
// (which runs the queued closure without anybody waiting on the stream) polled, destroy.
TEST_F(NcclEmuTest, NonBlockingInitFinalizeDestroy) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t nb = nullptr;
  ASSERT_EQ(InitAll(&nb, &config), ncclInProgress);
  ASSERT_NE(nb, nullptr);
  ncclResult_t async = ncclSuccess;
  EXPECT_EQ(ncclCommGetAsyncError(nb, &async), ncclSuccess);
  EXPECT_EQ(async, ncclInProgress);  // the caller's polling loop runs at least once
  EXPECT_EQ(Poll(nb), ncclSuccess);
  Buf buf(kN, true);
  buf.Put(Contribution(rank_, kN, world_, true));
  ASSERT_EQ(ncclAllReduce(buf.get(), buf.get(), kN, ncclBfloat16, ncclAvg, nb, stream_), ncclSuccess);
  ASSERT_EQ(ncclCommFinalize(nb), ncclInProgress);
  EXPECT_EQ(Poll(nb), ncclSuccess);
  ExpectSame(ExpectedAll(kN, world_, true, ncclAvg), buf.Get(kN));  // ran inside finalize
  EXPECT_EQ(ncclAllReduce(buf.get(), buf.get(), kN, ncclBfloat16, ncclSum, nb, stream_), ncclInvalidUsage);
  EXPECT_EQ(ncclCommDestroy(nb), ncclSuccess);
  int n = 0;
  EXPECT_EQ(ncclCommCount(nb, &n), ncclInvalidArgument);  // no longer live
}

TEST_F(NcclEmuTest, BlockingFinalizeAndDestroyWithoutFinalize) {
  Buf buf(kN, false);
  buf.Put(Contribution(rank_, kN, world_, false));
  ASSERT_EQ(ncclAllReduce(buf.get(), buf.get(), kN, ncclFloat32, ncclSum, comm_, stream_), ncclSuccess);
  EXPECT_EQ(ncclCommFinalize(comm_), ncclSuccess);
  ExpectSame(ExpectedAll(kN, world_, false, ncclSum), buf.Get(kN));
  // destroy without finalize: it drains first
  ncclComm_t other = nullptr;
  ASSERT_EQ(InitAll(&other, nullptr), ncclSuccess);
  buf.Put(Contribution(rank_, kN, world_, false));
  ASSERT_EQ(ncclAllReduce(buf.get(), buf.get(), kN, ncclFloat32, ncclAvg, other, stream_), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(other), ncclSuccess);
  ExpectSame(ExpectedAll(kN, world_, false, ncclAvg), buf.Get(kN));
}

// Init whose nranks does not match the group: refused on every rank, with the reason.
TEST_F(NcclEmuTest, InitMismatchIsRefused) {
  ncclUniqueId id{};
  if (rank_ == 0) ncclGetUniqueId(&id);
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t bad = reinterpret_cast<ncclComm_t>(this);
  EXPECT_EQ(ncclCommInitRank(&bad, world_ + 1, id, rank_), ncclInvalidArgument);
  EXPECT_EQ(bad, nullptr);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("form a group of"), std::string::npos)
      << ncclGetLastError(nullptr);
  // non-blocking: a comm in error, reported by polling, then aborted as the caller does
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ASSERT_EQ(ncclCommInitRankConfig(&bad, world_ + 1, id, rank_, &config), ncclInProgress);
  ASSERT_NE(bad, nullptr);
  EXPECT_EQ(Poll(bad), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(bad)).find("form a group of"), std::string::npos);
  EXPECT_EQ(ncclCommAbort(bad), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(bad), ncclSuccess);
  // a local argument error still takes part in the world split: nobody hangs
  EXPECT_EQ(ncclCommInitRank(&bad, world_, id, rank_ == 0 ? -1 : rank_), ncclInvalidArgument);
}

// Abort never blocks; queued closures then do nothing; later calls are ncclInvalidUsage.
TEST_F(NcclEmuTest, AbortDropsQueuedWork) {
  Buf buf(kN, false);
  buf.Put(Contribution(rank_, kN, world_, false));
  ASSERT_EQ(ncclAllReduce(buf.get(), buf.get(), kN, ncclFloat32, ncclSum, comm_, stream_), ncclSuccess);
  EXPECT_EQ(ncclCommAbort(comm_), ncclSuccess);
  Sync();
  ExpectSame(Contribution(rank_, kN, world_, false), buf.Get(kN));
  EXPECT_EQ(ncclAllReduce(buf.get(), buf.get(), kN, ncclFloat32, ncclSum, comm_, stream_), ncclInvalidUsage);
  ncclResult_t async = ncclSuccess;
  EXPECT_EQ(ncclCommGetAsyncError(comm_, &async), ncclInvalidUsage);
  EXPECT_EQ(async, ncclInvalidUsage);
  int n = 0;
  EXPECT_EQ(ncclCommCount(comm_, &n), ncclInvalidUsage);
  EXPECT_EQ(ncclCommAbort(comm_), ncclSuccess);  // again: harmless
  // TearDown destroys it
}

// The watchdog's view: while a closure is blocked in MPI on another thread (rank 0 joins
// late), ncclCommGetAsyncError and ncclCommAbort return at once; the runtime's event query
// does not block either. Events, not delays: the other ranks check once their closure has
// entered MPI_Allreduce (g_entered_allreduce), and rank 0 joins only after they are done
// (a barrier on a communicator of the test's own).
TEST_F(NcclEmuTest, PollAndAbortDoNotWaitForMpi) {
  if (world_ < 2) GTEST_SKIP() << "needs a late peer";
  MPI_Comm checks_done = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &checks_done), MPI_SUCCESS);
  Buf buf(kN, false);
  buf.Put(Contribution(rank_, kN, world_, false));
  if (rank_ == 0) {
    MPI_Barrier(checks_done);  // the others wait in MPI meanwhile
    MPI_Comm_free(&checks_done);
    ASSERT_EQ(ncclAllReduce(buf.get(), buf.get(), kN, ncclFloat32, ncclSum, comm_, stream_), ncclSuccess);
    Sync();
    ExpectSame(ExpectedAll(kN, world_, false, ncclSum), buf.Get(kN));
    return;
  }
  g_entered_allreduce = false;
  g_watch_allreduce = true;
  ASSERT_EQ(ncclAllReduce(buf.get(), buf.get(), kN, ncclFloat32, ncclSum, comm_, stream_), ncclSuccess);
  std::atomic<bool> done{false};
  std::thread runner([&] {
    cudaStreamSynchronize(stream_);  // runs the closure here: it blocks until rank 0 joins
    done = true;
  });
  while (!g_entered_allreduce.load()) std::this_thread::yield();
  g_watch_allreduce = false;
  cudaEvent_t ev = nullptr;
  EXPECT_EQ(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(ev, stream_), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(ev), cudaErrorNotReady);
  ncclResult_t async = ncclInternalError;
  EXPECT_EQ(ncclCommGetAsyncError(comm_, &async), ncclSuccess);
  EXPECT_EQ(async, ncclSuccess);
  EXPECT_EQ(ncclCommAbort(comm_), ncclSuccess);
  EXPECT_FALSE(done) << "the collective finished before rank 0 joined";
  MPI_Barrier(checks_done);
  MPI_Comm_free(&checks_done);
  runner.join();
  cudaEventDestroy(ev);
  ExpectSame(ExpectedAll(kN, world_, false, ncclSum), buf.Get(kN));  // it was already inside MPI
  // TearDown destroys the aborted comm
}

// A query (cudaEventQuery, cudaStreamQuery) that reaches an NCCL operation does not run it on
// the querying thread: it answers "not ready" while the peers have not joined (rank 0 joins
// only after every other rank's queries answered, a barrier on a communicator of the test's
// own), as a GPU's would, and the operation completes on the runtime's thread once they have.
TEST_F(NcclEmuTest, QueryHandsACollectiveToAThreadOfItsOwn) {
  if (world_ < 2) GTEST_SKIP() << "needs a late peer";
  MPI_Comm checks_done = MPI_COMM_NULL;
  ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &checks_done), MPI_SUCCESS);
  Buf buf(kN, false);
  buf.Put(Contribution(rank_, kN, world_, false));
  if (rank_ == 0) {
    MPI_Barrier(checks_done);  // the others' queries answered meanwhile
    MPI_Comm_free(&checks_done);
    ASSERT_EQ(ncclAllReduce(buf.get(), buf.get(), kN, ncclFloat32, ncclSum, comm_, stream_), ncclSuccess);
    Sync();
    ExpectSame(ExpectedAll(kN, world_, false, ncclSum), buf.Get(kN));
    return;
  }
  ASSERT_EQ(ncclAllReduce(buf.get(), buf.get(), kN, ncclFloat32, ncclSum, comm_, stream_), ncclSuccess);
  cudaEvent_t ev = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(ev, stream_), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(ev), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(stream_), cudaErrorNotReady);
  MPI_Barrier(checks_done);
  MPI_Comm_free(&checks_done);
  while (cudaEventQuery(ev) == cudaErrorNotReady) std::this_thread::yield();
  EXPECT_EQ(cudaEventQuery(ev), cudaSuccess);
  cudaEventDestroy(ev);
  ExpectSame(ExpectedAll(kN, world_, false, ncclSum), buf.Get(kN));
}

// SHARDGPT_NCCL_EMU_FAIL_AT=2: the second operation from now does nothing and sets the
// comm's asynchronous error, as the caller's watchdog expects from a dead peer. Every rank
// fails the same operation, so no rank waits for another.
TEST_F(NcclEmuTest, FailureInjectionSetsAsyncError) {
  Buf a(kN, false), b(kN, false);
  a.Put(Contribution(rank_, kN, world_, false));
  b.Put(Contribution(rank_, kN, world_, false));
  ASSERT_EQ(setenv("SHARDGPT_NCCL_EMU_FAIL_AT", "2", 1), 0);
  ASSERT_EQ(ncclAllReduce(a.get(), a.get(), kN, ncclFloat32, ncclSum, comm_, stream_), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(b.get(), b.get(), kN, ncclFloat32, ncclSum, comm_, stream_), ncclSuccess);
  Sync();
  unsetenv("SHARDGPT_NCCL_EMU_FAIL_AT");
  ExpectSame(ExpectedAll(kN, world_, false, ncclSum), a.Get(kN));
  ExpectSame(Contribution(rank_, kN, world_, false), b.Get(kN));  // did not run
  ncclResult_t async = ncclSuccess;
  EXPECT_EQ(ncclCommGetAsyncError(comm_, &async), ncclSuccess);
  EXPECT_EQ(async, ncclRemoteError);
  EXPECT_NE(std::string(ncclGetLastError(comm_)).find("emulated failure (SHARDGPT_NCCL_EMU_FAIL_AT)"),
            std::string::npos)
      << ncclGetLastError(comm_);
  EXPECT_EQ(ncclAllReduce(a.get(), a.get(), kN, ncclFloat32, ncclSum, comm_, stream_), ncclRemoteError);
  EXPECT_EQ(ncclCommAbort(comm_), ncclSuccess);  // what the watchdog does
}

// Misuse that a GPU punishes ends the process with one line naming the call and the buffer.
// (Death tests fork: the child fails in validation, before any MPI call.)
TEST_F(NcclEmuTest, BufferOutsideDeviceAllocationDies) {
  GTEST_FLAG_SET(death_test_style, "fast");
  std::vector<float> host(4, 1.0f);
  EXPECT_DEATH(ncclAllReduce(host.data(), host.data(), 4, ncclFloat32, ncclSum, comm_, stream_),
               "ncclAllReduce: sendbuff 0x[0-9a-f]+ \\(16 bytes\\) is not inside one allocation of device 0");
  Buf small(4, false);  // 17 bytes allocated (see Buf)
  EXPECT_DEATH(ncclAllGather(small.get(), small.get(), 5 * 4, ncclFloat32, comm_, stream_),
               "ncclAllGather: sendbuff 0x[0-9a-f]+ \\(80 bytes\\) is not inside one allocation");
  Buf big(2 * kN, false);
  EXPECT_DEATH(ncclAllReduce(big.get(), big.at(1), kN, ncclFloat32, ncclSum, comm_, stream_),
               "ncclAllReduce: sendbuff .* overlaps recvbuff");
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices >= 2) {
    cudaStream_t other = nullptr;
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    EXPECT_DEATH(ncclAllReduce(big.get(), big.get(), kN, ncclFloat32, ncclSum, comm_, other),
                 "ncclAllReduce: stream 0x[0-9a-f]+ belongs to device 1 but the communicator to device 0");
    cudaStreamDestroy(other);
  }
}

}  // namespace
