#include "parallel/zero_math.h"

#include <algorithm>
#include <string>

#include "parallel/muon_plan.h"

namespace shardgpt {

StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name) {
  if (name == "adamw") return OptimizerKind::kAdamW;
  if (name == "muon") return OptimizerKind::kMuon;
  return Status::InvalidArgument("--optimizer: unknown optimizer '" + name + "' (expected adamw or muon)");
}

const char* OptimizerName(OptimizerKind k) { return k == OptimizerKind::kMuon ? "muon" : "adamw"; }

Status EngineOptions::Validate() const {
  if (zero_stage < 0 || zero_stage > 3)
    return Status::InvalidArgument("--zero-stage must be 0, 1, 2 or 3, got " + std::to_string(zero_stage));
  if (dtype == DType::kF32 && reduce_dtype == DType::kBF16)
    return Status::InvalidArgument("--reduce-dtype bf16 needs --dtype bf16 (fp32 gradients are reduced in fp32)");
  if (optimizer == OptimizerKind::kMuon && !(muon.momentum >= 0 && muon.momentum < 1))
    return Status::InvalidArgument("--muon-momentum must be in [0, 1), got " + std::to_string(muon.momentum));
  if (optimizer == OptimizerKind::kMuon && (muon.ns_steps < 1 || muon.ns_steps > 100))
    return Status::InvalidArgument("--muon-ns-steps must be in 1..100, got " + std::to_string(muon.ns_steps));
  if (!(bucket_mb > 0)) return Status::InvalidArgument("--bucket-mb must be > 0");
  if (!reduce_every_micro && zero_stage < 2)
    return Status::InvalidArgument(
        "--reduce-grads applies to --zero-stage 2 and 3 only (stages 0 and 1 always sync in the last micro-batch)");
  return Status::OK();
}

StatusOr<int> EngineOptions::ShardGroupSize(int world) const {
  const int G = shard_group_size == 0 ? world : shard_group_size;
  if (G < 1 || world % G != 0)
    return Status::InvalidArgument("--shard-group-size " + std::to_string(G) + " must divide the number of ranks " +
                                   std::to_string(world));
  if (G != world && zero_stage == 0)
    return Status::InvalidArgument("--shard-group-size " + std::to_string(G) +
                                   " needs --zero-stage 1, 2 or 3 (stage 0 shards nothing: every rank replicates)");
  return G;
}

StateSizes Formula::ModelStateByKind(double psi, int world, const EngineOptions& o, double psi_muon) {
  const double p = DTypeSize(o.dtype), k = o.optimizer_bytes_per_param(), N = world;
  StateSizes s;
  s.params = o.shards_params() ? p * psi / N : p * psi;
  s.grads = o.keeps_full_grads() ? p * psi : p * psi / N;
  if (o.optimizer != OptimizerKind::kMuon) psi_muon = 0;
  const double opt = k * psi - 4 * psi_muon;  // Muon elements: no second moment (k - 4)
  s.optimizer = o.shards_optimizer() ? opt / N : opt;
  return s;
}

double Formula::TrafficBytes(double psi, int world, const EngineOptions& o, int accum, double psi_muon) {
  return TrafficBytes(psi, world, o, accum) + MuonTrafficBytes(psi_muon, world, o);
}

double Formula::MuonTrafficBytes(double psi_muon, int world, const EngineOptions& o) {
  if (o.optimizer != OptimizerKind::kMuon) return 0;
  const double f = (world - 1.0) / world;
  // stage 0: owners send whole updates to N-1 ranks; else U to owners and updates back, the
  // (N-1)/N of each rank's 1/N shard that another rank owns (reduce dtype on the wire)
  const double e = DTypeSize(o.reduce_dtype);
  return o.zero_stage == 0 ? e * psi_muon * f : 2 * e * psi_muon / world * f;
}

double Formula::TrafficBytes(double psi, int world, const EngineOptions& o, int accum) {
  const double f = (world - 1.0) / world, p = DTypeSize(o.dtype), r = DTypeSize(o.reduce_dtype);
  const double rs_times = (o.shards_grads() && o.reduce_every_micro) ? accum : 1;
  switch (o.zero_stage) {
    case 0: return 2 * r * psi * f;                          // all-reduce = reduce-scatter + all-gather
    case 1:
    case 2: return rs_times * r * psi * f + p * psi * f;    // reduce-scatter grads, all-gather params
    default: return rs_times * r * psi * f + 2 * accum * p * psi * f;  // + gather in forward and backward
  }
}

double Formula::CrossGroupTrafficBytes(double psi, int group, int groups, const EngineOptions& o) {
  if (groups <= 1) return 0;
  const double r = DTypeSize(o.reduce_dtype), R = groups;
  return 2 * (r * psi / group) * (R - 1) / R;
}

namespace {
// The owned pieces of unit u: OwnedPieces at stage >= 1, the whole unit at stage 0.
std::vector<OwnedPiece> PiecesOf(const ShardPlan& plan, bool sharded, int u, int r) {
  if (sharded) return plan.OwnedPieces(u, r);
  return {OwnedPiece{0, plan.unit(u).numel, 0}};
}
}  // namespace

size_t SecondMomentElements(const ParamLayout& layout, const ShardPlan& plan, const EngineOptions& o, int rank) {
  const bool sharded = o.shards_optimizer();
  if (o.optimizer != OptimizerKind::kMuon) return sharded ? plan.total_shard() : plan.total_padded();
  MuonPlan mp(layout, plan, !sharded, o.muon.ns_steps);
  size_t n = 0;
  for (int u = 0; u < plan.num_units(); u++)
    for (const OwnedPiece& p : PiecesOf(plan, sharded, u, rank)) {
      n += p.end - p.begin;  // minus the piece's Muon elements
      for (const auto& [b, e] : mp.muon_ranges(u))
        if (std::min(e, p.end) > std::max(b, p.begin)) n -= std::min(e, p.end) - std::max(b, p.begin);
    }
  return n;
}

StateSizes PersistentStateSizes(const ShardPlan& plan, const EngineOptions& o, const ParamLayout* layout, int rank) {
  const double Tp = static_cast<double>(plan.total_padded()), Ts = static_cast<double>(plan.total_shard());
  const double elt = static_cast<double>(DTypeSize(o.dtype));
  StateSizes s;
  s.params = (o.shards_params() ? Ts : Tp) * elt;
  s.grads = (o.keeps_full_grads() ? Tp : Ts) * elt;
  s.optimizer = (o.shards_optimizer() ? Ts : Tp) * o.optimizer_bytes_per_param();
  if (o.optimizer == OptimizerKind::kMuon && layout != nullptr)  // v only for the AdamW elements
    s.optimizer -= ((o.shards_optimizer() ? Ts : Tp) - static_cast<double>(SecondMomentElements(*layout, plan, o, rank))) * 4;
  return s;
}

// Consecutive units in backward order until a bucket holds bucket_mb; consecutive units are
// adjacent in the padded buffer, so a bucket is one range. As in PyTorch DDP, the first
// bucket is capped at 1 MiB so that communication starts early.
std::vector<std::vector<int>> PlanBuckets(const ShardPlan& plan, const EngineOptions& o) {
  std::vector<std::vector<int>> buckets;
  const double cap = o.bucket_mb * 1024 * 1024, first_cap = std::min(cap, 1024.0 * 1024);
  double filled = 0;
  for (int u = plan.num_units() - 1; u >= 0; u--) {
    if (buckets.empty() || filled >= (buckets.size() == 1 ? first_cap : cap)) buckets.emplace_back(), filled = 0;
    buckets.back().push_back(u);
    filled += static_cast<double>(plan.unit(u).padded) * DTypeSize(o.reduce_dtype);
  }
  return buckets;
}

CommLedger ExpectedStepTraffic(const ParamLayout& layout, const ShardPlan& plan, const EngineOptions& o, int accum,
                               int rank) {
  CommLedger l;
  const int N = plan.world_size();
  if (o.optimizer == OptimizerKind::kMuon) {
    // one all-to-all-v for the updates, one before it for U at stage >= 1; the counter holds
    // their bytes together (values in the reduce dtype)
    const MuonPlan mp(layout, plan, !o.shards_optimizer(), o.muon.ns_steps);
    l.Add(CollKind::kAllToAll, mp.SentElements(rank) * DTypeSize(o.reduce_dtype));
    if (o.shards_optimizer()) l.Add(CollKind::kAllToAll, 0);
  }
  auto add = [&](CollKind k, uint64_t count, DType d, int times) {
    for (int i = 0; i < times; i++) l.Add(k, CommLedger::RingBytes(k, count, d, N));
  };
  if (o.zero_stage == 0) {
    for (const auto& b : PlanBuckets(plan, o)) {
      uint64_t count = 0;
      for (int u : b) count += plan.unit(u).padded;
      add(CollKind::kAllReduce, count, o.reduce_dtype, 1);
    }
    return l;
  }
  const int rs_times = (o.shards_grads() && o.reduce_every_micro) ? accum : 1;
  for (int u = 0; u < plan.num_units(); u++) {
    const uint64_t shard = plan.unit(u).shard;
    const bool root = u == ParamLayout::kEmbedUnit || u == layout.final_unit();
    if (o.shards_params()) {
      // forward gathers every unit; backward re-gathers the blocks that were resharded
      add(CollKind::kAllGather, shard, o.dtype, accum);
      if (o.reshard_after_forward && !root) add(CollKind::kAllGather, shard, o.dtype, accum);
    }
    add(CollKind::kReduceScatter, shard, o.reduce_dtype, rs_times);
    if (!o.shards_params()) add(CollKind::kAllGather, shard, o.dtype, 1);
  }
  return l;
}

CommLedger ExpectedCrossGroupTraffic(const ShardPlan& plan, const EngineOptions& o, int groups) {
  CommLedger l;
  if (groups <= 1) return l;
  for (int u = 0; u < plan.num_units(); u++)
    l.Add(CollKind::kAllReduce, CommLedger::RingBytes(CollKind::kAllReduce, plan.unit(u).shard, o.reduce_dtype, groups));
  return l;
}

}  // namespace shardgpt
