// bench_comm: bandwidth of the MpiCommunicator collectives, and how much of an all-reduce
// hides behind computation on the calling thread. A program that prints figures, not a test.
//
//   mpirun -n 2 build/bench/bench_comm [--device cpu|cuda] [--comm auto|mpi|nccl] [MiB ...]
//                                                      (default sizes: 1 8 64)
// With --device cuda the buffers live on each rank's GPU and the communicator is NCCL (or MPI
// staging through host memory with --comm mpi); the overlap part is CPU-only.
//
// Bandwidth, as nccl-tests defines it: S = the all-reduce buffer, the reduce-scatter input or
// the all-gather output of all ranks; time = mean per call over the timed calls, the slowest
// rank's; algbw = S / time; busbw = algbw * CommLedger::BusBandwidthFactor. Warm-up calls
// first; results are checked outside the timed region.
//
// Overlap: t_comm (all-reduce alone), t_comp (a fixed amount of computation alone) and t_both
// (all-reduce launched, the same computation, then Wait). hidden = (t_comm + t_comp - t_both)
// / min(t_comm, t_comp): 1 = fully overlapped, 0 = serialised. Medians of 5 repetitions.
// On an oversubscribed machine the communication thread competes with compute for cores.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <string>

#include "model/device_factory.h"
#include "parallel/comm_factory.h"
#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"

namespace shardgpt {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double MaxOverRanks(double v) {
  double out = v;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);  // communicator idle here
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times `iters` back-to-back launches of one collective (waiting for the last), in seconds
// per call, slowest rank.
template <typename Launch>
double TimeCollective(Communicator& comm, Launch launch, int iters) {
  for (int i = 0; i < 2; ++i) launch()->Wait();
  comm.Barrier();
  const auto t0 = Clock::now();
  std::shared_ptr<Work> last;
  for (int i = 0; i < iters; ++i) last = launch();
  last->Wait();
  return MaxOverRanks(Seconds(t0, Clock::now()) / iters);
}

// Fixed amount of computation on the calling thread (no MPI).
float Compute(std::vector<float>& x, int passes) {
  float acc = 0;
  for (int p = 0; p < passes; ++p) {
    for (float& v : x) {
      v = v * 0.999f + 0.001f;
      acc += v;
    }
  }
  return acc;
}

// The first and last element of a device buffer, on the host.
std::pair<float, float> Ends(Device& dev, const float* p, size_t n) {
  float a = 0, b = 0;
  dev.Synchronize();
  dev.CopyToHost(&a, p, sizeof(float));
  dev.CopyToHost(&b, p + n - 1, sizeof(float));
  return {a, b};
}

int Run(int argc, char** argv) {
  std::string device_kind = "cpu";
  CommOptions comm_options;
  std::vector<double> sizes_mib;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--device" && i + 1 < argc) device_kind = argv[++i];
    else if (a == "--comm" && i + 1 < argc) comm_options.kind = argv[++i];
    else sizes_mib.push_back(std::atof(argv[i]));
  }
  if (sizes_mib.empty()) sizes_mib = {1, 8, 64};
  int local_rank = 0, local_size = 1;
  {
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &local_rank), MPI_Comm_size(local, &local_size);
    MPI_Comm_free(&local);
  }
  auto dev_or = CreateDevice(device_kind, local_rank, local_size);
  if (!dev_or.ok()) {
    std::fprintf(stderr, "bench_comm: %s\n", dev_or.status().message().c_str());
    return 1;
  }
  Device& dev = *dev_or.value();
  auto made = CreateCommunicator(comm_options, MPI_COMM_WORLD, dev, local_size, VisibleGpuCount());
  if (!made.ok()) {
    std::fprintf(stderr, "bench_comm: %s\n", made.status().ToString().c_str());
    return 1;
  }
  Communicator& comm = **made;
  const int n = comm.world_size();
  const bool root = comm.rank() == 0;

  if (root) {
    std::printf("# bench_comm: %d ranks, fp32, %s, comm %s, time = mean per call (slowest rank)\n", n,
                dev.name().c_str(), ResolveCommKind(comm_options.kind, dev).c_str());
    std::printf("%-15s %10s %10s %12s %12s %14s\n", "collective", "S (MiB)", "time (ms)", "algbw GB/s", "busbw GB/s",
                "ledger B/call");
  }
  double busbw_sum = 0;
  int busbw_rows = 0;
  for (double mib : sizes_mib) {
    // S elements in total, rounded to a multiple of the world size.
    const size_t total = std::max<size_t>(n, static_cast<size_t>(mib * (1 << 20) / 4) / n * n);
    const size_t block = total / n;
    DeviceBuffer abuf(&dev, nullptr, MemKind::kGrads, total * 4, "a"), bbuf(&dev, nullptr, MemKind::kGrads, total * 4, "b");
    {
      std::vector<float> ones(total, 1.0f);
      dev.CopyToDevice(abuf.data(), ones.data(), total * 4);
    }
    float* a = abuf.as<float>();
    float* b = bbuf.as<float>();
    const int iters = mib >= 32 ? 5 : 10;
    for (CollKind kind : {CollKind::kAllReduce, CollKind::kReduceScatter, CollKind::kAllGather}) {
      comm.ledger().Reset();
      double t = 0;
      bool ok = true;
      if (kind == CollKind::kAllReduce) {
        t = TimeCollective(comm, [&] { return comm.AllReduce(a, total, DType::kF32, ReduceOp::kAvg); }, iters);
        const auto e = Ends(dev, a, total);
        ok = e.first == 1.0f && e.second == 1.0f;  // avg of ones stays one
      } else if (kind == CollKind::kReduceScatter) {
        t = TimeCollective(comm, [&] { return comm.ReduceScatter(a, b, block, DType::kF32, ReduceOp::kSum); }, iters);
        const auto e = Ends(dev, b, block);
        ok = e.first == static_cast<float>(n) && e.second == static_cast<float>(n);
      } else {
        t = TimeCollective(comm, [&] { return comm.AllGather(a, b, block, DType::kF32); }, iters);
        const auto e = Ends(dev, b, total);
        ok = e.first == 1.0f && e.second == 1.0f;
      }
      const CommLedger::Counter& c = comm.ledger()[kind];
      const double bytes = static_cast<double>(total) * 4;
      const double algbw = bytes / t / 1e9;
      const double busbw = algbw * CommLedger::BusBandwidthFactor(kind, n);
      busbw_sum += busbw;
      ++busbw_rows;
      if (root) {
        std::printf("%-15s %10.2f %10.3f %12.3f %12.3f %14llu%s\n", CollKindName(kind), bytes / (1 << 20), t * 1e3,
                    algbw, busbw, static_cast<unsigned long long>(c.calls ? c.bytes_sent / c.calls : 0),
                    ok ? "" : "  WRONG RESULT");
      }
    }
  }
  if (root) std::printf("# average busbw: %.3f GB/s\n", busbw_sum / busbw_rows);
  if (dev.is_cuda()) return 0;  // the overlap part below computes on the host

  // Overlap of a 32 MiB all-reduce with computation on the calling thread.
  const size_t count = size_t{8} << 20;
  std::vector<float> grad(count, 1.0f), work(1 << 16, 1.0f);
  // Calibrate the computation to take about as long as the all-reduce alone.
  comm.AllReduce(grad.data(), count, DType::kF32, ReduceOp::kAvg)->Wait();  // warm-up
  comm.Barrier();
  auto t0 = Clock::now();
  comm.AllReduce(grad.data(), count, DType::kF32, ReduceOp::kAvg)->Wait();
  const double t_ar = MaxOverRanks(Seconds(t0, Clock::now()));
  t0 = Clock::now();
  volatile float sink = Compute(work, 4);
  const double per_pass = Seconds(t0, Clock::now()) / 4;
  const int passes = static_cast<int>(MaxOverRanks(std::max(1.0, t_ar / per_pass)));
  std::vector<double> comm_s, comp_s, both_s;
  for (int rep = 0; rep < 5; ++rep) {
    comm.Barrier();
    t0 = Clock::now();
    comm.AllReduce(grad.data(), count, DType::kF32, ReduceOp::kAvg)->Wait();
    comm_s.push_back(MaxOverRanks(Seconds(t0, Clock::now())));
    comm.Barrier();
    t0 = Clock::now();
    sink = sink + Compute(work, passes);
    comp_s.push_back(MaxOverRanks(Seconds(t0, Clock::now())));
    comm.Barrier();
    t0 = Clock::now();
    auto w = comm.AllReduce(grad.data(), count, DType::kF32, ReduceOp::kAvg);
    sink = sink + Compute(work, passes);
    w->Wait();
    both_s.push_back(MaxOverRanks(Seconds(t0, Clock::now())));
  }
  const double tc = Median(comm_s), tp = Median(comp_s), tb = Median(both_s);
  const double hidden = (tc + tp - tb) / std::min(tc, tp);
  if (root) {
    std::printf("# overlap, 32 MiB all-reduce vs computation on the caller (medians of 5, ms):\n");
    std::printf("t_comm %.1f  t_comp %.1f  t_both %.1f  serial %.1f  hidden %.0f%%\n", tc * 1e3, tp * 1e3, tb * 1e3,
                (tc + tp) * 1e3, hidden * 100);
  }
  return grad.front() == 1.0f ? 0 : 2;
}

}  // namespace
}  // namespace shardgpt

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rc = shardgpt::Run(argc, argv);
  MPI_Finalize();
  return rc;
}
