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
// last one) and a ShardedAdamW. All buffers live on one Device (CPU or CUDA).
//
// Rank contract: every public method is collective (all ranks call it in the same order).
// Thread contract: one training thread; communication runs on the communicator's thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/device.h"
#include "model/gpt.h"
#include "model/param_layout.h"
#include "parallel/communicator.h"
#include "parallel/engine_context.h"
#include "parallel/grad_reducer.h"
#include "parallel/param_store.h"
#include "parallel/sharded_adamw.h"
#include "parallel/zero_math.h"

namespace shardgpt {

// What one step sent and held, measured (ledgers).
struct StepReport {
  CommLedger comm;                 // bytes this rank sent, by collective kind
  uint64_t model_state_bytes = 0;  // persistent params + grads + optimizer state now
  uint64_t params_bytes = 0, grads_bytes = 0, optimizer_bytes = 0;
  uint64_t peak_grads_bytes = 0, peak_params_bytes = 0;
  double exposed_comm_s = 0;  // time the training thread waited for communication
  double backward_exposed_s = 0;  // of which waiting for gradient reductions after backward
  double comm_busy_s = 0;         // time the communicator spent in collectives this step
  int buckets_done_during_backward = 0;  // reductions already complete when backward ended
};

class Engine : public UnitHooks {
 public:
  // comm and device must outlive the engine. Throws DeviceOutOfMemory (persistent state).
  static StatusOr<std::unique_ptr<Engine>> Create(const ParamLayout& layout, Communicator* comm,
                                                  const EngineOptions& options, Device& device = CpuDevice());
  ~Engine() override;

  const EngineOptions& options() const { return ctx_.opt; }
  const ShardPlan& plan() const { return ctx_.plan; }
  MemoryLedger& memory() { return ctx_.memory; }
  Communicator& comm() { return *ctx_.comm; }
  Device& device() { return *ctx_.device; }

  // Sets parameters from a full unpadded flat buffer in host memory (layout order), the same on
  // every rank; optimizer moments are zeroed and the step counter reset.
  void LoadFullParams(const float* full);
  // The GPT-2 initialisation of InitParameters, computed by each rank for its owned slices only
  // (no rank builds the whole model; bitwise the same state as LoadFullParams of the full
  // initialisation). Moments zeroed, step counter reset. Collective.
  void InitOwned(uint64_t seed);
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
  const StepReport& last_report() const { return report_; }
  int64_t step_count() const { return t_; }

  // UnitHooks
  const float* PreForward(int unit) override;
  void PostForward(int unit) override;
  UnitBuffers PreBackward(int unit) override;
  void PostBackward(int unit) override;

  // For checkpoints: this rank's owned fp32 master pieces and moments of a unit (stage >= 1:
  // its plan pieces; stage 0: the full unit), each in unit coordinates [begin, end). DEVICE
  // memory: copy through device().CopyToHost / CopyToDevice.
  using OwnedState = ShardedAdamW::Slice;
  std::vector<OwnedState> OwnedPieces(int unit);
  void set_step_count(int64_t t) { t_ = t; }
  // After writing master values through Owned(): refresh the compute parameters. Collective.
  void SyncParamsFromMaster();

 private:
  Engine(const ParamLayout& layout, Communicator* comm, const EngineOptions& options, Device& device);
  // Stored parameters of unit u from its master pieces, then published to every rank.
  void StoreAndPublish(int u);

  EngineContext ctx_;
  std::unique_ptr<ParamStore> params_;
  std::unique_ptr<GradReducer> grads_;
  ShardedAdamW adamw_;
  bool sync_micro_ = true;  // this micro-batch reduces gradients
  int64_t t_ = 0;
  StepReport report_;
  double busy_at_step_begin_ = 0;
};

}  // namespace shardgpt
