// The size and traffic arithmetic of DDP / ZeRO, in one place: what each stage allocates and
// sends, by the seed's formulas (for printing beside measurements) and exactly from the
// sharding plan (what the engine must allocate and send). Used by the engine, `plan`, the
// start-up report, the JSONL ledgers and the tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "model/muon.h"
#include "model/optimizer.h"
#include "model/param_layout.h"
#include "parallel/communicator.h"
#include "parallel/engine_options.h"
#include "parallel/shard_plan.h"

namespace shardgpt {

// Bytes of model state one rank holds, by kind.
struct StateSizes {
  double params = 0, grads = 0, optimizer = 0;
  double total() const { return params + grads + optimizer; }
};

// The seed's formulas (with this engine's element sizes: p = g = 2 or 4 bytes, k = 12 or 8).
struct Formula {
  // Model state per rank: DDP 2Ψ+2Ψ+kΨ; ZeRO-1 2Ψ+2Ψ+kΨ/N; ZeRO-2 2Ψ+(2Ψ+kΨ)/N; ZeRO-3 (2Ψ+2Ψ+kΨ)/N
  // (stage 2/3 with last-micro reduction keep a full gradient).
  // Muon (psi_muon = elements of the Muon matrices, ignored for AdamW): those elements need
  // no second moment, so k drops by 4 for them (12 -> 8 with bf16, 8 -> 4 with fp32).
  static StateSizes ModelStateByKind(double psi, int world, const EngineOptions& o, double psi_muon = 0);
  static double ModelStateBytes(double psi, int world, const EngineOptions& o, double psi_muon = 0) {
    return ModelStateByKind(psi, world, o, psi_muon).total();
  }
  // Bytes sent per rank per step (ring model, (N-1)/N included), A micro-batches. With HSDP
  // `world` is the shard group size G and this is the traffic inside the group.
  static double TrafficBytes(double psi, int world, const EngineOptions& o, int accum);
  // HSDP: bytes sent per rank per step ACROSS groups: the all-reduce of the owned gradient
  // shard (Psi/G elements, reduce dtype r bytes) among the R = N/G ranks holding the same
  // shard, once per step: 2 * (r*Psi/G) * (R-1)/R (0 when R = 1).
  static double CrossGroupTrafficBytes(double psi, int group, int groups, const EngineOptions& o);
  // The same plus Muon's all-to-all traffic.
  static double TrafficBytes(double psi, int world, const EngineOptions& o, int accum, double psi_muon);
  // Muon's all-to-all bytes per rank per step, e = reduce dtype size: stage >= 1
  // 2*e*Psi_muon/N*(N-1)/N (U to the owners, updates back); stage 0 e*Psi_muon*(N-1)/N (owners
  // send whole updates). An estimate: a rank's shard meets its own matrices more or less often.
  static double MuonTrafficBytes(double psi_muon, int world, const EngineOptions& o);
};

// Exact persistent allocations of one rank (padding included), from the plan. Muon needs the
// layout (its second moments cover only rank `rank`'s owned AdamW elements).
StateSizes PersistentStateSizes(const ShardPlan& plan, const EngineOptions& o, const ParamLayout* layout = nullptr,
                                int rank = 0);
// Second-moment elements rank r allocates: every owned element (padding included) for AdamW;
// under Muon only the owned real elements outside the Muon matrices.
size_t SecondMomentElements(const ParamLayout& layout, const ShardPlan& plan, const EngineOptions& o, int rank);
// Stage 0 buckets: unit ids per bucket, in backward order (final, blocks L..1, embed).
std::vector<std::vector<int>> PlanBuckets(const ShardPlan& plan, const EngineOptions& o);
// Bytes one rank sends in one step of A micro-batches, per collective kind (ring model),
// derived from the plan; control traffic (loss, norm) excluded. Muon's all_to_all traffic
// differs between ranks: it is rank `rank`'s (MuonPlan::SentElements).
CommLedger ExpectedStepTraffic(const ParamLayout& layout, const ShardPlan& plan, const EngineOptions& o, int accum,
                               int rank = 0);
// HSDP: bytes one rank sends across groups in one step (one all-reduce of each unit's owned
// gradient shard among the `groups` replicas of it), from the plan of the group (size G).
CommLedger ExpectedCrossGroupTraffic(const ShardPlan& plan, const EngineOptions& o, int groups);

}  // namespace shardgpt
