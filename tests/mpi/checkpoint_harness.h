// The harness the multi-rank checkpoint tests share (checkpoint_test.cc,
// checkpoint_fallback_test.cc): a small model, a directory every rank sees, one data-parallel
// run over an MPI communicator, real training steps on synthetic tokens (so m and v are not
// zero), and the full optimizer state as raw bits (a checkpoint is pure data movement).
#ifndef SHARDGPT_TESTS_MPI_CHECKPOINT_HARNESS_H_
#define SHARDGPT_TESTS_MPI_CHECKPOINT_HARNESS_H_

#include <gtest/gtest.h>
#include <mpi.h>
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "model/gpt.h"
#include "parallel/engine.h"
#include "parallel/mpi_communicator.h"

namespace shardgpt {
namespace ckpt_harness {

constexpr int kB = 2, kT = 16;

inline GPTConfig SmallConfig(int layers = 2) {
  GPTConfig c;
  c.n_layer = layers;
  c.n_head = 2;
  c.n_embd = 32;
  c.max_seq_len = 64;
  c.vocab_size = 256;
  return c;
}

inline int WorldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int WorldSize() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// A directory every rank of the job sees, made by rank 0 ("ckpt_<tag>_XXXXXX" in the
// temporary directory; empty if it could not be made) and removed by Cleanup.
inline std::string SharedDir(const char* tag) {
  char buf[256] = {0};
  if (WorldRank() == 0) {
    const std::string tmpl =
        (std::filesystem::temp_directory_path() / (std::string("ckpt_") + tag + "_XXXXXX")).string();
    std::snprintf(buf, sizeof(buf), "%s", tmpl.c_str());
    if (mkdtemp(buf) == nullptr) buf[0] = '\0';
  }
  MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, MPI_COMM_WORLD);
  return buf;
}
inline void Cleanup(const std::string& dir) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (WorldRank() == 0) std::filesystem::remove_all(dir);
}

// One data-parallel run over an MPI communicator: communicator, layout, engine, model.
struct Run {
  MPI_Comm mpi = MPI_COMM_NULL;
  std::unique_ptr<MpiCommunicator> comm;
  std::unique_ptr<ParamLayout> layout;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<GPT> model;
  int64_t steps = 0;
};

// A run on `mpi` from InitParameters(seed); device: where the engine keeps its state (default:
// host memory).
inline std::unique_ptr<Run> MakeRun(MPI_Comm mpi, const GPTConfig& config, int stage, uint64_t seed,
                                    DType dtype = DType::kF32, Device& device = CpuDevice(),
                                    ShardLayout shard_layout = ShardLayout::kFlat,
                                    OptimizerKind optimizer = OptimizerKind::kAdamW) {
  auto run = std::make_unique<Run>();
  run->mpi = mpi;
  auto comm = MpiCommunicator::Create(mpi, &device);
  EXPECT_TRUE(comm.ok()) << comm.status().ToString();
  run->comm = std::move(comm).value();
  run->layout = std::make_unique<ParamLayout>(config);
  EngineOptions opt;
  opt.zero_stage = stage;
  opt.dtype = dtype;
  opt.reduce_dtype = dtype;
  opt.optimizer = optimizer;
  opt.shard_layout = shard_layout;
  auto engine = Engine::Create(*run->layout, run->comm.get(), opt, device);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  run->engine = std::move(engine).value();
  std::vector<float> full(run->layout->total_numel());
  InitParameters(*run->layout, seed, full.data());
  run->engine->LoadFullParams(full.data());
  run->model = std::make_unique<GPT>(config, kB, kT, device);
  return run;
}

// Real training steps on synthetic tokens (different on every rank and step), so m and v
// are non-trivial. The data depends on the global step, so a resumed run sees the same.
inline void Train(Run& run, int steps) {
  const int rank = run.comm->rank();
  std::vector<int32_t> x(kB * kT), y(kB * kT);
  for (int s = 0; s < steps; s++, run.steps++) {
    for (int i = 0; i < kB * kT; i++) {
      x[i] = static_cast<int32_t>((i * 7 + run.steps * 13 + rank * 31) % 256);
      y[i] = static_cast<int32_t>((x[i] * 5 + 3) % 256);
    }
    run.engine->BeginStep();
    run.engine->BeginMicroBatch(0, 1);
    run.model->Forward(*run.engine, x.data(), y.data(), kB, kT, 1.0f);
    run.model->Backward(*run.engine);
    run.engine->Step(1e-2f, 1.0f);
  }
}

// master | m | v in layout order, identical on every rank of the run (bitwise OR of each
// rank's owned pieces into zeros: exact for every bit pattern, -0.0 included; at stage 0
// every rank ORs the same whole units).
inline std::vector<uint32_t> FullState(Run& run) {
  const ParamLayout& L = *run.layout;
  const size_t n = L.total_numel();
  std::vector<uint32_t> out(3 * n, 0);
  for (int u = 0; u < L.num_units(); u++)
    for (const Engine::OwnedState& st : run.engine->OwnedPieces(u)) {
      const float* src[3] = {st.master, st.m, st.v};
      for (int k = 0; k < 3; k++)
        std::memcpy(&out[k * n + L.units()[u].offset + st.begin], src[k], (st.end - st.begin) * 4);
    }
  MPI_Allreduce(MPI_IN_PLACE, out.data(), static_cast<int>(out.size()), MPI_UINT32_T, MPI_BOR, run.mpi);
  return out;
}

// The train state saved with the run's checkpoints (the loader position is not derived from
// the step, so a load that recomputed it would show).
inline TrainState StateOf(const Run& run) {
  TrainState s;
  s.step = run.steps;
  s.tokens = run.steps * kB * kT * run.comm->world_size();
  s.loader_position = static_cast<uint64_t>(run.steps) * kB * run.comm->world_size() + 5;
  s.seed = 1234;
  return s;
}

}  // namespace ckpt_harness
}  // namespace shardgpt

#endif  // SHARDGPT_TESTS_MPI_CHECKPOINT_HARNESS_H_
