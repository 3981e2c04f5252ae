// The harness the multi-rank engine tests share (engine_test.cc, muon_test.cc, hsdp_test.cc;
// the training loop and the node-local rank also recompute_test.cc and tests/gpu/'s multi-rank
// tests): a deterministic global batch per step, one process training on the whole of it (the
// reference), the engine training on its ranks' slices of the same batch, and the comparison of
// the two updates. What differs between the files (model, batch, sequence length, steps,
// learning rate) travels in a Harness; each file keeps its own optimizer reference where it has
// one (Muon) and its own checks.
#ifndef SHARDGPT_TESTS_MPI_ENGINE_HARNESS_H_
#define SHARDGPT_TESTS_MPI_ENGINE_HARNESS_H_

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model/device_factory.h"
#include "model/gpt.h"
#include "model/optimizer.h"
#include "model/rng.h"
#include "parallel/engine.h"
#include "parallel/mpi_communicator.h"

namespace shardgpt {
namespace harness {

// What a test file trains: the model, the global batch of a step (sequences), the sequence
// length, the number of steps and the learning rate of every run. It holds the model's layout
// too, which the engines made here refer to: keep the Harness alive as long as they are.
struct Harness {
  Harness(const GPTConfig& c, int global_batch_, int T_, int steps_, float lr_)
      : config(c), global_batch(global_batch_), T(T_), steps(steps_), lr(lr_), layout(c) {}
  GPTConfig config;
  int global_batch;
  int T;
  int steps;
  float lr;
  ParamLayout layout;
};

struct Trajectory {
  std::vector<float> losses, norms, params;
};

inline std::unique_ptr<MpiCommunicator> Comm(MPI_Comm c = MPI_COMM_WORLD) {
  auto made = MpiCommunicator::Create(c);
  EXPECT_TRUE(made.ok()) << made.status().message();
  return std::move(made.value());
}

// This rank's index among the ranks of its node and how many there are (MPI's shared-memory
// split, as the app binds GPUs). Collective over MPI_COMM_WORLD.
inline void NodeLocalRank(int* local_rank, int* local_size) {
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, local_rank);
  MPI_Comm_size(local, local_size);
  MPI_Comm_free(&local);
}

// This rank's GPU as the app picks it (CreateDevice by node-local rank). Collective.
inline StatusOr<std::unique_ptr<Device>> NodeLocalGpu() {
  int lr = 0, ls = 1;
  NodeLocalRank(&lr, &ls);
  return CreateDevice("cuda", lr, ls);
}

// `sequences` sequences of T tokens: inputs from Rng(seed) modulo vocab, targets 7x + 3 modulo
// vocab (a rule the model learns, so the loss visibly falls).
inline void SyntheticBatch(uint64_t seed, int sequences, int T, int vocab, std::vector<int32_t>* x,
                           std::vector<int32_t>* y) {
  Rng rng(seed);
  x->resize(static_cast<size_t>(sequences) * T), y->resize(static_cast<size_t>(sequences) * T);
  for (size_t i = 0; i < x->size(); i++) {
    (*x)[i] = static_cast<int32_t>(rng.Next() % static_cast<uint64_t>(vocab));
    (*y)[i] = ((*x)[i] * 7 + 3) % vocab;
  }
}

// Global batch of step s: h.global_batch sequences of h.T inputs and targets (a narrow
// vocabulary of 64).
inline void GlobalBatch(const Harness& h, int step, std::vector<int32_t>* x, std::vector<int32_t>* y) {
  SyntheticBatch(100 + step, h.global_batch, h.T, 64, x, y);
}

// The initial parameters of every run here (seed 1).
inline std::vector<float> InitialParams(const Harness& h) {
  std::vector<float> init(h.layout.total_numel());
  InitParameters(h.layout, 1, init.data());
  return init;
}

// One optimizer step of the reference on the flat buffers: step s (0-based), clip factor scale.
using ReferenceUpdate = std::function<void(LocalParams& p, int step, float scale)>;

// One process, the whole global batch: forward and backward, global gradient norm, clip
// factor, then `update`.
inline Trajectory SingleProcessReference(const Harness& h, float clip, const ReferenceUpdate& update) {
  const ParamLayout& layout = h.layout;
  LocalParams p(layout);
  InitParameters(layout, 1, p.params());
  const size_t n = layout.total_numel();
  GPT model(h.config, h.global_batch, h.T);
  Trajectory tr;
  std::vector<int32_t> x, y;
  for (int s = 0; s < h.steps; s++) {
    GlobalBatch(h, s, &x, &y);
    p.ZeroGrads();
    tr.losses.push_back(model.Forward(p, x.data(), y.data(), h.global_batch, h.T, 1.0f));
    model.Backward(p);
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += double(p.grads()[i]) * p.grads()[i];
    const float norm = std::sqrt(ss), scale = norm > clip ? clip / (norm + 1e-6f) : 1.0f;
    tr.norms.push_back(norm);
    update(p, s, scale);
  }
  tr.params.assign(p.params(), p.params() + n);
  return tr;
}

// The plain AdamW reference: AdamW over the flat buffer (weight decay on the decay ranges),
// clip by global norm.
inline Trajectory AdamWReference(const Harness& h, float clip) {
  const ParamLayout& layout = h.layout;
  const size_t n = layout.total_numel();
  std::vector<float> m(n), v(n);
  AdamWConfig cfg;
  return SingleProcessReference(h, clip, [&](LocalParams& p, int s, float scale) {
    for (const UnitInfo& u : layout.units())
      for (const DecayRange& r : layout.DecayRanges(&u - layout.units().data(), 0, u.numel)) {
        const size_t o = u.offset + r.begin;
        adamw_update(p.params() + o, p.grads() + o, m.data() + o, v.data() + o, r.end - r.begin, h.lr,
                     r.decay ? cfg.weight_decay : 0.0f, cfg, s + 1, scale);
      }
  });
}

// An engine on `comm` with options `eo`, loaded with the initial parameters; null (and a
// failed expectation) when the options are refused.
inline std::unique_ptr<Engine> NewEngine(const Harness& h, Communicator& comm, const EngineOptions& eo,
                                         Device& device = CpuDevice()) {
  auto e = Engine::Create(h.layout, &comm, eo, device);
  EXPECT_TRUE(e.ok()) << e.status().message();
  if (!e.ok()) return nullptr;
  const std::vector<float> init = InitialParams(h);
  e.value()->LoadFullParams(init.data());
  return std::move(e.value());
}

// The global batch of step s (its size: N x A x B sequences of T).
using BatchFn = std::function<void(int step, std::vector<int32_t>* x, std::vector<int32_t>* y)>;

// Steps [first, last) of `batch` on `engine` and `model` (made for B = sequences / (N * A) of
// length T), A micro-batches each, learning rate lr, clip norm clip: rank r, micro-batch m takes
// sequences [(m*N + r)*B, +B) of the global batch, as the DataLoader orders them. Losses
// (averaged over the ranks) and gradient norms appended to *tr, step reports to *reports (when
// given).
inline void TrainSteps(Engine& engine, GPT& model, Communicator& comm, int A, int T, float lr, float clip,
                       const BatchFn& batch, int first, int last, Trajectory* tr, std::vector<StepReport>* reports) {
  const int N = comm.world_size();
  std::vector<int32_t> x, y;
  for (int s = first; s < last; s++) {
    batch(s, &x, &y);
    const int B = static_cast<int>(x.size() / T) / (N * A);
    engine.BeginStep();
    double loss = 0;
    for (int m = 0; m < A; m++) {
      const size_t at = static_cast<size_t>(m * N + comm.rank()) * B * T;
      engine.BeginMicroBatch(m, A);
      loss += model.Forward(engine, x.data() + at, y.data() + at, B, T, 1.0f / A);
      model.Backward(engine);
    }
    tr->norms.push_back(engine.Step(lr, clip));
    tr->losses.push_back(static_cast<float>(comm.AllReduceScalar(loss / A, ReduceOp::kAvg)));
    if (reports) reports->push_back(engine.last_report());
  }
}

// Steps [first, last) of the harness's global batches on `engine` (TrainSteps, a new model).
inline void Train(const Harness& h, Engine& engine, Communicator& comm, int A, float clip, int first, int last,
                  Trajectory* tr, std::vector<StepReport>* reports, Device& device = CpuDevice()) {
  GPT model(h.config, h.global_batch / (comm.world_size() * A), h.T, device);
  TrainSteps(engine, model, comm, A, h.T, h.lr, clip,
             [&h](int s, std::vector<int32_t>* x, std::vector<int32_t>* y) { GlobalBatch(h, s, x, y); }, first, last,
             tr, reports);
}

// The engine's full parameters (gathered) into tr->params.
inline void GatherParams(const Harness& h, Engine& engine, Trajectory* tr) {
  tr->params.resize(h.layout.total_numel());
  engine.GatherFullParams(tr->params.data());
}

// A whole run: a new engine, h.steps steps from the start, its final parameters. `engine_out`
// (when given) keeps the engine alive for the caller.
inline Trajectory RunEngine(const Harness& h, Communicator& comm, const EngineOptions& eo, int A, float clip,
                            std::vector<StepReport>* reports, Device& device = CpuDevice(),
                            std::unique_ptr<Engine>* engine_out = nullptr) {
  std::unique_ptr<Engine> engine = NewEngine(h, comm, eo, device);
  Trajectory tr;
  if (!engine) return tr;
  Train(h, *engine, comm, A, clip, 0, h.steps, &tr, reports, device);
  GatherParams(h, *engine, &tr);
  if (engine_out) *engine_out = std::move(engine);
  return tr;
}

// The engine's parameters against the reference's, compared as UPDATES (final minus initial
// parameters), with bounds that follow from how they may differ and hold for any compiler
// and optimisation level:
//  - both runs add the same fp32 gradient terms in different orders (ranks, micro-batches,
//    buckets, and vectorisation, FMA contraction and -O level inside the kernels), so their
//    gradients differ by rounding;
//  - AdamW divides each element's first moment by the root of its second, so each element's
//    step is of size ~lr whatever its gradient's magnitude; rounding in the gradient moves the
//    step by the gradient's own relative rounding error, which is large only for elements whose
//    gradient is itself near rounding noise. An absolute bound on the parameters then depends
//    on how many such elements a build happens to produce (an ASan build at 3 ranks, A = 4,
//    reaches 2.2e-5 where -O3 stays under 2e-5).
// So: (1) the whole update agrees in norm, |d_engine - d_ref| <= 1e-4 |d_ref| (at most
// 8.6e-6 with gcc -O3 -march=native and clang -O1 ASan, 1-4 ranks, every stage, A in {1, 4});
// a wrong shard, a missing reduction or a wrong clip factor changes it by O(1); (2) no single
// element's update differs by more than 1% of one step's size lr (at most 1.4e-5 = 0.14% of
// lr).
// (These figures are engine_test.cc's, AdamW at 1-4 ranks; hsdp_test.cc uses the same bounds
// for AdamW with groups, muon_test.cc for Muon and gives its own figures.)
inline void ExpectUpdateMatches(const Harness& h, const std::vector<float>& got, const std::vector<float>& ref,
                                float lr) {
  const std::vector<float> init = InitialParams(h);
  ASSERT_EQ(got.size(), init.size());
  ASSERT_EQ(ref.size(), init.size());
  double diff2 = 0, ref2 = 0, worst = 0;
  for (size_t i = 0; i < init.size(); i++) {
    const double d_ref = double(ref[i]) - init[i], d_got = double(got[i]) - init[i];
    diff2 += (d_got - d_ref) * (d_got - d_ref);
    ref2 += d_ref * d_ref;
    worst = std::max(worst, std::fabs(d_got - d_ref));
  }
  EXPECT_GT(ref2, 0.0);
  EXPECT_LE(std::sqrt(diff2), 1e-4 * std::sqrt(ref2)) << "update differs in norm";
  EXPECT_LE(worst, 1e-2 * lr) << "an element's update differs by more than 1% of lr";
}

}  // namespace harness
}  // namespace shardgpt

#endif  // SHARDGPT_TESTS_MPI_ENGINE_HARNESS_H_
