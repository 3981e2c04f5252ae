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
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "parallel/mpi_communicator.h"

namespace shardgpt {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
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
  const double t0 = Now();
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
  return MaxOverRanks(Now() - t0);
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
  std::vector<double> save_s, plain_s, load_s;
  TrainState state;
  for (int r = 0; r < reps; r++) {
    const std::string plain = dir + "/plain_rank" + std::to_string(rank) + ".bin";
    plain_s.push_back(PlainWrite(plain, engine, layout, rank, world));
    std::remove(plain.c_str());
    MPI_Barrier(MPI_COMM_WORLD);
    state.step = r;
    const double t0 = Now();
    Status st = SaveCheckpoint(dir, state, engine, layout, comm, 0, rank != 0 || r > 0);
    save_s.push_back(MaxOverRanks(Now() - t0));
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double t1 = Now();
    auto ld = LoadCheckpoint("latest", dir, engine, layout, comm, r > 0);
    load_s.push_back(MaxOverRanks(Now() - t1));
    if (!ld.ok()) {
      std::fprintf(stderr, "%s\n", ld.status().ToString().c_str());
      return 1;
    }
    // Deleting the previous checkpoint (keep_last) is not part of the write being compared.
    if (rank == 0) std::filesystem::remove_all(dir + "/" + StepDirName(r));
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (rank == 0) {
    const double s = Median(save_s), p = Median(plain_s), l = Median(load_s);
    std::printf("plain fwrite+fsync: %.3f s  %.2f GB/s total\n", p, bytes / p / 1e9);
    std::printf("checkpoint save:    %.3f s  %.2f GB/s total  (%.0f%% of plain; goal >= 70%%)\n", s, bytes / s / 1e9,
                100.0 * p / s);
    std::printf("checkpoint load:    %.3f s  %.2f GB/s total (page cache warm)\n", l, bytes / l / 1e9);
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
