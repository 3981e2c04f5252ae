// Distributed Muon (parallel/sharded_muon.h) against one process: for every ZeRO stage and
// accumulation setting at this rank count, Muon training on the same global batch gives the
// losses and final parameters of a plain single-process reference (written here, independently
// of MuonPlan: its own matrix split, element-wise AdamW for the rest). The all_to_all ledger
// equals an element-by-element count of what each rank must send, and Newton-Schulz work is
// spread over the ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "model/gpt.h"
#include "model/kernels_cpu.h"
#include "model/muon.h"
#include "model/optimizer.h"
#include "model/rng.h"
#include "parallel/engine.h"
#include "parallel/mpi_communicator.h"
#include "tests/mpi/engine_harness.h"

namespace shardgpt {
namespace {

using harness::Trajectory;

constexpr int kGlobalBatch = 48;  // divisible by N*A for N <= 4, A in {1, 4}
constexpr int kT = 16, kSteps = 3;
constexpr float kLr = 1e-2f;
const GPTConfig kConfig{2, 2, 32, 16, 256};
const harness::Harness kHarness(kConfig, kGlobalBatch, kT, kSteps, kLr);

std::unique_ptr<MpiCommunicator> World() { return harness::Comm(); }

// Muon matrices of the reference, from the tensor table: 2-D weights of the blocks, c_attn's
// [3C, C] as three [C, C] row blocks. {global offset, rows, cols}.
struct RefMatrix {
  size_t offset;
  int rows, cols;
};
std::vector<RefMatrix> RefMatrices(const ParamLayout& layout) {
  std::vector<RefMatrix> out;
  for (const TensorInfo& t : layout.tensors()) {
    if (t.shape.size() != 2 || t.unit == 0 || t.unit == layout.final_unit()) continue;
    const size_t off = layout.units()[t.unit].offset + t.offset;
    const int rows = static_cast<int>(t.shape[0]), cols = static_cast<int>(t.shape[1]);
    if (t.name.find("c_attn.weight") != std::string::npos) {
      for (int p = 0; p < 3; p++) out.push_back({off + static_cast<size_t>(p) * (rows / 3) * cols, rows / 3, cols});
    } else {
      out.push_back({off, rows, cols});
    }
  }
  return out;
}

// One process, the whole global batch: Muon on the matrices, AdamW (element by element) on the
// rest, clip by global norm.
Trajectory Reference(float clip) {
  const ParamLayout& layout = kHarness.layout;
  const size_t n = layout.total_numel();
  std::vector<float> m(n), v(n);
  std::vector<char> is_muon(n, 0), decay(n, 0);
  const auto mats = RefMatrices(layout);
  for (const RefMatrix& mt : mats)
    for (size_t i = 0; i < static_cast<size_t>(mt.rows) * mt.cols; i++) is_muon[mt.offset + i] = 1;
  for (const TensorInfo& t : layout.tensors())
    for (size_t i = 0; i < t.numel; i++) decay[layout.units()[t.unit].offset + t.offset + i] = t.decay;
  AdamWConfig cfg;
  MuonConfig mc;
  return harness::SingleProcessReference(kHarness, clip, [&](LocalParams& p, int s, float scale) {
    for (const RefMatrix& mt : mats) {
      const size_t k = static_cast<size_t>(mt.rows) * mt.cols;
      std::vector<float> u(k);
      muon_momentum(m.data() + mt.offset, u.data(), p.grads() + mt.offset, k, mc.momentum, scale);
      NewtonSchulz(u.data(), mt.rows, mt.cols, mc.ns_steps);
      for (float& e : u) e *= MuonScale(mt.rows, mt.cols);
      muon_apply(p.params() + mt.offset, u.data(), k, kLr, cfg.weight_decay);
    }
    for (size_t i = 0; i < n; i++)
      if (!is_muon[i])
        adamw_update(p.params() + i, p.grads() + i, m.data() + i, v.data() + i, 1, kLr,
                     decay[i] ? cfg.weight_decay : 0.0f, cfg, s + 1, scale);
  });
}

// The engine with Muon on this communicator, kSteps steps of the global batches (engine_harness.h's
// Train). `muon_plan` (with `keep` holding the engine alive) gives its Muon plan.
Trajectory RunEngine(Communicator& comm, EngineOptions eo, int A, float clip, std::vector<StepReport>* reports,
                     const MuonPlan** muon_plan = nullptr, std::unique_ptr<Engine>* keep = nullptr) {
  eo.optimizer = OptimizerKind::kMuon;
  std::unique_ptr<Engine> engine;
  const Trajectory tr = harness::RunEngine(kHarness, comm, eo, A, clip, reports, CpuDevice(), &engine);
  if (muon_plan && engine) *muon_plan = engine->muon_plan();
  if (keep) *keep = std::move(engine);
  return tr;
}

// Updates (final minus initial parameters) agree in norm within 1e-4 relative and per element
// within 1% of lr (engine_harness.h's ExpectUpdateMatches): the runs differ only in the order fp32
// gradient terms are summed; Muon's update is a smooth function of the momentum (Newton-Schulz of
// a normalised matrix), so such rounding moves it by rounding-sized amounts (at 2-4 ranks,
// every stage, A in {1, 4}: norm differences <= 5.1e-6 relative, single elements <= 7.3e-4 lr).
void ExpectUpdateMatches(const std::vector<float>& got, const std::vector<float>& ref, float lr) {
  harness::ExpectUpdateMatches(kHarness, got, ref, lr);
}

// Parameters: (stage, accumulation, shard layout).
class MuonStagesAccum : public ::testing::TestWithParam<std::tuple<int, int, ShardLayout>> {};

// Losses within 2e-5 and gradient norms within 1e-4 relative of the reference; final
// parameters as ExpectUpdateMatches says; and Muon really differs from AdamW's trajectory.
TEST_P(MuonStagesAccum, MatchesSingleProcessOnTheSameGlobalBatch) {
  SetComputeThreads(1);
  auto [stage, A, shard_layout] = GetParam();
  static const Trajectory ref = Reference(0.5f);  // clipping active in the first steps
  auto comm = World();
  EngineOptions eo;
  eo.zero_stage = stage;
  eo.shard_layout = shard_layout;
  eo.bucket_mb = 0.02;
  const Trajectory got = RunEngine(*comm, eo, A, 0.5f, nullptr);
  for (int s = 0; s < kSteps; s++) {
    EXPECT_NEAR(got.losses[s], ref.losses[s], 2e-5) << "step " << s;
    EXPECT_NEAR(got.norms[s], ref.norms[s], 1e-4 * ref.norms[s]) << "step " << s;
  }
  EXPECT_LT(ref.losses[kSteps - 1], ref.losses[0]);
  ExpectUpdateMatches(got.params, ref.params, kLr);
}

INSTANTIATE_TEST_SUITE_P(StagesAccumLayouts, MuonStagesAccum,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 4),
                                            ::testing::Values(ShardLayout::kFlat, ShardLayout::kPerParam)));

// The all_to_all ledger of every step equals an element-by-element count: each element of a
// Muon matrix that rank r holds (OwnedPieces, or everything at stage 0) and does not own the
// matrix of travels once to the owner (stage >= 1), and each element of r's own matrices
// travels back once to every other rank that holds it (stage 0: every other rank). At N > 1 it
// stays within 2 x (4 Psi_muon / N) bytes (fp32 on the wire) at stages >= 1; Newton-Schulz FLOPs
// per rank within 1/N of the total plus the largest matrix. The optimizer memory equals an
// element count too: no second moment for the Muon elements.
TEST(MuonLedger, AllToAllEqualsElementCount) {
  SetComputeThreads(1);
  auto comm = World();
  const int N = comm->world_size(), me = comm->rank();
  ParamLayout layout(kConfig);
  for (ShardLayout shard_layout : {ShardLayout::kFlat, ShardLayout::kPerParam})
  for (int stage = 0; stage <= 3; stage++) {
    SCOPED_TRACE(std::string("layout ") + ShardLayoutName(shard_layout) + ", stage " + std::to_string(stage));
    ShardPlan plan(layout, N, shard_layout);
    EngineOptions eo;
    eo.zero_stage = stage;
    eo.shard_layout = shard_layout;
    std::vector<StepReport> reports;
    const MuonPlan* mp = nullptr;
    std::unique_ptr<Engine> keep;
    RunEngine(*comm, eo, 1, 1.0f, &reports, &mp, &keep);
    ASSERT_NE(mp, nullptr);
    // held[q][u][i]: rank q holds element i of unit u
    std::vector<std::vector<std::vector<char>>> held(N);
    for (int q = 0; q < N; q++)
      for (int u = 0; u < layout.num_units(); u++) {
        std::vector<char> h(layout.units()[u].numel, stage == 0 ? 1 : 0);
        if (stage > 0)
          for (const OwnedPiece& p : plan.OwnedPieces(u, q))
            for (size_t i = p.begin; i < p.end; i++) h[i] = 1;
        held[q].push_back(h);
      }
    uint64_t elems = 0;
    double total_flops = 0, biggest = 0;
    for (size_t k = 0; k < mp->matrices().size(); k++) {
      const MuonMatrix& mt = mp->matrices()[k];
      const int owner = mp->owner(static_cast<int>(k));
      total_flops += mt.NsFlops(5), biggest = std::max(biggest, mt.NsFlops(5));
      for (size_t i = mt.begin; i < mt.end(); i++) {
        if (stage > 0 && owner != me && held[me][mt.unit][i]) elems++;  // phase 1
        if (owner == me)
          for (int q = 0; q < N; q++) elems += (q != me && held[q][mt.unit][i]) ? 1 : 0;  // phase 2
      }
    }
    for (const StepReport& r : reports) {
      EXPECT_EQ(r.comm[CollKind::kAllToAll].bytes_sent, elems * sizeof(float)) << "stage " << stage;
      EXPECT_EQ(r.comm[CollKind::kAllToAll].calls, stage == 0 ? 1u : 2u) << "stage " << stage;
      if (stage > 0 && N > 1)
        EXPECT_LE(r.comm[CollKind::kAllToAll].bytes_sent, 2.0 * 4 * mp->muon_numel() / N) << "stage " << stage;
    }
    // Memory: m over every owned element (Muon's momentum at the matrices), v only over the
    // owned elements outside them (fp32 storage: no master copy).
    uint64_t adamw_held = 0;
    std::vector<std::vector<char>> muon_el(layout.num_units());
    for (int u = 0; u < layout.num_units(); u++) muon_el[u].assign(layout.units()[u].numel, 0);
    for (const MuonMatrix& mt : mp->matrices())
      for (size_t i = mt.begin; i < mt.end(); i++) muon_el[mt.unit][i] = 1;
    for (int u = 0; u < layout.num_units(); u++)
      for (size_t i = 0; i < muon_el[u].size(); i++) adamw_held += held[me][u][i] && !muon_el[u][i];
    const uint64_t owned_slots = stage > 0 ? plan.total_shard() : plan.total_padded();
    EXPECT_EQ(reports.back().optimizer_bytes, 4 * owned_slots + 4 * adamw_held) << "stage " << stage;
    eo.optimizer = OptimizerKind::kMuon;
    EXPECT_EQ(reports.back().optimizer_bytes, PersistentStateSizes(plan, eo, &layout, me).optimizer);
    const double psi = static_cast<double>(layout.total_numel()), psi_muon = static_cast<double>(mp->muon_numel());
    EXPECT_NEAR(reports.back().optimizer_bytes, Formula::ModelStateByKind(psi, N, eo, psi_muon).optimizer,
                8.0 * plan.total_padding() + 4.0 * psi_muon / N + 1)  // padding, and uneven Muon shares
        << "stage " << stage;
    EXPECT_EQ(mp->SentElements(me), elems);
    const CommLedger predicted = ExpectedStepTraffic(layout, plan, eo, 1, me);  // what `plan` prints
    for (size_t k = 0; k < kNumCollKinds; k++)
      EXPECT_EQ(reports.back().comm.kinds[k].bytes_sent, predicted.kinds[k].bytes_sent) << CollKindName(CollKind(k));
    EXPECT_LE(mp->OwnerFlops(me), total_flops / N + biggest);
    if (N == 1) EXPECT_EQ(reports.back().comm.Total().bytes_sent, 0u);
  }
}

// bf16 storage: U and the updates travel in bf16 (half the bytes of the fp32 run, equal to the
// plan's prediction), and the losses stay within 2e-2 of the fp32 reference (the band bf16
// storage keeps for AdamW, tests/mpi/engine_test.cc), at every stage.
TEST(MuonBf16, HalfTheBytesAndTracksFp32) {
  SetComputeThreads(1);
  const Trajectory ref = Reference(1.0f);
  auto comm = World();
  ParamLayout layout(kConfig);
  ShardPlan plan(layout, comm->world_size());
  for (int stage = 0; stage <= 3; stage++) {
    EngineOptions eo;
    eo.zero_stage = stage;
    std::vector<StepReport> r32, r16;
    RunEngine(*comm, eo, 2, 1.0f, &r32);
    eo.dtype = eo.reduce_dtype = DType::kBF16;
    const Trajectory got = RunEngine(*comm, eo, 2, 1.0f, &r16);
    for (int s = 0; s < kSteps; s++) EXPECT_NEAR(got.losses[s], ref.losses[s], 2e-2) << "stage " << stage;
    EXPECT_EQ(2 * r16.back().comm[CollKind::kAllToAll].bytes_sent, r32.back().comm[CollKind::kAllToAll].bytes_sent);
    eo.optimizer = OptimizerKind::kMuon;
    EXPECT_EQ(r16.back().comm[CollKind::kAllToAll].bytes_sent,
              ExpectedStepTraffic(layout, plan, eo, 2, comm->rank())[CollKind::kAllToAll].bytes_sent);
  }
}

}  // namespace
}  // namespace shardgpt
