// EngineContext and CollectiveQueue: what the engine's parts (ParamStore, GradReducer,
// ShardedAdamW) share: the layout and plan, the options, this rank's communicators, device and
// memory ledger, and the queue of collectives in flight.
//
// HSDP (hybrid sharding): `comm` is the SHARD communicator, the G ranks of this rank's group,
// over which everything is sharded (plan = (layout, G), rank = index in the group); `replica`
// is null without HSDP, else the R = N/G ranks holding the same shard (one per group), over
// which the reduced gradient shard is all-reduced once per step. Without HSDP comm is the
// world and G = N: the parts need not know which.
//
// Thread contract: the training thread only (completion callbacks run on it, in RetireCompleted).
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/memory_ledger.h"
#include "model/device.h"
#include "model/param_layout.h"
#include "parallel/communicator.h"
#include "parallel/shard_plan.h"
#include "parallel/zero_math.h"

namespace shardgpt {

// Collectives this rank has launched and not yet retired, in launch order (the communicator
// completes them in that order). Retiring one runs its completion step on the training thread
// (accumulate a reduced shard, free a send buffer). Time spent blocked is counted as exposed.
class CollectiveQueue {
 public:
  void Enqueue(std::shared_ptr<Work> work, std::function<void()> on_done) {
    pending_.push_back(Pending{std::move(work), std::move(on_done)});
  }
  void RetireCompleted() {
    while (!pending_.empty() && pending_.front().work->IsCompleted()) {
      Pending p = std::move(pending_.front());
      pending_.pop_front();
      retired_++;
      if (p.on_done) p.on_done();
    }
  }
  // Retires the oldest collective, then whatever has completed. Host backends: the host blocks
  // on it. Stream-ordered backends (NCCL): the compute stream is ordered after it and the host
  // goes on (no host wait inside a step); its completion step then queues its device work
  // (accumulate, copy-out) after the collective, and the buffers it drops are reused in compute
  // order, which then follows the collective (CudaDevice's allocator contract).
  void WaitOldest() {
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    WaitStream(*p.work);
    retired_++;
    if (p.on_done) p.on_done();
    RetireCompleted();
  }
  void WaitAll() {
    while (!pending_.empty()) WaitOldest();
  }
  // Blocks on one work, counting the time as exposed communication.
  void Wait(Work& work) {
    const auto t0 = std::chrono::steady_clock::now();
    work.Wait();
    exposed_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Orders later device work after the collective (the host waits only on host backends).
  void WaitStream(Work& work) {
    const auto t0 = std::chrono::steady_clock::now();
    work.WaitStream();
    exposed_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Retired plus completed-but-not-yet-retired collectives since ResetCounters().
  int CompletedCount() const {
    int done = retired_;
    for (const Pending& p : pending_) done += p.work->IsCompleted() ? 1 : 0;
    return done;
  }
  void ResetCounters() { exposed_s_ = 0, retired_ = 0; }
  double exposed_seconds() const { return exposed_s_; }
  bool empty() const { return pending_.empty(); }

 private:
  struct Pending {
    std::shared_ptr<Work> work;
    std::function<void()> on_done;
  };
  std::deque<Pending> pending_;
  double exposed_s_ = 0;
  int retired_ = 0;
};

struct EngineContext {
  const ParamLayout& layout;
  ShardPlan plan;
  EngineOptions opt;
  Communicator* comm;     // the shard group (the world without HSDP)
  Communicator* replica;  // HSDP: the ranks holding the same shard; null otherwise
  Device* device;
  MemoryLedger memory;
  CollectiveQueue queue;
  int rank, world;  // in the shard group

  EngineContext(const ParamLayout& l, Communicator* c, Device* d, const EngineOptions& o, Communicator* r = nullptr)
      : layout(l), plan(l, c->world_size(), o.shard_layout), opt(o), comm(c), replica(r), device(d), rank(c->rank()),
        world(c->world_size()) {
    for (int u = 0; u < plan.num_units(); u++)
      owned_.push_back(opt.shards_optimizer() ? plan.OwnedPieces(u, rank)
                                              : std::vector<OwnedPiece>{OwnedPiece{0, plan.unit(u).numel, 0}});
  }
  int replicas() const { return replica ? replica->world_size() : 1; }
  // The pieces of unit u this rank's optimizer updates: its plan pieces (stages >= 1), or the
  // whole unit (stage 0, where shard_offset is meaningless and every buffer is full).
  const std::vector<OwnedPiece>& Pieces(int u) const { return owned_[u]; }
  // FSDP2's copy-out / copy-in between a unit's rank-major buffer (what all-gather fills and
  // reduce-scatter reads) and its flat order (what the model reads and writes), elt bytes per
  // element. Only the per-param layout needs them (flat: the two orders are the same).
  void CopyOut(int u, const void* rank_major, void* flat, size_t elt_bytes) {
    for (const CopyRun& c : plan.CopyRuns(u))
      device->Copy(static_cast<uint8_t*>(flat) + c.begin * elt_bytes,
                   static_cast<const uint8_t*>(rank_major) + c.rank_major * elt_bytes, c.count * elt_bytes);
  }
  void CopyIn(int u, const void* flat, void* rank_major, size_t elt_bytes) {
    for (const CopyRun& c : plan.CopyRuns(u))
      device->Copy(static_cast<uint8_t*>(rank_major) + c.rank_major * elt_bytes,
                   static_cast<const uint8_t*>(flat) + c.begin * elt_bytes, c.count * elt_bytes);
  }
  Kernels& kernels() { return device->kernels(); }
  size_t elt() const { return DTypeSize(opt.dtype); }
  // The embed and final units: used first in backward, kept gathered from forward (FSDP2's root).
  bool is_root_unit(int u) const { return u == ParamLayout::kEmbedUnit || u == layout.final_unit(); }
  DeviceBuffer NewBuffer(MemKind kind, size_t bytes, const std::string& what) {
    return DeviceBuffer(device, &memory, kind, bytes, what);
  }
  // Not zero-filled (Device::AllocateUnfilled): for a buffer the next kernel overwrites whole.
  DeviceBuffer NewUnfilledBuffer(MemKind kind, size_t bytes, const std::string& what) {
    return DeviceBuffer(device, &memory, kind, bytes, what, /*zero_filled=*/false);
  }
  // A device copy of n host fp32 values stored as dtype.
  void Upload(void* dst, DType dtype, const float* host, size_t n) {
    if (dtype == DType::kF32) return device->CopyToDevice(dst, host, n * sizeof(float));
    DeviceBuffer tmp(device, nullptr, MemKind::kParams, n * sizeof(float), "upload staging");
    device->CopyToDevice(tmp.data(), host, n * sizeof(float));
    kernels().convert(tmp.data(), DType::kF32, dst, dtype, n);
  }

 private:
  std::vector<std::vector<OwnedPiece>> owned_;  // per unit: Pieces(u)
};

}  // namespace shardgpt
