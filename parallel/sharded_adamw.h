// ShardedAdamW: AdamW over the elements this rank owns (ZeRO stage >= 1: its pieces of every
// unit, ShardPlan::OwnedPieces, stored in shard order; stage 0: everything). AdamW is element-wise, so a slice updates alone given its
// averaged gradient. Holds the fp32 moments and, for bf16 storage, the fp32 master weights;
// for fp32 storage the stored parameters are the master copy.
//
// With --optimizer muon, the Muon matrices (parallel/muon_plan.h) are updated by ShardedMuon
// and skipped here: their first-moment slots hold Muon's momentum (so m_ is Muon's whole
// state and is sharded and checkpointed like AdamW's), and the second moments exist only for
// the AdamW elements, packed (k = 8 instead of 12 bytes per Muon element with bf16 storage).
// Checkpoints see v over the owned range (zeros at the Muon elements) through a transient
// unpacked copy: Owned(u, p, stored, true) fills it, CommitV() packs it back after a load.
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

  // Piece p of unit u (one of ctx.Pieces(u)): its range in unit coordinates, and its master,
  // m and v (device memory; master is `stored` itself for fp32 storage). `stored` is where the
  // piece's stored values (dtype) live (ParamStore::OwnedAt).
  struct Slice {
    size_t begin = 0, end = 0;
    float* master = nullptr;
    float* m = nullptr;
    float* v = nullptr;  // null under Muon unless with_v (then the transient unpacked copy)
  };
  Slice Owned(int u, const OwnedPiece& p, void* stored, bool with_v = false);
  // One AdamW step on piece p of unit u (t >= 1; grad_scale carries the clipping) that also
  // writes its stored parameters (dtype): one pass over master, m, v, the dtype gradient and
  // the stored values (Kernels::adamw_mixed), no fp32 copy of the gradient.
  // grad_scale_dev: where not null, the scale is read from device memory there instead (the
  // clip factor computed on the GPU; grad_scale is then ignored).
  void Update(int u, const OwnedPiece& p, const void* grads, void* stored, float lr, float grad_scale, int64_t t,
              const float* grad_scale_dev = nullptr);
  // Stored parameters (dtype) of piece p from the master after the master was written
  // (checkpoint load).
  void StoreFromMaster(int u, const OwnedPiece& p, void* stored);
  // Zero moments (a fresh start).
  void ResetMoments();
  // Under Muon: packs the unpacked v copy (written by a checkpoint load) back and frees it.
  void CommitV();

 private:
  // A run of owned AdamW elements of one decay setting inside one piece: unit coordinates
  // [begin, end), at `at` in master_ / m_ and at `vpos` in v_ (= at unless packed).
  struct Run {
    size_t begin, end, at, vpos;
    bool decay;
  };
  // Where piece p of unit u starts in master_ / m_ (and the unpacked v).
  size_t StateOffset(int u, const OwnedPiece& p) const;
  // stored[i, i+n) (dtype) = master[i, i+n) of slice sl (nothing for fp32: one buffer).
  void StoreRange(const Slice& sl, void* stored, size_t i, size_t n);

  EngineContext& ctx_;
  bool packed_ = false;          // v_ holds the AdamW elements only (Muon)
  std::vector<std::vector<Run>> runs_;  // per unit
  DeviceBuffer master_, m_, v_;  // fp32; master_, m_ over the owned elements of every unit
  DeviceBuffer v_view_;          // Muon: transient unpacked v for checkpoints
};

}  // namespace shardgpt
