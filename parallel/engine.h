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
// Rank contract: every public method is collective (all ranks call it in the same order).
// Thread contract: one training thread; communication runs on the communicator's thread.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/gpt.h"
#include "model/optimizer.h"
#include "model/param_layout.h"
#include "parallel/communicator.h"
#include "parallel/memory_ledger.h"
#include "parallel/shard_plan.h"

namespace shardgpt {

struct EngineOptions {
  int zero_stage = 0;                 // 0 (DDP), 1, 2, 3
  DType dtype = DType::kF32;          // storage of parameters and gradients; compute is fp32
  DType reduce_dtype = DType::kF32;   // dtype gradients travel in (default: dtype)
  double bucket_mb = 25.0;            // stage 0 bucket size (DDP's default)
  bool reshard_after_forward = true;  // stage 3: free block parameters after forward
  bool reduce_every_micro = true;     // stages 2/3: reduce-scatter every micro-batch
  AdamWConfig adamw;

  // One line naming the first impossible setting, or OK.
  Status Validate() const;
};

// What one step sent and held, measured (ledgers) and predicted (the seed's formulas).
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

// The seed's formulas (with this engine's element sizes), for printing beside measurements.
struct Formula {
  // bytes per parameter: p params, g grads, k optimizer state (12 for bf16: master + m + v;
  // 8 for fp32, whose parameters are the master copy)
  static double ModelStateBytes(double psi, int world, int stage, DType dtype);
  // bytes sent per rank per step (ring model, (N-1)/N included), A micro-batches
  static double TrafficBytes(double psi, int world, int stage, DType dtype, DType reduce_dtype, int accum,
                             bool reduce_every_micro);
};

// Bytes of the persistent model state one rank allocates, by kind (exact, padding included).
struct StateSizes {
  uint64_t params = 0, grads = 0, optimizer = 0;
  uint64_t total() const { return params + grads + optimizer; }
};

class Engine : public UnitHooks {
 public:
  // What an engine with these options allocates and sends: used by the engine itself, by
  // `shardgpt plan` and by the tests that compare the ledgers with the formulas.
  static StateSizes PersistentStateSizes(const ShardPlan& plan, const EngineOptions& options);
  // Stage 0 buckets: unit ids per bucket, in backward order.
  static std::vector<std::vector<int>> PlanBuckets(const ShardPlan& plan, const EngineOptions& options);
  // Bytes one rank sends in one step of A micro-batches, per collective kind (ring model),
  // derived from the plan; control traffic (loss, norm) excluded.
  static CommLedger ExpectedStepTraffic(const ParamLayout& layout, const ShardPlan& plan, const EngineOptions& options,
                                        int accum);

  // comm must outlive the engine.
  static StatusOr<std::unique_ptr<Engine>> Create(const ParamLayout& layout, Communicator* comm,
                                                  const EngineOptions& options);
  ~Engine() override;

  const EngineOptions& options() const { return opt_; }
  const ShardPlan& plan() const { return plan_; }
  MemoryLedger& memory() { return memory_; }
  Communicator& comm() { return *comm_; }

  // Sets parameters from a full unpadded flat buffer (layout order) that is the same on every
  // rank; optimizer moments are zeroed and the step counter reset.
  void LoadFullParams(const float* full);
  // Writes the full fp32 master parameters (layout order) into out, on every rank. Collective.
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

  // Accessors for checkpoints: this rank's owned fp32 master slice, moments (stage >= 1: the
  // shard; stage 0: the full unit), in unit coordinates [OwnedBegin, OwnedEnd).
  struct OwnedState {
    size_t begin = 0, end = 0;  // unit coordinates
    float* master = nullptr;     // fp32 master values for [begin, end)
    float* m = nullptr;
    float* v = nullptr;
  };
  OwnedState Owned(int unit);
  void set_step_count(int64_t t) { t_ = t; }
  // After writing master values through Owned(): refresh the compute parameters. Collective.
  void SyncParamsFromMaster();

 private:
  Engine(const ParamLayout& layout, Communicator* comm, const EngineOptions& options);
  struct Unit;
  struct Pending {
    std::shared_ptr<Work> work;
    std::function<void()> on_done;
  };

  bool shards_optimizer() const { return opt_.zero_stage >= 1; }
  bool shards_grads() const { return opt_.zero_stage >= 2; }
  bool shards_params() const { return opt_.zero_stage >= 3; }
  bool keeps_full_grads() const { return !shards_grads() || !opt_.reduce_every_micro; }
  bool is_root_unit(int u) const { return u == ParamLayout::kEmbedUnit || u == layout_.final_unit(); }
  size_t elt() const { return DTypeSize(opt_.dtype); }

  void Enqueue(std::shared_ptr<Work> work, std::function<void()> on_done);
  void RetireCompleted();
  void WaitOldest();
  void WaitAll();
  void WaitUnitGather(int u);
  void Gather(int u);                  // stage 3: launch the all-gather of unit u
  const float* ComputeParams(int u);   // fp32 view of unit u's full parameters
  void ReleaseParams(int u);           // stage 3 / bf16: free gathered and compute copies
  void LaunchBucket(int bucket);
  void LaunchReduceScatter(int u, float* scratch);
  void AllGatherParams(int u);
  float* FullGradsF32(int u);          // fp32 grads of unit u when dtype is fp32 (full buffer)
  void* FullGrads(int u);              // full grads of unit u in grad dtype
  void* OwnedGrads(int u);             // reduced gradient of the owned slice (grad dtype)
  void* ParamsOwned(int u);            // the owned slice of the compute parameters (dtype)

  const ParamLayout& layout_;
  Communicator* comm_;
  EngineOptions opt_;
  ShardPlan plan_;
  int rank_, world_;
  MemoryLedger memory_;
  std::vector<std::unique_ptr<Unit>> units_;
  // persistent model state (see docs/ARCHITECTURE.md for which exist at which stage)
  TrackedBuffer params_, master_, m_, v_, grads_, grad_shards_;
  std::deque<Pending> pending_;
  std::vector<std::vector<int>> buckets_;  // unit ids per bucket, backward order (stage 0)
  std::vector<int> bucket_of_unit_, bucket_ready_;
  bool sync_micro_ = true;  // this micro-batch reduces gradients
  int64_t t_ = 0;
  StepReport report_;
  double exposed_s_ = 0;
  double busy_at_step_begin_ = 0;
  int retired_ = 0;  // collectives retired since BeginStep
  // One unit's gradient reduces while the next unit's backward computes: enough to hide the
  // reduction when it is faster than a unit's backward, and the smallest peak.
  static constexpr int kMaxInflightReductions = 1;
  int inflight_reductions_ = 0;  // unit gradients (scratch) waiting for their reduce-scatter
};

}  // namespace shardgpt
