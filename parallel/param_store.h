// ParamStore: where the parameters live between steps and how a unit's full fp32 parameters
// reach the model when it runs (FSDP2's FSDPParam / FSDPParamGroup: sharded and unsharded
// forms, all-gather before use, free after). Chosen once by the engine:
//   ReplicatedParams  stages 0-2: every rank stores every unit; stages 1/2 all-gather each
//                     unit's updated owned slice after the optimizer step (Publish).
//   ShardedParams     stage 3: each rank stores its slice; a unit is all-gathered before its
//                     forward (the next one prefetched) and freed after it (reshard after
//                     forward), gathered again for backward and freed after it. The root units
//                     stay gathered from forward to backward.
// With bf16 storage a unit's parameters are widened into an fp32 compute copy while it runs.
// With the per-param shard layout every all-gather lands in a rank-major buffer whose tensors
// are copied out into their places in the unit (ctx.CopyOut) before anyone reads them.
//
// Rank contract: every method is collective. Thread contract: the training thread.
#pragma once

#include <memory>
#include <vector>

#include "parallel/engine_context.h"

namespace shardgpt {

class ParamStore {
 public:
  explicit ParamStore(EngineContext* ctx);
  virtual ~ParamStore() = default;
  static std::unique_ptr<ParamStore> Create(EngineContext* ctx);

  // fp32 view of unit u's full parameters, valid until the matching Post call.
  virtual const float* PreForward(int u) = 0;
  virtual void PostForward(int u) = 0;
  virtual const float* PreBackward(int u) = 0;
  virtual void PostBackward(int u) = 0;
  // Frees every gathered and compute copy (after a forward-only pass).
  virtual void ReleaseAll() = 0;
  // Where the stored values (dtype) of piece p of unit u (one of ctx.Pieces(u)) live: what
  // the optimizer writes.
  virtual void* OwnedAt(int u, const OwnedPiece& p) = 0;
  // After the owned pieces were written: bring every rank's stored copy up to date.
  virtual void Publish(int u) { (void)u; }

 protected:
  // The fp32 view of `full` (dtype storage, the whole padded unit): itself for fp32,
  // otherwise a converted copy that lives until ReleaseCompute(u).
  const float* ComputeView(int u, const void* full);
  void ReleaseCompute(int u) { compute_[u].Free(); }

  EngineContext& ctx_;
  std::vector<DeviceBuffer> compute_;  // per unit: fp32 compute copy (bf16 storage only)
};

}  // namespace shardgpt
