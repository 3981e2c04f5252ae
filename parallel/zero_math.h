// The size and traffic arithmetic of DDP / ZeRO, in one place: what each stage allocates and
// sends, by the seed's formulas (for printing beside measurements) and exactly from the
// sharding plan (what the engine must allocate and send). Used by the engine, `plan`, the
// start-up report, the JSONL ledgers and the tests.
#pragma once

#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "model/optimizer.h"
#include "model/param_layout.h"
#include "parallel/communicator.h"
#include "parallel/shard_plan.h"

namespace shardgpt {

struct EngineOptions {
  int zero_stage = 0;                 // 0 (DDP), 1, 2, 3
  DType dtype = DType::kF32;          // storage of parameters and gradients; compute is fp32
  DType reduce_dtype = DType::kF32;   // dtype gradients travel in (default: dtype)
  double bucket_mb = 25.0;            // stage 0 bucket size (DDP's default)
  bool reshard_after_forward = true;  // stage 3: free block parameters after forward
  bool reduce_every_micro = true;     // stages 2/3: reduce-scatter every micro-batch
  ShardLayout shard_layout = ShardLayout::kFlat;  // flat unit shards (FSDP1) or per-parameter dim-0 (FSDP2)
  AdamWConfig adamw;

  bool shards_optimizer() const { return zero_stage >= 1; }
  bool shards_grads() const { return zero_stage >= 2; }
  bool shards_params() const { return zero_stage >= 3; }
  // Whether a full (unsharded) gradient buffer persists: stages 0/1, and 2/3 with last-micro.
  bool keeps_full_grads() const { return !shards_grads() || !reduce_every_micro; }
  // Bytes of optimizer state per parameter: fp32 m, v (+ fp32 master weights for bf16).
  int optimizer_bytes_per_param() const { return dtype == DType::kBF16 ? 12 : 8; }

  // One line naming the first impossible setting, or OK.
  Status Validate() const;
};

// Bytes of model state one rank holds, by kind.
struct StateSizes {
  double params = 0, grads = 0, optimizer = 0;
  double total() const { return params + grads + optimizer; }
};

// The seed's formulas (with this engine's element sizes: p = g = 2 or 4 bytes, k = 12 or 8).
struct Formula {
  // Model state per rank: DDP 2Ψ+2Ψ+kΨ; ZeRO-1 2Ψ+2Ψ+kΨ/N; ZeRO-2 2Ψ+(2Ψ+kΨ)/N; ZeRO-3 (2Ψ+2Ψ+kΨ)/N
  // (stage 2/3 with last-micro reduction keep a full gradient).
  static StateSizes ModelStateByKind(double psi, int world, const EngineOptions& o);
  static double ModelStateBytes(double psi, int world, const EngineOptions& o) {
    return ModelStateByKind(psi, world, o).total();
  }
  // Bytes sent per rank per step (ring model, (N-1)/N included), A micro-batches.
  static double TrafficBytes(double psi, int world, const EngineOptions& o, int accum);
};

// Exact persistent allocations of one rank (padding included), from the plan.
StateSizes PersistentStateSizes(const ShardPlan& plan, const EngineOptions& o);
// Stage 0 buckets: unit ids per bucket, in backward order (final, blocks L..1, embed).
std::vector<std::vector<int>> PlanBuckets(const ShardPlan& plan, const EngineOptions& o);
// Bytes one rank sends in one step of A micro-batches, per collective kind (ring model),
// derived from the plan; control traffic (loss, norm) excluded.
CommLedger ExpectedStepTraffic(const ParamLayout& layout, const ShardPlan& plan, const EngineOptions& o, int accum);

}  // namespace shardgpt
