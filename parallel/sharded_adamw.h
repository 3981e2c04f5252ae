// ShardedAdamW: AdamW over the elements this rank owns (ZeRO stage >= 1: its 1/N slice of
// every unit; stage 0: everything). AdamW is element-wise, so a slice updates alone given its
// averaged gradient. Holds the fp32 moments and, for bf16 storage, the fp32 master weights;
// for fp32 storage the stored parameters are the master copy.
//
// With --optimizer muon, the Muon matrices (parallel/muon_plan.h) are updated by ShardedMuon
// and skipped here: their first-moment slots hold Muon's momentum (so m_ is Muon's whole
// state and is sharded and checkpointed like AdamW's), and the second moments exist only for
// the AdamW elements, packed (k = 8 instead of 12 bytes per Muon element with bf16 storage).
// Checkpoints see v over the owned range (zeros at the Muon elements) through a transient
// unpacked copy: Owned(u, stored, true) fills it, CommitV() packs it back after a load.
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
    float* v = nullptr;  // null under Muon unless with_v (then the transient unpacked copy)
  };
  Slice Owned(int u, void* stored, bool with_v = false);
  // One AdamW step on unit u's owned slice (t >= 1; grad_scale carries the clipping), then
  // the stored parameters (dtype) are refreshed from the master.
  void Update(int u, const void* grads, void* stored, float lr, float grad_scale, int64_t t);
  // Stored parameters (dtype) from the master after the master was written (checkpoint load).
  void StoreFromMaster(int u, void* stored);
  // Zero moments (a fresh start).
  void ResetMoments();
  // Under Muon: packs the unpacked v copy (written by a checkpoint load) back and frees it.
  void CommitV();

 private:
  // A run of owned AdamW elements of one decay setting: unit coordinates [begin, end), at
  // `local` in the owned buffers (master, m, gradient) and at `vpos` in v_.
  struct Run {
    size_t begin, end, local, vpos;
    bool decay;
  };
  size_t UnitOffset(int u) const;  // offset of unit u's owned elements in master_ / m_

  EngineContext& ctx_;
  bool packed_ = false;          // v_ holds the AdamW elements only (Muon)
  std::vector<std::vector<Run>> runs_;  // per unit
  DeviceBuffer master_, m_, v_;  // fp32; master_, m_ over the owned elements of every unit
  DeviceBuffer v_view_;          // Muon: transient unpacked v for checkpoints
  DeviceBuffer grad32_;          // fp32 widening of a bf16 gradient slice (bf16 only)
};

}  // namespace shardgpt
