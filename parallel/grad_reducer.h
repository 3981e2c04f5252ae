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
// Rank contract: every method is collective. Thread contract: the training thread.
#pragma once

#include <memory>

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
};

}  // namespace shardgpt
