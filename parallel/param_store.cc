#include "parallel/param_store.h"

namespace shardgpt {

namespace {

class ReplicatedParams final : public ParamStore {
 public:
  explicit ReplicatedParams(EngineContext* ctx) : ParamStore(ctx) {
    params_ = ctx_.NewBuffer(MemKind::kParams, ctx_.plan.total_padded() * ctx_.elt(), "parameters");
  }
  const float* PreForward(int u) override { return ComputeView(u, Full(u)); }
  void PostForward(int u) override {
    if (!ctx_.is_root_unit(u)) ReleaseCompute(u);  // the root is used again by backward (gpt.h)
  }
  const float* PreBackward(int u) override { return ComputeView(u, Full(u)); }
  void PostBackward(int u) override { ReleaseCompute(u); }
  void ReleaseAll() override {
    for (int u = 0; u < ctx_.plan.num_units(); u++) ReleaseCompute(u);
  }
  void* OwnedAt(int u, const OwnedPiece& p) override {
    return static_cast<uint8_t*>(Full(u)) + p.begin * ctx_.elt();  // flat order: unit coordinates
  }
  // Stages 1/2: every rank updated only its pieces; all-gather the unit. Flat: in place (the
  // rank's shard is its block of the unit). Per-param: the pieces are copied into a rank-major
  // buffer, gathered there, and every rank's pieces copied out into the unit.
  void Publish(int u) override {
    if (!ctx_.opt.shards_optimizer()) return;
    const UnitShardInfo& s = ctx_.plan.unit(u);
    const size_t e = ctx_.elt();
    if (ctx_.plan.rank_major_is_flat()) {
      void* own = static_cast<uint8_t*>(Full(u)) + ctx_.rank * s.shard * e;
      ctx_.queue.Enqueue(ctx_.comm->AllGather(own, Full(u), s.shard, ctx_.opt.dtype), nullptr);
      return;
    }
    auto rm = std::make_shared<DeviceBuffer>(
        ctx_.NewBuffer(MemKind::kParams, s.padded * e, "rank-major parameters of unit " + ctx_.layout.units()[u].name));
    uint8_t* own = rm->as<uint8_t>() + ctx_.rank * s.shard * e;
    for (const OwnedPiece& p : ctx_.Pieces(u))
      ctx_.device->Copy(own + p.shard_offset * e, OwnedAt(u, p), (p.end - p.begin) * e);
    ctx_.queue.Enqueue(ctx_.comm->AllGather(own, rm->data(), s.shard, ctx_.opt.dtype),
                       [this, u, rm, e]() { ctx_.CopyOut(u, rm->data(), Full(u), e); });
  }

 private:
  void* Full(int u) { return params_.as<uint8_t>() + ctx_.plan.unit(u).padded_offset * ctx_.elt(); }
  DeviceBuffer params_;  // every unit, padded (dtype)
};

class ShardedParams final : public ParamStore {
 public:
  explicit ShardedParams(EngineContext* ctx)
      : ParamStore(ctx),
        gathered_(ctx->plan.num_units()),
        rank_major_(ctx->plan.num_units()),
        gather_work_(ctx->plan.num_units()) {
    shards_ = ctx_.NewBuffer(MemKind::kParams, ctx_.plan.total_shard() * ctx_.elt(), "parameter shards");
  }
  const float* PreForward(int u) override {
    Gathered(u);
    const int next = u + 1;  // forward order: embed, blocks, final
    if (next < ctx_.plan.num_units() && gathered_[next].empty()) Gather(next);
    return ComputeView(u, gathered_[u].data());
  }
  void PostForward(int u) override {
    if (ctx_.is_root_unit(u) || !ctx_.opt.reshard_after_forward) return;
    Release(u);
  }
  const float* PreBackward(int u) override {
    Gathered(u);
    // backward order: final, blocks L..1, embed; embed stays gathered from forward (the tied
    // LM head reads it at the start of backward)
    const int next = u - 1;
    if (next >= 1 && gathered_[next].empty()) Gather(next);
    return ComputeView(u, gathered_[u].data());
  }
  void PostBackward(int u) override { Release(u); }
  void ReleaseAll() override {
    for (int u = 0; u < ctx_.plan.num_units(); u++) Release(u);
  }
  void* OwnedAt(int u, const OwnedPiece& p) override { return Shard(u) + p.shard_offset * ctx_.elt(); }

 private:
  uint8_t* Shard(int u) { return shards_.as<uint8_t>() + ctx_.plan.unit(u).shard_offset * ctx_.elt(); }
  // Flat: all-gather straight into the unit. Per-param: into a rank-major buffer, copied out
  // into the unit once the gather is complete (WaitGather).
  void Gather(int u) {
    const UnitShardInfo& s = ctx_.plan.unit(u);
    const std::string& name = ctx_.layout.units()[u].name;
    // Flat: the all-gather writes every element, padding included, so no zero-fill. Per-param:
    // the copy-out writes the real elements only; the padding stays zero.
    const bool flat = ctx_.plan.rank_major_is_flat();
    const std::string what = "gathered parameters of unit " + name;
    gathered_[u] = flat ? ctx_.NewUnfilledBuffer(MemKind::kParams, s.padded * ctx_.elt(), what)
                        : ctx_.NewBuffer(MemKind::kParams, s.padded * ctx_.elt(), what);
    void* dst = gathered_[u].data();
    if (!flat) {
      rank_major_[u] =
          ctx_.NewUnfilledBuffer(MemKind::kParams, s.padded * ctx_.elt(), "rank-major parameters of unit " + name);
      dst = rank_major_[u].data();
    }
    SetFlightUnit(u);  // a prefetch belongs to the unit it gathers
    gather_work_[u] = ctx_.comm->AllGather(Shard(u), dst, s.shard, ctx_.opt.dtype);
  }
  // Unit u gathered and its all-gather complete.
  void Gathered(int u) {
    ctx_.queue.RetireCompleted();
    if (gathered_[u].empty()) Gather(u);
    WaitGather(u);
  }
  void WaitGather(int u) {
    if (gather_work_[u] == nullptr) return;
    ctx_.queue.WaitStream(*gather_work_[u]);  // the unit's kernels run after the gather
    gather_work_[u].reset();
    if (!rank_major_[u].empty()) {
      ctx_.CopyOut(u, rank_major_[u].data(), gathered_[u].data(), ctx_.elt());
      rank_major_[u].Free();
    }
  }
  void Release(int u) {
    ReleaseCompute(u);
    WaitGather(u);
    gathered_[u].Free();
  }
  DeviceBuffer shards_;                            // this rank's slice of every unit (dtype)
  std::vector<DeviceBuffer> gathered_;             // per unit: full padded parameters while in use
  std::vector<DeviceBuffer> rank_major_;           // per unit (per-param): the all-gather's buffer
  std::vector<std::shared_ptr<Work>> gather_work_;  // in-flight all-gather into gathered_[u]
};

}  // namespace

ParamStore::ParamStore(EngineContext* ctx) : ctx_(*ctx), compute_(ctx->plan.num_units()) {}

std::unique_ptr<ParamStore> ParamStore::Create(EngineContext* ctx) {
  if (ctx->opt.shards_params()) return std::make_unique<ShardedParams>(ctx);
  return std::make_unique<ReplicatedParams>(ctx);
}

const float* ParamStore::ComputeView(int u, const void* full) {
  if (ctx_.opt.dtype == DType::kF32) return static_cast<const float*>(full);
  DeviceBuffer& c = compute_[u];
  if (c.empty()) {
    const size_t n = ctx_.plan.unit(u).padded;
    // unfilled: the conversion writes all n
    c = ctx_.NewUnfilledBuffer(MemKind::kParams, n * sizeof(float),
                               "fp32 compute copy of unit " + ctx_.layout.units()[u].name);
    ctx_.kernels().convert(full, DType::kBF16, c.data(), DType::kF32, n);
    ctx_.kernels().note_bf16_source(c.as<float>(), full, n);  // the matmuls may read `full` itself
  }
  return c.as<float>();
}

}  // namespace shardgpt
