#include "parallel/grad_reducer.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

namespace shardgpt {

namespace {

// HSDP's two communicators, and the order in which a rank issues their collectives.
//
// The in-group reduce-scatter of a unit's gradient (shard communicator) is followed by the
// all-reduce (average) of the owned shard ACROSS groups (replica communicator: the R ranks
// that own the same shard). The replica communicator must see the same call order on every
// rank, and so it does either way below (each rank issues these in unit order).
//
// Stream-ordered communicators (NCCL: one stream for both, parallel/communicator.h) need more:
// the order of ALL collectives of both communicators must be the same on every rank, or two
// ranks wait for each other behind collectives the other issued in another order. Completion
// steps run whenever the training thread happens to retire a collective (timing, per rank),
// so a collective issued from one could fall before or after, say, stage 3's next all-gather
// prefetch. The rule: on stream-ordered communicators, collectives are issued only from fixed
// points of the training flow, never from a completion step. So the replica all-reduce is
// issued right after the shard reduce-scatter (stream order makes it wait for it): every rank
// issues RS(u), AR(u), RS(u+1), AR(u+1), ... (EveryMicroReduceScatter, which must accumulate
// first, issues AR(u) before its next reduce-scatter; see there).
//
// MPI (two FIFOs, two threads): order across communicators does not matter; the all-reduce is
// launched from the reduce-scatter's completion step, which keeps the replica FIFO from
// waiting for the shard FIFO.
bool StreamOrdered(const EngineContext& ctx) {
  return ctx.replica != nullptr && ctx.replica->stream_ordered() && ctx.comm->stream_ordered();
}

// The across-group all-reduce (average) of the owned shard buf; `then` runs once it is final.
void AverageAcrossGroups(EngineContext& ctx, void* buf, size_t count, DType dtype, std::function<void()> then) {
  ctx.queue.Enqueue(ctx.replica->AllReduce(buf, count, dtype, ReduceOp::kAvg), std::move(then));
}

// Retires the in-group reduce-scatter `rs` whose result is the owned shard buf (count elements
// of dtype), averaged across groups with HSDP; `then` runs once the shard is final.
void ReduceThenAcrossGroups(EngineContext& ctx, std::shared_ptr<Work> rs, void* buf, size_t count, DType dtype,
                            std::function<void()> then) {
  if (ctx.replica == nullptr) return ctx.queue.Enqueue(std::move(rs), std::move(then));
  if (StreamOrdered(ctx)) {
    ctx.queue.Enqueue(std::move(rs), nullptr);
    return AverageAcrossGroups(ctx, buf, count, dtype, std::move(then));
  }
  EngineContext* c = &ctx;
  ctx.queue.Enqueue(std::move(rs), [c, buf, count, dtype, then]() { AverageAcrossGroups(*c, buf, count, dtype, then); });
}

// Full (padded) gradients of every unit in dtype. fp32 backward accumulates straight into
// them; bf16 gradients go through an fp32 scratch per unit, added once the unit is done.
class FullGradients : public GradReducer {
 public:
  explicit FullGradients(EngineContext* ctx) : GradReducer(ctx), scratch_(ctx->plan.num_units()) {
    grads_ = ctx_.NewBuffer(MemKind::kGrads, ctx_.plan.total_padded() * ctx_.elt(), "gradients");
  }
  void BeginStep() override {
    ctx_.device->Zero(grads_.data(), grads_.bytes());
    ZeroNormPartials();
  }
  void BeginMicroBatch(bool sync) override { sync_ = sync; }
  float* PreBackward(int u) override {
    if (ctx_.opt.dtype == DType::kF32) return static_cast<float*>(Full(u));
    scratch_[u] = ctx_.NewBuffer(MemKind::kGrads, ctx_.plan.unit(u).padded * sizeof(float), "fp32 gradient scratch");
    return scratch_[u].as<float>();
  }
  void PostBackward(int u) override {
    if (!scratch_[u].empty()) {
      ctx_.kernels().accumulate(Full(u), ctx_.opt.dtype, scratch_[u].data(), DType::kF32, ctx_.plan.unit(u).padded);
      scratch_[u].Free();
    }
    if (sync_) Reduce(u);
  }

 protected:
  virtual void Reduce(int u) = 0;  // the last micro-batch's gradient of unit u is complete
  void* Full(int u) { return grads_.as<uint8_t>() + ctx_.plan.unit(u).padded_offset * ctx_.elt(); }
  void* At(size_t padded_index) { return grads_.as<uint8_t>() + padded_index * ctx_.elt(); }
  // Averages `count` gradient elements in place through the communicator, in reduce dtype;
  // `then` (if any) runs once the result is in place.
  void AverageInPlace(void* grads, size_t count, bool all_reduce, size_t shard, std::function<void()> then = nullptr) {
    const DType d = ctx_.opt.dtype, rd = ctx_.opt.reduce_dtype;
    const size_t own = ctx_.rank * shard;
    if (rd == d) {
      void* mine = static_cast<uint8_t*>(grads) + own * ctx_.elt();
      if (all_reduce)
        ctx_.queue.Enqueue(ctx_.comm->AllReduce(grads, count, d, ReduceOp::kAvg), std::move(then));
      else
        ReduceThenAcrossGroups(ctx_, ctx_.comm->ReduceScatter(grads, mine, shard, d, ReduceOp::kAvg), mine, shard, d,
                               std::move(then));
      return;
    }
    auto tmp = std::make_shared<DeviceBuffer>(
        ctx_.NewUnfilledBuffer(MemKind::kComm, count * DTypeSize(rd), "reduce buffer"));
    ctx_.kernels().convert(grads, d, tmp->data(), rd, count);
    // all-reduce: the whole buffer comes back; reduce-scatter: the owned block of it
    const size_t back_offset = all_reduce ? 0 : own, back_count = all_reduce ? count : shard;
    void* back = tmp->as<uint8_t>() + back_offset * DTypeSize(rd);
    std::shared_ptr<Work> work = all_reduce ? ctx_.comm->AllReduce(tmp->data(), count, rd, ReduceOp::kAvg)
                                            : ctx_.comm->ReduceScatter(tmp->data(), back, shard, rd, ReduceOp::kAvg);
    void* dst = static_cast<uint8_t*>(grads) + back_offset * ctx_.elt();
    auto convert_back = [this, tmp, back, dst, back_count, rd, then]() {
      ctx_.kernels().convert(back, rd, dst, ctx_.opt.dtype, back_count);
      if (then) then();
    };
    if (all_reduce) return ctx_.queue.Enqueue(work, convert_back);
    ReduceThenAcrossGroups(ctx_, work, back, back_count, rd, convert_back);
  }

  DeviceBuffer grads_;
  std::vector<DeviceBuffer> scratch_;
  bool sync_ = true;
};

class BucketAllReduce final : public FullGradients {
 public:
  explicit BucketAllReduce(EngineContext* ctx) : FullGradients(ctx), buckets_(PlanBuckets(ctx->plan, ctx->opt)) {
    bucket_of_unit_.assign(ctx_.plan.num_units(), 0);
    for (size_t b = 0; b < buckets_.size(); b++)
      for (int u : buckets_[b]) bucket_of_unit_[u] = static_cast<int>(b);
    ready_.assign(buckets_.size(), 0);
  }
  void BeginMicroBatch(bool sync) override {
    FullGradients::BeginMicroBatch(sync);
    std::fill(ready_.begin(), ready_.end(), 0);
  }
  const void* OwnedAt(int u, const OwnedPiece& p) override { return At(ctx_.plan.unit(u).padded_offset + p.begin); }

 private:
  // A bucket is a contiguous range of the padded buffer: from its lowest unit to its highest.
  void Reduce(int u) override {
    const int b = bucket_of_unit_[u];
    if (++ready_[b] < static_cast<int>(buckets_[b].size())) return;
    const UnitShardInfo &lo = ctx_.plan.unit(buckets_[b].back()), &hi = ctx_.plan.unit(buckets_[b].front());
    AverageInPlace(At(lo.padded_offset), hi.padded_offset + hi.padded - lo.padded_offset, true, 0, [this, b]() {
      for (int v : buckets_[b]) TakeNormPartials(v);
    });
  }
  std::vector<std::vector<int>> buckets_;  // unit ids per bucket, backward order
  std::vector<int> bucket_of_unit_, ready_;
};

class LastMicroReduceScatter final : public FullGradients {
 public:
  using FullGradients::FullGradients;
  // The reduced pieces sit at their unit coordinates (flat: the rank's block, where the
  // in-place reduce-scatter leaves it; per-param: copied back there from the rank-major buffer).
  const void* OwnedAt(int u, const OwnedPiece& p) override { return At(ctx_.plan.unit(u).padded_offset + p.begin); }

 private:
  void Reduce(int u) override {
    const UnitShardInfo& s = ctx_.plan.unit(u);
    if (ctx_.plan.rank_major_is_flat())
      return AverageInPlace(Full(u), s.padded, false, s.shard, [this, u]() { TakeNormPartials(u); });
    const size_t e = ctx_.elt();
    // zero-filled: the copy-in writes the real elements; the padding rows are reduced, never read
    auto rm = std::make_shared<DeviceBuffer>(ctx_.NewBuffer(MemKind::kGrads, s.padded * e, "rank-major gradient"));
    ctx_.CopyIn(u, Full(u), rm->data(), e);
    AverageInPlace(rm->data(), s.padded, false, s.shard, [this, u, rm, e]() {
      const uint8_t* own = rm->as<uint8_t>() + ctx_.rank * ctx_.plan.unit(u).shard * e;
      for (const OwnedPiece& p : ctx_.Pieces(u))
        ctx_.device->Copy(static_cast<uint8_t*>(Full(u)) + p.begin * e, own + p.shard_offset * e, (p.end - p.begin) * e);
      TakeNormPartials(u);
    });
  }
};

class EveryMicroReduceScatter final : public GradReducer {
 public:
  explicit EveryMicroReduceScatter(EngineContext* ctx)
      : GradReducer(ctx), scratch_(ctx->plan.num_units()) {
    shards_ = ctx_.NewBuffer(MemKind::kGrads, ctx_.plan.total_shard() * ctx_.elt(), "gradient shards");
  }
  void BeginStep() override {
    ctx_.device->Zero(shards_.data(), shards_.bytes());
    ZeroNormPartials();
  }
  void BeginMicroBatch(bool sync) override { sync_ = sync; }
  float* PreBackward(int u) override {
    scratch_[u] = ctx_.NewBuffer(MemKind::kGrads, ctx_.plan.unit(u).padded * sizeof(float), "fp32 gradient scratch");
    return scratch_[u].as<float>();
  }
  // Rate limit (as FSDP's): at most kMaxInflight unit gradients wait for their reduce-scatter,
  // otherwise a slow network lets every unit's full gradient pile up and stage 2's memory
  // saving is lost. One reduces while the next unit's backward computes.
  //
  // HSDP: the across-group all-reduce of a unit needs its accumulated shard, i.e. the
  // accumulate after its last reduce-scatter (a completion step) first. MPI: that completion
  // step launches it. Stream-ordered (NCCL): it is issued from the flow instead (see
  // ReduceThenAcrossGroups): right before the next unit's reduce-scatter, once the unit's has
  // retired (with the rate limit of 1, it has already), and after the last unit's (embed),
  // which waits for it. Every rank issues RS(u), [AG prefetch], AR(u), RS(u-1), ...
  void PostBackward(int u) override {
    const UnitShardInfo s = ctx_.plan.unit(u);
    const DType rd = ctx_.opt.reduce_dtype;
    while (inflight_ >= kMaxInflight) ctx_.queue.WaitOldest();
    if (ordered_) IssueAcross(kMaxInflight - 1);
    inflight_++;
    auto send = std::make_shared<DeviceBuffer>(std::move(scratch_[u]));
    if (!ctx_.plan.rank_major_is_flat()) {  // copy-in: the unit's gradient in rank-major order
      // zero-filled: the copy-in writes the real elements; the padding rows are reduced, never read
      auto rm = std::make_shared<DeviceBuffer>(
          ctx_.NewBuffer(MemKind::kGrads, s.padded * sizeof(float), "rank-major fp32 gradient"));
      ctx_.CopyIn(u, send->data(), rm->data(), sizeof(float));
      send = rm;
    }
    if (rd == DType::kBF16) {  // convert now and free the fp32 scratch at once
      auto bf = std::make_shared<DeviceBuffer>(ctx_.NewUnfilledBuffer(MemKind::kComm, s.padded * 2, "bf16 gradient"));
      ctx_.kernels().convert(send->data(), DType::kF32, bf->data(), DType::kBF16, s.padded);
      send = bf;
    }
    // the reduced shard lands in this rank's own block of the send buffer (in place)
    void* recv = send->as<uint8_t>() + ctx_.rank * s.shard * DTypeSize(rd);
    const bool last = sync_;
    if (last && ordered_) reduced_[u] = false, awaiting_.push_back(u);
    ctx_.queue.Enqueue(ctx_.comm->ReduceScatter(send->data(), recv, s.shard, rd, ReduceOp::kAvg),
                       [this, u, send, recv, rd, s, last]() mutable {
                         ctx_.kernels().accumulate(Shard(u), ctx_.opt.dtype, recv, rd, s.shard);
                         send.reset();
                         inflight_--;
                         if (!last) return;
                         if (ordered_) reduced_[u] = true;  // its all-reduce is issued by IssueAcross
                         else AcrossGroups(u);
                       });
    if (last && ordered_ && u == ParamLayout::kEmbedUnit) IssueAcross(0);  // the end of backward
  }
  const void* OwnedAt(int u, const OwnedPiece& p) override {
    return static_cast<uint8_t*>(Shard(u)) + p.shard_offset * ctx_.elt();
  }

 private:
  static constexpr int kMaxInflight = 1;
  // Stream-ordered HSDP: issues the across-group all-reduce of the oldest units whose last
  // reduce-scatter was issued, until at most `keep` wait, each after its reduce-scatter retired
  // (blocking for it if need be). How many are issued depends on counts only, never on timing.
  void IssueAcross(size_t keep) {
    while (awaiting_.size() > keep) {
      const int v = awaiting_.front();
      while (!reduced_[v]) ctx_.queue.WaitOldest();
      awaiting_.pop_front();
      AcrossGroups(v);
    }
  }
  // HSDP: the accumulated shard of unit u (every micro-batch's reduce-scatter done) averaged
  // across groups once per step, in the reduce dtype. Without HSDP the shard is final already.
  // Either way the norm's partials are taken once it is final.
  void AcrossGroups(int u) {
    if (ctx_.replica == nullptr) return TakeNormPartials(u);
    const size_t n = ctx_.plan.unit(u).shard;
    const DType d = ctx_.opt.dtype, rd = ctx_.opt.reduce_dtype;
    if (rd == d) return AverageAcrossGroups(ctx_, Shard(u), n, d, [this, u]() { TakeNormPartials(u); });
    auto tmp = std::make_shared<DeviceBuffer>(
        ctx_.NewUnfilledBuffer(MemKind::kGrads, n * DTypeSize(rd), "cross-group reduce buffer"));
    ctx_.kernels().convert(Shard(u), d, tmp->data(), rd, n);
    AverageAcrossGroups(ctx_, tmp->data(), n, rd, [this, tmp, u, n, d, rd]() {
      ctx_.kernels().convert(tmp->data(), rd, Shard(u), d, n);
      TakeNormPartials(u);
    });
  }
  void* Shard(int u) { return shards_.as<uint8_t>() + ctx_.plan.unit(u).shard_offset * ctx_.elt(); }
  DeviceBuffer shards_;  // this rank's averaged gradient slice of every unit (dtype)
  std::vector<DeviceBuffer> scratch_;
  int inflight_ = 0;
  bool sync_ = true;  // this micro-batch is the last of the step
  const bool ordered_ = StreamOrdered(ctx_);  // HSDP on stream-ordered communicators
  std::deque<int> awaiting_;                  // ordered_: units whose all-reduce is not issued yet
  std::vector<bool> reduced_ = std::vector<bool>(ctx_.plan.num_units(), false);  // ordered_: last RS retired
};

}  // namespace

GradReducer::GradReducer(EngineContext* ctx) : ctx_(*ctx), first_slot_(ctx->plan.num_units()) {
  for (int u = 0; u < ctx->plan.num_units(); u++) first_slot_[u] = num_slots_, num_slots_ += ctx->Pieces(u).size();
  slots_ = DeviceBuffer(ctx->device, nullptr, MemKind::kWorkspace, std::max<size_t>(1, num_slots_) * sizeof(double),
                        "gradient sum-of-squares partials");
}

void GradReducer::TakeNormPartials(int u) {
  double* slot = slots_.as<double>() + first_slot_[u];
  for (const OwnedPiece& p : ctx_.Pieces(u))
    ctx_.kernels().sum_squares_to(slot++, OwnedAt(u, p), ctx_.opt.dtype, p.end - p.begin);
}

void GradReducer::ZeroNormPartials() { ctx_.device->Zero(slots_.data(), slots_.bytes()); }

std::unique_ptr<GradReducer> GradReducer::Create(EngineContext* ctx) {
  if (!ctx->opt.shards_optimizer()) return std::make_unique<BucketAllReduce>(ctx);
  if (ctx->opt.keeps_full_grads()) return std::make_unique<LastMicroReduceScatter>(ctx);
  return std::make_unique<EveryMicroReduceScatter>(ctx);
}

}  // namespace shardgpt
