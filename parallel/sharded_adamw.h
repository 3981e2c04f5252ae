// ShardedAdamW: AdamW over the elements this rank owns (ZeRO stage >= 1: its 1/N slice of
// every unit; stage 0: everything). AdamW is element-wise, so a slice updates alone given its
// averaged gradient. Holds the fp32 moments and, for bf16 storage, the fp32 master weights;
// for fp32 storage the stored parameters are the master copy.
//
// Thread contract: the training thread.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "parallel/engine_context.h"

namespace shardgpt {

class ShardedAdamW {
 public:
  explicit ShardedAdamW(EngineContext* ctx);

  // Unit u's owned range in unit coordinates, and its master, m and v (device memory; master
  // is `stored` itself for fp32 storage).
  struct Slice {
    size_t begin = 0, end = 0;
    float* master = nullptr;
    float* m = nullptr;
    float* v = nullptr;
  };
  Slice Owned(int u, void* stored);
  // One AdamW step on unit u's owned slice (t >= 1; grad_scale carries the clipping), then
  // the stored parameters (dtype) are refreshed from the master.
  void Update(int u, const void* grads, void* stored, float lr, float grad_scale, int64_t t);
  // Stored parameters (dtype) from the master after the master was written (checkpoint load).
  void StoreFromMaster(int u, void* stored);
  // Zero moments (a fresh start).
  void ResetMoments();
  // Element ranges [begin, end) of unit u (sorted, unit coordinates) that another optimizer
  // (Muon) updates: Update leaves them alone. Their first-moment slots hold that optimizer's
  // momentum (m_ is then Muon's state too).
  void SetSkipRanges(int u, std::vector<std::pair<size_t, size_t>> ranges) { skip_[u] = std::move(ranges); }

 private:
  EngineContext& ctx_;
  DeviceBuffer master_, m_, v_;  // fp32, over the owned elements of every unit
  DeviceBuffer grad32_;          // fp32 widening of a bf16 gradient slice (bf16 only)
  std::vector<std::vector<std::pair<size_t, size_t>>> skip_;  // per unit, see SetSkipRanges
};

}  // namespace shardgpt
