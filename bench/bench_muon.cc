// bench_muon: what distributed Muon costs each rank, against its goals (below). A program that
// prints figures, not a test. Run it at several rank counts:
//
//   OPENBLAS_NUM_THREADS=1 mpirun -n N build/bench/bench_muon [--n-layer L] [--n-embd C]
//                                                             [--zero-stage S] [--steps K] [--bf16 1]
//
// It trains K steps of a GPT (default L=4, C=256) with --optimizer muon on this world and
// prints, per rank and as the maximum over ranks:
//  - all_to_all bytes sent per step (the ledger), against the goal 2 x (2 Psi_muon / N) bytes
//    (the seed's 2-byte elements) and its fp32 form 2 x (4 Psi_muon / N), and against an
//    all-gather of every matrix (Moonlight's approach, ~2 Psi_muon x (N-1)/N in bf16); with
//    --bf16 1 (bf16 storage and reduction) U and the updates travel in bf16, the goal's units;
//  - Newton-Schulz CPU time of the owner's matrices (the training thread's CPU clock, the
//    median over the steps after the first), against T1: the CPU time rank 0 needs, in the
//    same run, to orthogonalise EVERY matrix alone (one rank's work). Goal: max <= T1/N + 10%.
//    CPU time, not wall time, because ranks here share 2 cores: it measures each rank's share
//    of the work; wall time follows it when every rank has its own core.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "model/kernels_cpu.h"
#include "model/muon.h"
#include "model/rng.h"
#include "parallel/engine.h"
#include "parallel/mpi_communicator.h"

namespace shardgpt {
namespace {

double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Main(int argc, char** argv) {
  int L = 4, C = 256, stage = 1, steps = 4, bf16 = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (a == "--n-layer") L = v;
    else if (a == "--n-embd") C = v;
    else if (a == "--zero-stage") stage = v;
    else if (a == "--steps") steps = std::max(2, v);
    else if (a == "--bf16") bf16 = v;
    else {
      std::fprintf(stderr, "bench_muon: error: unknown flag %s\n", a.c_str());
      return 1;
    }
  }
  auto comm_or = MpiCommunicator::Create(MPI_COMM_WORLD);
  if (!comm_or.ok()) return 1;
  Communicator& comm = *comm_or.value();
  const int N = comm.world_size(), me = comm.rank();
  SetComputeThreads(1);
  GPTConfig cfg{L, 4, C, 32, 256};
  ParamLayout layout(cfg);
  EngineOptions eo;
  eo.zero_stage = stage;
  eo.optimizer = OptimizerKind::kMuon;
  if (bf16) eo.dtype = eo.reduce_dtype = DType::kBF16;
  auto engine_or = Engine::Create(layout, &comm, eo);
  if (!engine_or.ok()) {
    std::fprintf(stderr, "bench_muon: error: %s\n", engine_or.status().message().c_str());
    return 1;
  }
  Engine& engine = *engine_or.value();
  engine.InitOwned(1);
  const int B = 2, T = 32;
  GPT model(cfg, B, T);
  std::vector<int32_t> x(B * T), y(B * T);
  std::vector<double> ns_cpu, ns_wall;
  uint64_t a2a = 0;
  for (int s = 0; s < steps; s++) {
    Rng rng(10 * s + me);
    for (int i = 0; i < B * T; i++) x[i] = static_cast<int32_t>(rng.Next() % 256), y[i] = (x[i] * 7 + 3) % 256;
    engine.BeginStep();
    engine.BeginMicroBatch(0, 1);
    model.Forward(engine, x.data(), y.data(), B, T, 1.0f);
    model.Backward(engine);
    engine.Step(1e-3f, 1.0f);
    const StepReport& r = engine.last_report();
    a2a = r.comm[CollKind::kAllToAll].bytes_sent;
    if (s > 0) ns_cpu.push_back(r.muon_ns_cpu_s), ns_wall.push_back(r.muon_ns_s);
  }
  const MuonPlan& mp = *engine.muon_plan();
  // T1: every matrix orthogonalised by one rank (rank 0, the others wait), same shapes.
  double t1 = 0;
  comm.Barrier();
  if (me == 0) {
    std::vector<double> reps;
    for (int rep = 0; rep < steps - 1; rep++) {
      double t = 0;
      for (const MuonMatrix& m : mp.matrices()) {
        std::vector<float> u(m.numel());
        Rng rng(rep * 1000 + m.begin);
        for (float& e : u) e = static_cast<float>(rng.Next() % 2001) / 1000.0f - 1.0f;
        const double c0 = CpuSeconds();
        NewtonSchulz(u.data(), m.rows, m.cols, eo.muon.ns_steps);
        t += CpuSeconds() - c0;
      }
      reps.push_back(t);
    }
    t1 = Median(reps);
  }
  comm.Barrier();
  const double mine_cpu = Median(ns_cpu), mine_wall = Median(ns_wall);
  std::vector<double> all(3 * N);
  const double local[3] = {mine_cpu, mine_wall, static_cast<double>(a2a)};
  comm.ControlAllGather(local, all.data(), sizeof(local));
  if (me == 0) {
    const double psi_muon = static_cast<double>(mp.muon_numel());
    double max_cpu = 0, max_a2a = 0, total_flops = 0, max_flops = 0;
    for (int r = 0; r < N; r++) {
      max_cpu = std::max(max_cpu, all[3 * r]);
      max_a2a = std::max(max_a2a, all[3 * r + 2]);
      total_flops += mp.OwnerFlops(r);
      max_flops = std::max(max_flops, mp.OwnerFlops(r));
    }
    std::printf("bench_muon: L%d C%d, %zu Muon matrices, Psi_muon %.0f, %d rank(s), zero stage %d, %s, %d steps\n", L,
                C, mp.matrices().size(), psi_muon, N, stage, bf16 ? "bf16" : "fp32", steps);
    for (int r = 0; r < N; r++)
      std::printf("  rank %d: all_to_all %.0f B/step | Newton-Schulz cpu %.2f ms, wall %.2f ms | %.1f%% of the FLOPs\n", r,
                  all[3 * r + 2], all[3 * r] * 1e3, all[3 * r + 1] * 1e3, 100 * mp.OwnerFlops(r) / total_flops);
    const double goal2 = 2 * (2 * psi_muon / N), goal4 = 2 * (4 * psi_muon / N);
    std::printf("traffic: max %.0f B/rank/step; goal 2x(2 Psi_muon/N) = %.0f B (fp32 form 2x(4 Psi_muon/N) = %.0f B): "
                "%.2f of the goal in the wire's element size; all-gather of every matrix (bf16) = %.0f B\n",
                max_a2a, goal2, goal4, N > 1 ? max_a2a / (bf16 ? goal2 : goal4) : 0.0, 2 * psi_muon * (N - 1.0) / N);
    std::printf("Newton-Schulz: T1 (all matrices, one rank) %.2f ms cpu; max per rank %.2f ms = %.3f T1 "
                "(goal <= 1/N + 10%% = %.3f T1); FLOP share of the busiest rank %.3f\n",
                t1 * 1e3, max_cpu * 1e3, t1 > 0 ? max_cpu / t1 : 0.0, 1.0 / N * 1.1, max_flops / total_flops);
  }
  return 0;
}

}  // namespace
}  // namespace shardgpt

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rc = shardgpt::Main(argc, argv);
  MPI_Finalize();
  return rc;
}
