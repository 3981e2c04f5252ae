// MemoryModel: each rank's predicted PEAK of tracked device memory in a training step
// (base/memory_ledger.h counts the same buffers), for `shardgpt plan` and the tests.
//
// Peak = persistent state (parameters, gradients, optimizer state and workspace, activations
// for B x T) + the largest sum of transient buffers alive at one moment of the step:
// gathered and prefetched units (stage 3), fp32 compute copies of bf16 units, fp32 gradient
// scratch (bf16 storage; every unit at stages 2/3), the tied embedding's full gradient that
// lives through the whole backward (its LM-head share is computed first, its encoder share
// last), and communication buffers (bf16 gradients and reduce-dtype conversions in flight).
// The transient part is found by replaying the engine's allocation order unit by unit
// (parallel/param_store.cc, parallel/grad_reducer.cc), assuming every collective is still in
// flight until the engine's next wait on it, so it is an upper bound of what a run measures;
// the tests assert it stays within 15% of the measured peak.
//
// Layout, precision and optimizer enter as one term each, so other layouts and optimizers
// plug in: padding through the ShardPlan's totals and units, optimizer state through
// EngineOptions::optimizer_bytes_per_param(), the optimizer's workspace through
// OptimizerWorkspaceBytes().
//
// Not counted (and not tracked): the MPI communicator's host temporary for an aliased
// reduce-scatter (one shard, on its thread), CUDA/NCCL library workspaces, and copies made
// outside steps (loading, checkpoints, which stream through 4 MiB).
//
// Pure arithmetic; thread-compatible.
#pragma once

#include <string>

#include "model/gpt.h"
#include "model/param_layout.h"
#include "parallel/shard_plan.h"
#include "parallel/zero_math.h"

namespace shardgpt {

struct MemoryPrediction {
  // persistent between steps
  double params = 0, grads = 0, optimizer = 0;  // model state (PersistentStateSizes)
  double workspace = 0;                         // the optimizer's workspace
  double activations = 0;                       // the model's activations for B x T
  // transient: the live buffers at the step's peak moment, by kind, and that moment
  double gathered = 0;     // gathered / prefetched units and fp32 compute copies (params)
  double grad_scratch = 0; // fp32 gradient scratch of units in backward (grads)
  double comm = 0;         // communication buffers in flight
  std::string where;

  double persistent() const { return params + grads + optimizer + workspace + activations; }
  double transient() const { return gathered + grad_scratch + comm; }
  double peak() const { return persistent() + transient(); }
};

// Bytes of the optimizer's persistent workspace on one rank. AdamW has none: it reads the
// gradient in its storage dtype in the same pass that writes the stored parameters
// (Kernels::adamw_mixed), so no fp32 copy of a gradient slice exists.
double OptimizerWorkspaceBytes(const ShardPlan& plan, const EngineOptions& o);

// The peak for micro-batches of B x T tokens and `accum` micro-batches per step, activations
// kept as `recompute` says (they are one persistent allocation: recomputation changes only
// that term; the stage-3 re-forward uses the units gathered for backward, nothing more).
MemoryPrediction PredictPeakMemory(const ParamLayout& layout, const ShardPlan& plan, const EngineOptions& o, int B,
                                   int T, int accum = 1, Recompute recompute = Recompute::kNone);

// The largest micro-batch B whose predicted peak is at most `budget_bytes` (0 when even B = 1
// does not fit), searched up to `max_b`; the answer `plan` prints and `train --micro-batch
// auto` trains with. The peak grows with B (activations are linear in B, the rest constant).
int LargestFittingMicroBatch(const ParamLayout& layout, const ShardPlan& plan, const EngineOptions& o, int T,
                             int accum, Recompute recompute, double budget_bytes, int max_b = 1 << 16);

}  // namespace shardgpt
