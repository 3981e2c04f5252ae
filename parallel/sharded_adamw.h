// ShardedAdamW: AdamW over the elements this rank owns (ZeRO stage >= 1: its pieces of every
// unit, ShardPlan::OwnedPieces, stored in shard order; stage 0: everything). AdamW is element-wise, so a slice updates alone given its
// averaged gradient. Holds the fp32 moments and, for bf16 storage, the fp32 master weights;
// for fp32 storage the stored parameters are the master copy.
//
// Thread contract: the training thread.
#pragma once

#include <cstdint>

#include "parallel/engine_context.h"

namespace shardgpt {

class ShardedAdamW {
 public:
  explicit ShardedAdamW(EngineContext* ctx);

  // Piece p of unit u (one of ctx.Pieces(u)): its range in unit coordinates, and its master,
  // m and v (device memory; master is `stored` itself for fp32 storage). `stored` is where the
  // piece's stored values (dtype) live (ParamStore::OwnedAt).
  struct Slice {
    size_t begin = 0, end = 0;
    float* master = nullptr;
    float* m = nullptr;
    float* v = nullptr;
  };
  Slice Owned(int u, const OwnedPiece& p, void* stored);
  // One AdamW step on piece p of unit u (t >= 1; grad_scale carries the clipping), then its
  // stored parameters (dtype) are refreshed from the master.
  void Update(int u, const OwnedPiece& p, const void* grads, void* stored, float lr, float grad_scale, int64_t t);
  // Stored parameters (dtype) of piece p from the master after the master was written
  // (checkpoint load).
  void StoreFromMaster(int u, const OwnedPiece& p, void* stored);
  // Zero moments (a fresh start).
  void ResetMoments();

 private:
  EngineContext& ctx_;
  DeviceBuffer master_, m_, v_;  // fp32, over the owned elements of every unit
  DeviceBuffer grad32_;          // fp32 widening of a bf16 gradient slice (bf16 only)
};

}  // namespace shardgpt
