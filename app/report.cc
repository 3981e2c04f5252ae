#include "app/report.h"

#include <cstdio>

namespace shardgpt {

namespace {
double MiB(double b) { return b / (1024.0 * 1024.0); }
// Elements of the Muon matrices (0 under AdamW).
double PsiMuon(const Engine& engine) {
  return engine.muon_plan() ? static_cast<double>(engine.muon_plan()->muon_numel()) : 0.0;
}

}  // namespace

void PrintStartupReport(Engine& engine, const ParamLayout& layout, int A, const std::vector<uint64_t>& per_rank) {
  const EngineOptions& o = engine.options();
  const int N = engine.plan().world_size();
  const double psi = static_cast<double>(layout.total_numel());
  const double psi_muon = PsiMuon(engine);
  const StateSizes f = Formula::ModelStateByKind(psi, N, o, psi_muon);
  MemoryLedger& m = engine.memory();
  if (psi_muon > 0)
    std::printf("optimizer: Muon for %zu matrices (%.0f elements, %.1f%% of Psi; momentum only: k-4 bytes each), "
                "AdamW for the rest\n",
                engine.muon_plan()->matrices().size(), psi_muon, 100.0 * psi_muon / psi);
  std::printf("model state per rank (measured allocations | seed formula, Psi=%.0f, %s=%d, stage %d, %s):\n", psi,
              engine.num_groups() > 1 ? "G" : "N", N, o.zero_stage, DTypeName(o.dtype));
  std::printf("  params     %10.3f MiB | %10.3f MiB\n", MiB(m.current(MemKind::kParams)), MiB(f.params));
  std::printf("  grads      %10.3f MiB | %10.3f MiB\n", MiB(m.current(MemKind::kGrads)), MiB(f.grads));
  std::printf("  optimizer  %10.3f MiB | %10.3f MiB\n", MiB(m.current(MemKind::kOptimizer)), MiB(f.optimizer));
  std::printf("  total      %10.3f MiB | %10.3f MiB (%s layout padding: %zu elements per full copy)\n",
              MiB(m.StateTotal()), MiB(f.params + f.grads + f.optimizer), ShardLayoutName(o.shard_layout),
              engine.plan().total_padding());
  std::printf("  every rank (measured):");
  for (uint64_t b : per_rank) std::printf(" %.3f", MiB(static_cast<double>(b)));
  std::printf(" MiB\n");
  const int R = engine.num_groups();
  if (R > 1) {
    std::printf("HSDP: %d group(s) of G=%d rank(s), sharded inside a group, replicated across groups; this rank: "
                "group %d, index %d\n", R, N, engine.group_index(), engine.shard_comm().rank());
    std::printf("traffic per rank per step inside the group (seed formula with G, x(G-1)/G): %.3f MiB; across groups "
                "(2 x (%dPsi/G) x (R-1)/R): %.3f MiB\n",
                MiB(Formula::TrafficBytes(psi, N, o, A, psi_muon)), static_cast<int>(DTypeSize(o.reduce_dtype)),
                MiB(Formula::CrossGroupTrafficBytes(psi, N, R, o)));
  } else {
    std::printf("traffic per rank per step (seed formula, ring model, x(N-1)/N): %.3f MiB\n",
                MiB(Formula::TrafficBytes(psi, N, o, A, psi_muon)));
  }
  if (psi_muon > 0)
    std::printf("  of which Muon all-to-all (U to owners, updates back): %.3f MiB\n",
                MiB(Formula::MuonTrafficBytes(psi_muon, N, o)));
  if (o.zero_stage >= 2 && A > 1)
    std::printf("gradient accumulation (A=%d): %s\n", A,
                o.reduce_every_micro
                    ? "reduce-scatter every micro-batch: gradient memory stays sharded, gradient traffic x A "
                      "(--reduce-grads last-micro: traffic x1, full-gradient memory)"
                    : "accumulate full local gradients, reduce-scatter once: traffic x1, full-gradient memory "
                      "(--reduce-grads every-micro keeps memory sharded, traffic x A)");
}

nlohmann::json StepJson(const StepReport& r, const Engine& engine, const ParamLayout& layout, int A) {
  const EngineOptions& o = engine.options();
  const int N = engine.plan().world_size();
  const double psi = static_cast<double>(layout.total_numel());
  nlohmann::json comm;
  for (size_t k = 0; k < kNumCollKinds; k++)
    comm[CollKindName(static_cast<CollKind>(k))] = r.comm.kinds[k].bytes_sent;
  comm["total"] = r.comm.Total().bytes_sent;
  nlohmann::json j;
  j["comm_bytes"] = comm;  // inside the shard group (every rank without HSDP)
  const double psi_muon = PsiMuon(engine);
  j["comm_bytes_formula"] = Formula::TrafficBytes(psi, N, o, A, psi_muon);
  const int R = engine.num_groups();
  if (R > 1) {  // HSDP: the same, across groups (N = G ranks per group here)
    nlohmann::json across;
    for (size_t k = 0; k < kNumCollKinds; k++)
      across[CollKindName(static_cast<CollKind>(k))] = r.comm_across.kinds[k].bytes_sent;
    across["total"] = r.comm_across.Total().bytes_sent;
    j["shard_group_size"] = N;
    j["groups"] = R;
    j["comm_bytes_across_groups"] = across;
    j["comm_bytes_across_groups_formula"] = Formula::CrossGroupTrafficBytes(psi, N, R, o);
  }
  j["model_state_bytes"] = r.model_state_bytes;
  j["model_state_bytes_by_kind"] = {{"params", r.params_bytes}, {"grads", r.grads_bytes}, {"optimizer", r.optimizer_bytes}};
  j["model_state_bytes_formula"] = Formula::ModelStateBytes(psi, N, o, psi_muon);
  if (psi_muon > 0) j["muon_ns_ms"] = r.muon_ns_s * 1e3;
  j["shard_layout"] = ShardLayoutName(o.shard_layout);
  j["padding_elements"] = engine.plan().total_padding();  // per full copy of the model
  j["peak_grads_bytes"] = r.peak_grads_bytes;
  j["peak_params_bytes"] = r.peak_params_bytes;
  j["activation_bytes"] = r.activation_bytes;
  j["peak_bytes"] = r.peak_bytes;  // every tracked allocation at this step's peak: what `plan` predicts
  // time the training thread waited for communication: all, then by phase
  j["exposed_comm_ms"] = r.exposed_comm_s * 1e3;
  j["exposed_forward_ms"] = r.forward_wait_s * 1e3;
  j["exposed_backward_ms"] = r.backward_wait_s * 1e3;
  j["exposed_after_backward_ms"] = r.after_backward_wait_s * 1e3;
  // the communication thread inside collectives, waiting for the slower rank included
  j["comm_busy_ms"] = r.comm_busy_s * 1e3;
  return j;
}

std::vector<uint64_t> GatherPerRank(Communicator& comm, uint64_t value) { return AllGatherU64(comm, {value}); }

}  // namespace shardgpt
