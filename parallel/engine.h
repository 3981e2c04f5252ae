// Engine: data parallelism for one model replica per rank: DDP (ZeRO stage 0) and ZeRO
// stages 1, 2 and 3, as one engine with three switches (stage >= 1 shards the optimizer
// state, >= 2 the gradients, 3 the parameters).
//
// The model talks to it only through UnitHooks (gather before a unit runs, reduce after its
// backward), so the training loop never knows the stage. Per step:
//   BeginStep(); for each micro-batch m: BeginMicroBatch(m, A); Forward; Backward;  Step(lr, clip)
// Stage 0 all-reduces gradient buckets (groups of consecutive units in backward order)
// during the last micro-batch's backward, as soon as each bucket's units are done. Stages
// >= 1 reduce-scatter each unit's gradient (the unit is the bucket) right after its
// backward; stage 2/3 do so every micro-batch by default (memory stays sharded) or only in
// the last one (--reduce-grads last-micro: traffic x1, full-gradient memory). AdamW then
// updates the owned slice; stages 1 and 2 all-gather the updated parameters, stage 3 keeps
// only its slice and all-gathers each unit before its forward and again before its backward
// (blocks only: the embed and final units stay gathered from forward until their backward,
// like FSDP2's root module), prefetching the next unit while the current one computes.
//
// The engine composes three parts chosen once from the options, so nothing below branches on
// the stage: a ParamStore (replicated, or sharded with gather / prefetch / reshard), a
// GradReducer (bucketed all-reduce, or per-unit reduce-scatter every micro-batch or in the
// last one) and a ShardedAdamW (plus, with --optimizer muon, a ShardedMuon for the blocks'
// matrices, run before AdamW in Step). All buffers live on one Device (CPU or CUDA).
//
// HSDP (options.shard_group_size = G < N, FSDP2's HSDP / ZeRO++'s hpZ): Create splits the
// world once into N/G shard groups of G consecutive ranks (group g = ranks gG .. gG+G-1, meant
// to be one node) and G replica groups (the ranks with the same index in their group). Stages
// 1-3 shard within the group (plan = (layout, G)); each unit's gradient is reduce-scattered in
// the group and the owned shard all-reduced across groups once per step; parameters are
// gathered in the group only. Replica groups hold bitwise-equal shards after every step.
//
// Rank contract: every public method is collective (all ranks call it in the same order).
// Thread contract: one training thread; communication runs on the communicator's thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/device.h"
#include "model/gpt.h"
#include "model/param_layout.h"
#include "parallel/communicator.h"
#include "parallel/engine_context.h"
#include "parallel/engine_options.h"
#include "parallel/grad_reducer.h"
#include "parallel/param_store.h"
#include "parallel/sharded_adamw.h"
#include "parallel/sharded_muon.h"

namespace shardgpt {

// What one step sent and held, measured (ledgers).
struct StepReport {
  CommLedger comm;                 // bytes this rank sent inside its shard group, by kind (all of
                                   // them without HSDP)
  CommLedger comm_across;          // HSDP: bytes sent across groups (the replica all-reduces)
  uint64_t model_state_bytes = 0;  // persistent params + grads + optimizer state now
  uint64_t params_bytes = 0, grads_bytes = 0, optimizer_bytes = 0;
  uint64_t peak_grads_bytes = 0, peak_params_bytes = 0;
  uint64_t activation_bytes = 0;  // the model's activations (tracked when the GPT was given the ledger)
  uint64_t peak_bytes = 0;        // peak of every tracked allocation this step (what `plan` predicts)
  // Time the training thread waited for communication this step, and where it waited:
  double exposed_comm_s = 0;        // all of it (= the three below)
  double forward_wait_s = 0;        // in forward: stage 3 parameter all-gathers not yet done
  double backward_wait_s = 0;       // in backward: stage 3 gathers, the one-unit reduce-scatter limit
  double after_backward_wait_s = 0; // in Step: reductions still running when backward ended,
                                    // and stages 1/2's parameter all-gathers after the update
  // Time the communication thread spent inside collectives this step: includes waiting for
  // the slower rank to arrive, so it is not "communication work" (no overlap ratio is made
  // from it; bench_train reports scaling efficiency instead).
  double comm_busy_s = 0;
  int buckets_done_during_backward = 0;  // reductions already complete when backward ended
  double muon_ns_s = 0;      // --optimizer muon: seconds this rank spent in Newton-Schulz
  double muon_ns_cpu_s = 0;  // the same in CPU time of the training thread
};

class Engine : public UnitHooks {
 public:
  // comm (the world) and device must outlive the engine. Throws DeviceOutOfMemory (persistent
  // state). With HSDP, splits comm (collective) and owns the group communicators.
  static StatusOr<std::unique_ptr<Engine>> Create(const ParamLayout& layout, Communicator* comm,
                                                  const EngineOptions& options, Device& device = CpuDevice());
  ~Engine() override;

  const EngineOptions& options() const { return ctx_.opt; }
  const ShardPlan& plan() const { return ctx_.plan; }
  // --optimizer muon: which matrices are Muon's and their owners; null for AdamW.
  const MuonPlan* muon_plan() const { return muon_ ? &muon_->plan() : nullptr; }
  MemoryLedger& memory() { return ctx_.memory; }
  // The world communicator given to Create (control plane: loss, agreement, checkpoints).
  Communicator& comm() { return *world_; }
  // HSDP: the shard group (the world without HSDP) and the replica group (null without HSDP).
  Communicator& shard_comm() { return *ctx_.comm; }
  Communicator* replica_comm() { return ctx_.replica; }
  int shard_group_size() const { return ctx_.world; }
  int shard_rank() const { return ctx_.rank; }  // this rank's index in its shard group
  int num_groups() const { return ctx_.replicas(); }
  // Which group this rank is in (0 .. N/G-1): group 0 writes checkpoints.
  int group_index() const { return ctx_.replica ? ctx_.replica->rank() : 0; }
  Device& device() { return *ctx_.device; }

  // Sets parameters from a full unpadded flat buffer in host memory (layout order), the same on
  // every rank; optimizer moments are zeroed and the step counter reset.
  void LoadFullParams(const float* full);
  // The GPT-2 initialisation of InitParameters, computed by each rank for its owned slices only
  // (no rank builds the whole model; bitwise the same state as LoadFullParams of the full
  // initialisation). Moments zeroed, step counter reset. Collective.
  void InitOwned(uint64_t seed);
  // Parameters read range by range: read(unit, begin, end, out) fills out with elements
  // [begin, end) of `unit` (its flat buffer, unpadded), called for this rank's owned range of
  // each unit only (--init from an llm.c file without the full model). Moments zeroed, step
  // counter reset. Stops at the first error and returns it (local; the caller agrees on it);
  // collective otherwise.
  Status LoadOwnedParams(const std::function<Status(int unit, uint64_t begin, uint64_t end, float* out)>& read);
  // Writes the full fp32 master parameters (layout order) into host memory `out`, on every
  // rank. Collective.
  void GatherFullParams(float* out);

  // Frees every gathered or converted parameter copy (after a forward-only pass).
  void ReleaseAll();
  void BeginStep();
  void BeginMicroBatch(int micro, int num_micro);
  // After the last micro-batch: waits for reductions, computes the global gradient norm,
  // clips to grad_clip (0 = off), runs AdamW on the owned slices and (stages 1, 2) gathers
  // the parameters. Returns the global norm before clipping.
  float Step(float lr, float grad_clip);
  // Step without the host waiting for the device (on a GPU: the norm, the clip factor and the
  // norm's sum over ranks stay in device memory; the collectives are waited for in stream
  // order). The norm is then at device_norm() (a float in device memory, valid until the next
  // step), for the caller to read with the step's other results in one copy. On a host device
  // (CPU) this is Step, bitwise, and device_norm() points at its result. Collective.
  void StepDeferred(float lr, float grad_clip);
  const float* device_norm() const { return clip_.as<float>(); }
  // *value (one double in device memory, this rank's) becomes the sum over comm's ranks, added
  // in rank order, divided by divisor, without a host wait on a GPU: the doubles are gathered
  // (a copy of their bytes, counted as control traffic in comm's ledger) and summed on the
  // device. comm is this engine's world or shard communicator. Collective over comm.
  void SumOverRanks(Communicator& comm, double* value, double divisor);
  const StepReport& last_report() const { return report_; }
  int64_t step_count() const { return t_; }

  // UnitHooks
  const float* PreForward(int unit) override;
  void PostForward(int unit) override;
  UnitBuffers PreBackward(int unit) override;
  void PostBackward(int unit) override;

  // For checkpoints: this rank's owned fp32 master pieces and moments of a unit (stage >= 1:
  // its plan pieces; stage 0: the full unit), each in unit coordinates [begin, end). DEVICE
  // memory: copy through device().CopyToHost / CopyToDevice. Under Muon, m holds Muon's
  // momentum at the Muon matrices and v is an unpacked copy (zeros there) until
  // SyncParamsFromMaster.
  using OwnedState = ShardedAdamW::Slice;
  // (Closes the kernels' weight reuse window: the caller may write through these pointers.)
  std::vector<OwnedState> OwnedPieces(int unit) {
    CloseWeightReuse();
    return Pieces(unit, true);
  }
  void set_step_count(int64_t t) { t_ = t; }
  // After writing master values through Owned(): refresh the compute parameters. Collective.
  void SyncParamsFromMaster();

 private:
  Engine(const ParamLayout& layout, Communicator* world, std::unique_ptr<Communicator> shard,
         std::unique_ptr<Communicator> replica, const EngineOptions& options, Device& device);
  // Stored parameters of unit u from its master pieces, then published to every rank.
  void StoreAndPublish(int u);
  // The owned pieces' state; with_v: also v (under Muon an unpacked copy: checkpoints only).
  std::vector<OwnedState> Pieces(int unit, bool with_v);
  std::vector<OwnedState> MasterPieces(int unit) { return Pieces(unit, false); }
  // ShardedMuon's view of this rank's state: the piece of unit u holding element `at`.
  ShardedMuon::Where LocateForMuon(int u, size_t at);

  double CommBusySeconds() const;
  // The device's weight reuse window (engine.cc): whether this engine opens one; closing it.
  bool WeightsReusable() const;
  void CloseWeightReuse();
  // The host path of the global gradient norm and clip factor (the CPU: bitwise as before).
  float HostNormAndScale(float grad_clip, float* scale);

  Communicator* world_;
  std::unique_ptr<Communicator> own_shard_, own_replica_;  // HSDP only; outlive ctx_
  EngineContext ctx_;
  std::unique_ptr<ParamStore> params_;
  std::unique_ptr<GradReducer> grads_;
  ShardedAdamW adamw_;
  std::unique_ptr<ShardedMuon> muon_;  // --optimizer muon only
  // Device scalars of Step (persistent, so a step allocates nothing): the total of the
  // GradReducer's per-piece sums of squares, the gathered per-rank doubles of SumOverRanks, and
  // (norm, clip factor) as two floats. Not in the memory ledger (bytes, not model state).
  DeviceBuffer ss_, gathered_, clip_;
  bool sync_micro_ = true;  // this micro-batch reduces gradients
  int64_t t_ = 0;
  StepReport report_;
  bool in_backward_ = false;  // between a micro-batch's first PreBackward and PostBackward(embed)
  double phase_mark_s_ = 0;   // exposed seconds when the current phase began
  double busy_at_step_begin_ = 0;
};

}  // namespace shardgpt
