// The NCCL communicator (bootstrapped from MPI), run under mpirun with 1 and 2
// ranks: every collective against the MPI communicator (staging through host memory) on the
// same data in fp32 and bf16; the engine at stages 0-3 over NCCL against the CPU backend; with
// 2 GPUs, 2 ranks x stages 0-3 x accumulation {1, 4} against 1 rank on the same global batch,
// with the traffic ledger equal to the plan's figures. Without a usable GPU (or without a
// second one for the 2-rank cases) each test is SKIPPED with the reason, never passed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "base/bf16.h"
#include "model/device_factory.h"
#include "model/gpt.h"
#include "model/kernels_cpu.h"
#include "model/rng.h"
#include "parallel/comm_factory.h"
#include "parallel/engine.h"
#include "parallel/mpi_communicator.h"
#include "tests/mpi/engine_harness.h"

namespace shardgpt {
namespace {

constexpr int kGlobalBatch = 8, kT = 32, kSteps = 3;
const GPTConfig kConfig{2, 4, 64, 64, 300};

using harness::NodeLocalRank;

// This rank's GPU for an NCCL run: needs one GPU per local rank. Null with the reason.
std::unique_ptr<Device> GpuPerRank(std::string* why) {
  int lr = 0, ls = 1;
  NodeLocalRank(&lr, &ls);
  if (!NcclBuilt()) return *why = "this build has no NCCL", nullptr;
  const int gpus = VisibleGpuCount();
  if (gpus < ls) return *why = std::to_string(ls) + " ranks need " + std::to_string(ls) + " GPUs, " +
                               std::to_string(gpus) + " visible", nullptr;
  auto d = CreateDevice("cuda", lr, ls);
  if (!d.ok()) return *why = d.status().message(), nullptr;
  return std::move(d.value());
}

// Every rank must agree to skip (a collective test cannot run on some ranks only).
#define REQUIRE_GPU_PER_RANK(dev)                                                      \
  std::string why_;                                                                    \
  std::unique_ptr<Device> dev = GpuPerRank(&why_);                                     \
  int have_ = dev != nullptr;                                                          \
  MPI_Allreduce(MPI_IN_PLACE, &have_, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);           \
  if (!have_) GTEST_SKIP() << "no GPU per rank: " << (why_.empty() ? "another rank has none" : why_)

std::unique_ptr<Communicator> Make(const std::string& kind, Device& device) {
  int lr = 0, ls = 1;
  NodeLocalRank(&lr, &ls);
  CommOptions o;
  o.kind = kind;
  o.timeout_s = 60;
  auto c = CreateCommunicator(o, MPI_COMM_WORLD, device, ls, VisibleGpuCount());
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? std::move(c.value()) : nullptr;
}

// Host values (fp32) of n elements that differ per rank, stored as dtype on the device.
void Fill(Device& dev, void* dst, DType dtype, size_t n, int seed) {
  std::vector<float> v(n);
  Rng rng(seed);
  for (float& x : v) x = static_cast<float>(rng.Uniform() * 2 - 1);
  std::vector<uint16_t> b(n);
  if (dtype == DType::kBF16) FloatToBf16(v.data(), b.data(), n);
  dev.CopyToDevice(dst, dtype == DType::kF32 ? static_cast<const void*>(v.data()) : b.data(), n * DTypeSize(dtype));
}

std::vector<uint8_t> Read(Device& dev, const void* src, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  dev.Synchronize();
  dev.CopyToHost(out.data(), src, bytes);
  return out;
}

// All four collectives through NCCL and through MPI on the same inputs. fp32 sums of N <= 2
// values are exact in any order; bf16 sums too are the same rounding of the same pair.
TEST(Nccl, EveryCollectiveMatchesMpi) {
  REQUIRE_GPU_PER_RANK(gpu);
  auto nccl = Make("nccl", *gpu), mpi = Make("mpi", *gpu);
  ASSERT_TRUE(nccl && mpi);
  const int N = nccl->world_size(), r = nccl->rank();
  for (DType d : {DType::kF32, DType::kBF16}) {
    const size_t shard = 1000, n = shard * N, e = DTypeSize(d);
    DeviceBuffer a(gpu.get(), nullptr, MemKind::kGrads, n * e, "a"), b(gpu.get(), nullptr, MemKind::kGrads, n * e, "b");
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      Fill(*gpu, a.data(), d, n, 10 + r), Fill(*gpu, b.data(), d, n, 10 + r);
      nccl->AllReduce(a.data(), n, d, op)->Wait();
      mpi->AllReduce(b.data(), n, d, op)->Wait();
      EXPECT_EQ(Read(*gpu, a.data(), n * e), Read(*gpu, b.data(), n * e)) << "all_reduce " << DTypeName(d);
      Fill(*gpu, a.data(), d, n, 20 + r), Fill(*gpu, b.data(), d, n, 20 + r);
      void* ra = a.as<uint8_t>() + r * shard * e;
      void* rb = b.as<uint8_t>() + r * shard * e;
      nccl->ReduceScatter(a.data(), ra, shard, d, op)->Wait();
      mpi->ReduceScatter(b.data(), rb, shard, d, op)->Wait();
      EXPECT_EQ(Read(*gpu, ra, shard * e), Read(*gpu, rb, shard * e)) << "reduce_scatter " << DTypeName(d);
    }
    Fill(*gpu, a.data(), d, n, 30 + r), Fill(*gpu, b.data(), d, n, 30 + r);
    nccl->AllGather(a.as<uint8_t>() + r * shard * e, a.data(), shard, d)->Wait();
    mpi->AllGather(b.as<uint8_t>() + r * shard * e, b.data(), shard, d)->Wait();
    EXPECT_EQ(Read(*gpu, a.data(), n * e), Read(*gpu, b.data(), n * e)) << "all_gather " << DTypeName(d);
    Fill(*gpu, a.data(), d, n, 40 + r), Fill(*gpu, b.data(), d, n, 40 + r);
    nccl->Broadcast(a.data(), n, d, N - 1)->Wait();
    mpi->Broadcast(b.data(), n, d, N - 1)->Wait();
    EXPECT_EQ(Read(*gpu, a.data(), n * e), Read(*gpu, b.data(), n * e)) << "broadcast " << DTypeName(d);
  }
  EXPECT_EQ(nccl->ledger().Total().bytes_sent, mpi->ledger().Total().bytes_sent);
}

struct Trajectory : harness::Trajectory {
  std::vector<StepReport> reports;
};

// kSteps steps (harness::TrainSteps, lr 3e-3, clip 1) on a new engine.
Trajectory Train(Communicator& comm, Device& device, EngineOptions eo, int A) {
  ParamLayout layout(kConfig);
  device.kernels().set_matmul_precision(MatmulPrecision::kExact);
  auto engine = std::move(Engine::Create(layout, &comm, eo, device).value());
  std::vector<float> init(layout.total_numel());
  InitParameters(layout, 1, init.data());
  engine->LoadFullParams(init.data());
  GPT model(kConfig, kGlobalBatch / (comm.world_size() * A), kT, device);
  Trajectory tr;
  harness::TrainSteps(
      *engine, model, comm, A, kT, 3e-3f, 1.0f,
      [](int s, std::vector<int32_t>* x, std::vector<int32_t>* y) {
        harness::SyntheticBatch(700 + s, kGlobalBatch, kT, kConfig.vocab_size, x, y);
      },
      0, kSteps, &tr, &tr.reports);
  tr.params.resize(layout.total_numel());
  engine->GatherFullParams(tr.params.data());
  return tr;
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); i++) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

// The engine over NCCL at every stage and accumulation {1, 4}: losses within 1e-4 of the CPU
// backend's one-process run on the same global batch (fp32, TF32 off), and the traffic ledger
// equal to the plan's exact figures.
TEST(Nccl, EngineMatchesCpuAtEveryStage) {
  REQUIRE_GPU_PER_RANK(gpu);
  SetComputeThreads(1);
  auto nccl = Make("nccl", *gpu);
  ASSERT_TRUE(nccl);
  auto cpu_comm = MpiCommunicator::Create(MPI_COMM_SELF);
  ASSERT_TRUE(cpu_comm.ok());
  ParamLayout layout(kConfig);
  for (int A : {1, 4})
    for (int stage = 0; stage <= 3; stage++) {
      EngineOptions eo;
      eo.zero_stage = stage;
      const Trajectory ref = Train(*cpu_comm.value(), CpuDevice(), eo, A * nccl->world_size());
      const Trajectory got = Train(*nccl, *gpu, eo, A);
      for (int s = 0; s < kSteps; s++)
        EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-4) << "stage " << stage << " A " << A << " step " << s;
      EXPECT_LT(MaxAbsDiff(got.params, ref.params), 1e-4) << "stage " << stage << " A " << A;
      const CommLedger want = ExpectedStepTraffic(layout, ShardPlan(layout, nccl->world_size()), eo, A);
      for (size_t k = 0; k < kNumCollKinds; k++)
        EXPECT_EQ(got.reports.back().comm.kinds[k].bytes_sent, want.kinds[k].bytes_sent)
            << CollKindName(CollKind(k)) << " stage " << stage << " A " << A;
    }
}

}  // namespace
}  // namespace shardgpt
