// GradReducer: where each unit's gradient accumulates during backward and how it is averaged
// over ranks (FSDP2's reduce-scatter per parameter group; DDP's buckets). Chosen once:
//   BucketAllReduce        stage 0: full gradients; buckets of consecutive units (backward
//                          order) are all-reduced as soon as their last unit's backward ends,
//                          in the last micro-batch only (no_sync before it).
//   LastMicroReduceScatter stage 1 (and 2/3 with --reduce-grads last-micro): full local
//                          gradients; each unit reduce-scattered in place right after its
//                          backward in the last micro-batch.
//   EveryMicroReduceScatter stages 2/3: each unit's fp32 gradient of this micro-batch is
//                          reduce-scattered right after its backward and freed once reduced;
//                          only the owned shard persists (at most one unit waits).
// HSDP (EngineContext::replica set): the reduce-scatters run inside the shard group; once a
// unit's last reduce-scatter of the step has retired, its owned shard is all-reduced (average)
// across groups on the replica communicator. MPI: launched from that reduce-scatter's
// completion step. Stream-ordered communicators (NCCL, one stream for both): issued from the
// training flow right after the reduce-scatter (EveryMicroReduceScatter: before the next
// unit's), never from a completion step, so every rank issues both communicators' collectives
// in the same order (grad_reducer.cc).
// With the per-param shard layout a unit's gradient is copied into rank-major order
// (ctx.CopyIn) before its reduce-scatter; the last-micro policy copies the reduced pieces back
// into the unit's flat order, where the optimizer reads them.
//
// The gradient norm's partial sums are taken here, where each unit's reduced gradient becomes
// final: in the completion step of its last reduction of the step (after the replica
// all-reduce with HSDP), one sum of squares per owned piece into a device slot
// (Kernels::sum_squares_to, no host wait), so the step does not read every gradient again.
//
// Rank contract: every method is collective. Thread contract: the training thread.
#pragma once

#include <memory>
#include <vector>

#include "parallel/engine_context.h"

namespace shardgpt {

class GradReducer {
 public:
  virtual ~GradReducer() = default;
  static std::unique_ptr<GradReducer> Create(EngineContext* ctx);

  // Zeroes the gradients of a new step.
  virtual void BeginStep() = 0;
  // sync: this micro-batch is the last of the step (gradients are reduced in it).
  virtual void BeginMicroBatch(bool sync) = 0;
  // The fp32 buffer unit u's backward accumulates into (+=), valid until PostBackward(u).
  virtual float* PreBackward(int u) = 0;
  // Unit u's gradient of this micro-batch is complete: accumulate or launch its reduction.
  virtual void PostBackward(int u) = 0;
  // After every reduction retired: the averaged gradient (dtype) of piece p of unit u (one of
  // ctx.Pieces(u)), the elements the optimizer updates.
  virtual const void* OwnedAt(int u, const OwnedPiece& p) = 0;

  // After every reduction retired: slot k (device memory, double) = sum of squares of the k-th
  // owned piece's averaged gradient, pieces numbered unit by unit in ctx.Pieces(u) order, so
  // adding the slots in index order gives the norm's sum in the order the step always used.
  const double* norm_partials() const { return slots_.as<double>(); }
  size_t num_norm_partials() const { return num_slots_; }

 protected:
  explicit GradReducer(EngineContext* ctx);
  // The completion step in which unit u's averaged gradient became final: its pieces' slots.
  void TakeNormPartials(int u);
  // A new step: every slot to 0 (each is set again once its unit is reduced).
  void ZeroNormPartials();

  EngineContext& ctx_;  // the engine's, for every policy

 private:
  std::vector<size_t> first_slot_;  // per unit
  size_t num_slots_ = 0;
  DeviceBuffer slots_;  // not in the memory ledger (a few doubles, not model state)
};

}  // namespace shardgpt
