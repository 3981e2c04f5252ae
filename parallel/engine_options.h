// EngineOptions: how the data-parallel engine shards, stores and reduces (what the train and
// plan flags resolve to). A plain value: Validate() says whether a combination is possible,
// before any engine exists. The definitions of the non-inline calls are in
// parallel/zero_math.cc.
#pragma once

#include <string>

#include "base/dtype.h"
#include "base/status.h"
#include "model/muon.h"
#include "model/optimizer.h"
#include "parallel/shard_plan.h"

namespace shardgpt {

// --optimizer: AdamW for everything, or Muon for the blocks' 2-D matrices (parallel/muon_plan.h)
// with AdamW for the rest.
enum class OptimizerKind { kAdamW, kMuon };
StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name);
const char* OptimizerName(OptimizerKind k);  // "adamw", "muon"

struct EngineOptions {
  int zero_stage = 0;                 // 0 (DDP), 1, 2, 3
  DType dtype = DType::kF32;          // storage of parameters and gradients; compute is fp32
  DType reduce_dtype = DType::kF32;   // dtype gradients travel in (default: dtype)
  DType act_dtype = DType::kF32;      // the model's activations (GPT): what the memory plan counts
  double bucket_mb = 25.0;            // stage 0 bucket size (DDP's default)
  bool reshard_after_forward = true;  // stage 3: free block parameters after forward
  bool reduce_every_micro = true;     // stages 2/3: reduce-scatter every micro-batch
  int shard_group_size = 0;           // HSDP: shard within groups of G ranks (0 = all ranks)
  ShardLayout shard_layout = ShardLayout::kFlat;  // flat unit shards (FSDP1) or per-parameter dim-0 (FSDP2)
  AdamWConfig adamw;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  MuonConfig muon;  // with OptimizerKind::kMuon

  bool shards_optimizer() const { return zero_stage >= 1; }
  bool shards_grads() const { return zero_stage >= 2; }
  bool shards_params() const { return zero_stage >= 3; }
  // Whether a full (unsharded) gradient buffer persists: stages 0/1, and 2/3 with last-micro.
  bool keeps_full_grads() const { return !shards_grads() || !reduce_every_micro; }
  // Bytes of optimizer state per parameter: fp32 m, v (+ fp32 master weights for bf16).
  int optimizer_bytes_per_param() const { return dtype == DType::kBF16 ? 12 : 8; }

  // One line naming the first impossible setting, or OK.
  Status Validate() const;
  // G for a world of `world` ranks (shard_group_size, or world when 0); checks that G divides
  // the world and that stage 0 (nothing sharded) is not given groups.
  StatusOr<int> ShardGroupSize(int world) const;
};

}  // namespace shardgpt
