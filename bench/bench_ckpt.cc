// bench_ckpt: checkpoint save and load throughput beside a plain sequential write of the same
// bytes (fwrite of each rank's master/m/v slices + fsync) to the same disk. A program that
// prints figures, not a test.
//
//   [mpirun -n N] build/bench/bench_ckpt [preset=d6] [dir=bench_ckpt.tmp] [reps=3] [stage=1]
//
// Every rank holds an engine of the preset model (random state), so each rank writes its 1/N
// slice. Time = the slowest rank's wall time between barriers; figures are medians over reps,
// save and baseline interleaved so both see the same disk conditions. The page cache is not
// dropped (not possible unprivileged in general): both paths pay the same fsync. Deleting
// old checkpoints (keep_last) is left out of the timed save, as removing the baseline file is.
// Each rep also saves the same state with the async writer (--async-ckpt) the way the trainer
// does: Save, then one training step of the model (B=2, T=64, one thread: forward and backward, WaitStaged,
// the optimizer step): training's stall is Save's time plus WaitStaged's, beside the
// synchronous save's time; the step's time beside a step with no save in flight; and the
// background write's own time until Wait returns.
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "base/clock.h"
#include "ckpt/async_checkpoint.h"
#include "ckpt/checkpoint.h"
#include "model/gpt.h"
#include "model/kernels_cpu.h"
#include "parallel/mpi_communicator.h"

namespace shardgpt {
namespace {

double MaxOverRanks(double v) {
  double out = v;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The baseline: this rank's slices, written sequentially with fwrite, then fsync.
double PlainWrite(const std::string& path, Engine& engine, const ParamLayout& layout, int rank, int world) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MonotonicSeconds();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::exit(1);
  }
  const auto pieces = PlanSave(layout, world);
  for (int k = 0; k < 3; k++)
    for (const SavedPiece& p : pieces) {
      if (p.file != rank) continue;
      for (const Engine::OwnedState& st : engine.OwnedPieces(p.unit)) {
        if (p.begin < st.begin || p.end > st.end) continue;
        const float* base = k == 0 ? st.master : k == 1 ? st.m : st.v;
        std::fwrite(base + (p.begin - st.begin), sizeof(float), p.end - p.begin, f);
      }
    }
  std::fflush(f);
  fsync(fileno(f));
  std::fclose(f);
  return MaxOverRanks(MonotonicSeconds() - t0);
}

int Main(int argc, char** argv) {
  const std::string preset = argc > 1 ? argv[1] : "d6";
  const std::string dir = argc > 2 ? argv[2] : "bench_ckpt.tmp";
  const int reps = argc > 3 ? std::atoi(argv[3]) : 3;
  const int stage = argc > 4 ? std::atoi(argv[4]) : 1;
  auto config = PresetConfig(preset);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
    return 1;
  }
  auto comm_or = MpiCommunicator::Create(MPI_COMM_WORLD);
  if (!comm_or.ok()) return 1;
  Communicator& comm = *comm_or.value();
  const int rank = comm.rank(), world = comm.world_size();
  ParamLayout layout(config.value());
  EngineOptions opt;
  opt.zero_stage = stage;
  auto engine_or = Engine::Create(layout, &comm, opt);
  if (!engine_or.ok()) return 1;
  Engine& engine = *engine_or.value();
  {
    std::vector<float> full(layout.total_numel());
    InitParameters(layout, 1, full.data());
    engine.LoadFullParams(full.data());
  }
  for (int u = 0; u < layout.num_units(); u++) {  // non-trivial moments
    for (const Engine::OwnedState& st : engine.OwnedPieces(u))
      for (size_t i = 0; i < st.end - st.begin; i++) st.m[i] = 1e-3f * st.master[i], st.v[i] = 1e-6f + st.m[i] * st.m[i];
  }
  const double bytes = 3.0 * 4.0 * layout.total_numel();
  if (rank == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::printf("bench_ckpt: model %s (%.1fM params), %d rank(s), stage %d, %.3f GB of fp32 state (master, m, v), "
                "dir %s, %d reps\n",
                preset.c_str(), layout.total_numel() / 1e6, world, stage, bytes / 1e9, dir.c_str(), reps);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<double> save_s, plain_s, load_s, stall_s, write_s, step_s, step_ckpt_s;
  const int B = 2, T = 64;
  SetComputeThreads(1);  // one compute thread per rank (the trainer's default on 2 cores, 2 ranks)
  GPT model(layout.config(), B, T, engine.device());
  std::vector<int32_t> x(B * T), y(B * T);
  for (int i = 0; i < B * T; i++) x[i] = (i * 7 + rank) % layout.config().vocab_size, y[i] = (i * 11) % layout.config().vocab_size;
  // One training step; `before_step` runs between backward and the optimizer step.
  auto train_step = [&](const std::function<void()>& before_step) {
    engine.BeginStep();
    engine.BeginMicroBatch(0, 1);
    model.Forward(engine, x.data(), y.data(), B, T, 1.0f);
    model.Backward(engine);
    before_step();
    engine.Step(1e-4f, 1.0f);
  };
  train_step([] {});  // warm-up
  auto async_or = AsyncCheckpointer::Create(comm, engine.device(), dir, 0, true);
  if (!async_or.ok()) {
    std::fprintf(stderr, "%s\n", async_or.status().ToString().c_str());
    return 1;
  }
  AsyncCheckpointer& async = *async_or.value();
  TrainState state;
  for (int r = 0; r < reps; r++) {
    const std::string plain = dir + "/plain_rank" + std::to_string(rank) + ".bin";
    plain_s.push_back(PlainWrite(plain, engine, layout, rank, world));
    std::remove(plain.c_str());
    MPI_Barrier(MPI_COMM_WORLD);
    state.step = r;
    const double t0 = MonotonicSeconds();
    Status st = SaveCheckpoint(dir, state, engine, layout, comm, 0, rank != 0 || r > 0);
    save_s.push_back(MaxOverRanks(MonotonicSeconds() - t0));
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double t1 = MonotonicSeconds();
    auto ld = LoadCheckpoint("latest", dir, engine, layout, comm, r > 0);
    load_s.push_back(MaxOverRanks(MonotonicSeconds() - t1));
    if (!ld.ok()) {
      std::fprintf(stderr, "%s\n", ld.status().ToString().c_str());
      return 1;
    }
    // A training step alone, then the same state through the async writer with a step behind it.
    MPI_Barrier(MPI_COMM_WORLD);
    const double t3 = MonotonicSeconds();
    train_step([] {});
    step_s.push_back(MaxOverRanks(MonotonicSeconds() - t3));
    MPI_Barrier(MPI_COMM_WORLD);
    state.step = 1000 + r;
    const double t2 = MonotonicSeconds();
    st = async.Save(state, engine, layout);
    double stall = MonotonicSeconds() - t2;
    if (st.ok())
      train_step([&] {
        const double w = MonotonicSeconds();
        async.WaitStaged();
        stall += MonotonicSeconds() - w;
      });
    step_ckpt_s.push_back(MaxOverRanks(MonotonicSeconds() - t2));
    stall_s.push_back(MaxOverRanks(stall));
    if (st.ok()) st = async.Wait();
    write_s.push_back(MaxOverRanks(MonotonicSeconds() - t2));
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
    // Deleting the previous checkpoint (keep_last) is not part of the write being compared.
    if (rank == 0) std::filesystem::remove_all(dir + "/" + StepDirName(r));
    if (rank == 0) std::filesystem::remove_all(dir + "/" + StepDirName(1000 + r));
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (rank == 0) {
    const double s = Median(save_s), p = Median(plain_s), l = Median(load_s);
    std::printf("plain fwrite+fsync: %.3f s  %.2f GB/s total\n", p, bytes / p / 1e9);
    std::printf("checkpoint save:    %.3f s  %.2f GB/s total  (%.0f%% of plain; goal >= 70%%)\n", s, bytes / s / 1e9,
                100.0 * p / s);
    std::printf("checkpoint load:    %.3f s  %.2f GB/s total (page cache warm)\n", l, bytes / l / 1e9);
    const double a = Median(stall_s), w = Median(write_s);
    std::printf("async save: training blocked %.4f s = %.1f%% of the synchronous save (goal <= 10%%); background "
                "write %.3f s (from Save to Wait)\n", a, 100.0 * a / s, w);
    std::printf("training step (B=%d T=%d): %.3f s alone, %.3f s with the async save's Save + copy behind it\n", B, T,
                Median(step_s), Median(step_ckpt_s));
    std::filesystem::remove_all(dir);
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
