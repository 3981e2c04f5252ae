// ShardedMuon: Muon (model/muon.h) for the Muon matrices of the blocks, under every ZeRO stage,
// with each matrix orthogonalised by ONE owner rank (parallel/muon_plan.h) and nothing
// computed twice.
//
// Its state is the momentum, one fp32 per element, kept in ShardedAdamW's first-moment buffer
// at the matrix's elements (AdamW skips them), so it is sharded, checkpointed and resharded
// exactly like AdamW's moments. One step:
//   1. element-wise on this rank's owned pieces: M = mu*M + G, U = G + mu*M (stage 0: the
//      whole matrices, identically on every replica);
//   2. all-to-all-v #1: each U piece to its matrix's owner (stage 0: none; the owner has U);
//   3. the owner: Newton-Schulz, times 0.2*sqrt(max(rows, cols));
//   4. all-to-all-v #2: each rank receives the update of its own pieces (stage 0: of everything);
//   5. element-wise: W = W*(1 - lr*wd) - lr*O on the fp32 master.
// Both exchanges are counted in the ledger under all_to_all. Values travel in the gradients'
// reduce dtype: fp32, or bf16 with --dtype bf16 (then U and the update are rounded to bf16 once
// on every path, the rank's own blocks and stage 0 included, so results do not depend on N). On a device the host cannot
// address (CUDA) the element-wise parts and Newton-Schulz run on host copies (not GPU kernels).
//
// Rank contract: Step is collective. Thread contract: the training thread.
#pragma once

#include <functional>
#include <vector>

#include "parallel/engine_context.h"
#include "parallel/muon_plan.h"

namespace shardgpt {

class ShardedMuon {
 public:
  explicit ShardedMuon(EngineContext* ctx);

  const MuonPlan& plan() const { return plan_; }
  // Where this rank's state of one owned element run starts (device memory): found by unit and
  // unit coordinate, since with the per-param layout (and at stages 1/2, whose parameters are
  // stored whole in flat order) a unit's owned pieces are not one contiguous range anywhere.
  struct Where {
    const void* grad = nullptr;  // averaged gradient (opt.dtype)
    float* master = nullptr;     // fp32 master weights
    float* momentum = nullptr;   // fp32
  };
  // Element `at` (unit coordinates) of unit u; a run [at, end) of one segment is contiguous.
  using Locator = std::function<Where(int unit, size_t at)>;
  // One Muon step on every Muon matrix (t >= 1; grad_scale carries clipping). Collective.
  void Step(const Locator& locate, float lr, float grad_scale);
  // Seconds this rank spent in Newton-Schulz in the last Step: wall clock, and CPU time of
  // the calling thread (what a rank's share of the work costs, whatever else shares its cores;
  // it leaves out OpenBLAS's helper threads, so measure with OPENBLAS_NUM_THREADS=1).
  double last_ns_seconds() const { return ns_s_; }
  double last_ns_cpu_seconds() const { return ns_cpu_s_; }

 private:
  // Reads n gradient values (dtype) at `src` (device) as fp32 into dst (host).
  void ReadGrad(float* dst, const void* src, size_t n);

  EngineContext& ctx_;
  MuonPlan plan_;
  std::vector<std::vector<MuonSegment>> send1_, recv1_, send2_, recv2_;  // per peer
  std::vector<size_t> send1_n_, recv1_n_, send2_n_, recv2_n_;
  std::vector<int> mine_;           // matrices this rank owns
  std::vector<size_t> mat_offset_;  // per matrix: offset in mats_ (owned ones only)
  size_t mats_numel_ = 0;
  DeviceBuffer wire_send_, wire_recv_;  // device buffers the all-to-alls run on
  double ns_s_ = 0, ns_cpu_s_ = 0;
};

}  // namespace shardgpt
