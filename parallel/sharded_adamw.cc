#include "parallel/sharded_adamw.h"

#include <algorithm>

namespace shardgpt {

namespace {
size_t OwnedElements(const EngineContext& ctx) {
  return ctx.opt.shards_optimizer() ? ctx.plan.total_shard() : ctx.plan.total_padded();
}
}  // namespace

ShardedAdamW::ShardedAdamW(EngineContext* ctx) : ctx_(*ctx), skip_(ctx->plan.num_units()) {
  const size_t n = OwnedElements(ctx_) * sizeof(float);
  if (ctx_.opt.dtype == DType::kBF16) master_ = ctx_.NewBuffer(MemKind::kOptimizer, n, "fp32 master weights");
  m_ = ctx_.NewBuffer(MemKind::kOptimizer, n, "AdamW first moments");
  v_ = ctx_.NewBuffer(MemKind::kOptimizer, n, "AdamW second moments");
  if (ctx_.opt.dtype == DType::kBF16) {
    size_t largest = 0;
    for (int u = 0; u < ctx_.plan.num_units(); u++) largest = std::max(largest, ctx_.plan.unit(u).padded);
    grad32_ = DeviceBuffer(ctx_.device, nullptr, MemKind::kGrads, largest * sizeof(float), "fp32 gradient slice");
  }
}

ShardedAdamW::Slice ShardedAdamW::Owned(int u, void* stored) {
  const UnitShardInfo& s = ctx_.plan.unit(u);
  const bool sharded = ctx_.opt.shards_optimizer();
  const size_t off = sharded ? s.shard_offset : s.padded_offset;
  Slice sl;
  sl.begin = sharded ? ctx_.plan.OwnedBegin(u, ctx_.rank) : 0;
  sl.end = sharded ? ctx_.plan.OwnedEnd(u, ctx_.rank) : s.numel;
  sl.master = ctx_.opt.dtype == DType::kBF16 ? master_.as<float>() + off : static_cast<float*>(stored);
  sl.m = m_.as<float>() + off;
  sl.v = v_.as<float>() + off;
  return sl;
}

void ShardedAdamW::Update(int u, const void* grads, void* stored, float lr, float grad_scale, int64_t t) {
  const Slice sl = Owned(u, stored);
  const size_t n = sl.end - sl.begin;
  const float* g = static_cast<const float*>(grads);
  if (ctx_.opt.dtype == DType::kBF16) {
    ctx_.kernels().convert(grads, DType::kBF16, grad32_.data(), DType::kF32, n);
    g = grad32_.as<float>();
  }
  for (const DecayRange& r : ctx_.layout.DecayRanges(u, sl.begin, sl.end)) {
    // [r.begin, r.end) minus the skipped ranges, in order
    size_t at = r.begin;
    auto run = [&](size_t b, size_t e) {
      if (b >= e) return;
      const size_t i = b - sl.begin;
      ctx_.kernels().adamw(sl.master + i, g + i, sl.m + i, sl.v + i, e - b, lr,
                           r.decay ? ctx_.opt.adamw.weight_decay : 0.0f, ctx_.opt.adamw, t, grad_scale);
    };
    for (const auto& [sb, se] : skip_[u]) {
      if (se <= at || sb >= r.end) continue;
      run(at, std::min(sb, r.end));
      at = std::max(at, se);
    }
    run(at, r.end);
  }
  StoreFromMaster(u, stored);
}

void ShardedAdamW::StoreFromMaster(int u, void* stored) {
  if (ctx_.opt.dtype == DType::kF32) return;  // the stored parameters are the master
  const Slice sl = Owned(u, stored);
  ctx_.kernels().convert(sl.master, DType::kF32, stored, ctx_.opt.dtype, sl.end - sl.begin);
}

void ShardedAdamW::ResetMoments() {
  ctx_.device->Zero(m_.data(), m_.bytes());
  ctx_.device->Zero(v_.data(), v_.bytes());
}

}  // namespace shardgpt
