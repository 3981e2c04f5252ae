#include "parallel/sharded_adamw.h"

#include <algorithm>

namespace shardgpt {

namespace {
size_t OwnedElements(const EngineContext& ctx) {
  return ctx.opt.shards_optimizer() ? ctx.plan.total_shard() : ctx.plan.total_padded();
}
}  // namespace

ShardedAdamW::ShardedAdamW(EngineContext* ctx) : ctx_(*ctx) {
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

ShardedAdamW::Slice ShardedAdamW::Owned(int u, const OwnedPiece& p, void* stored) {
  const UnitShardInfo& s = ctx_.plan.unit(u);
  // stage >= 1: state in shard order; stage 0: in flat order over the whole unit
  const size_t off = ctx_.opt.shards_optimizer() ? s.shard_offset + p.shard_offset : s.padded_offset + p.begin;
  Slice sl;
  sl.begin = p.begin;
  sl.end = p.end;
  sl.master = ctx_.opt.dtype == DType::kBF16 ? master_.as<float>() + off : static_cast<float*>(stored);
  sl.m = m_.as<float>() + off;
  sl.v = v_.as<float>() + off;
  return sl;
}

void ShardedAdamW::Update(int u, const OwnedPiece& p, const void* grads, void* stored, float lr, float grad_scale,
                          int64_t t) {
  const Slice sl = Owned(u, p, stored);
  const size_t n = sl.end - sl.begin;
  const float* g = static_cast<const float*>(grads);
  if (ctx_.opt.dtype == DType::kBF16) {
    ctx_.kernels().convert(grads, DType::kBF16, grad32_.data(), DType::kF32, n);
    g = grad32_.as<float>();
  }
  for (const DecayRange& r : ctx_.layout.DecayRanges(u, sl.begin, sl.end)) {
    const size_t i = r.begin - sl.begin;
    ctx_.kernels().adamw(sl.master + i, g + i, sl.m + i, sl.v + i, r.end - r.begin, lr,
                         r.decay ? ctx_.opt.adamw.weight_decay : 0.0f, ctx_.opt.adamw, t, grad_scale);
  }
  StoreFromMaster(u, p, stored);
}

void ShardedAdamW::StoreFromMaster(int u, const OwnedPiece& p, void* stored) {
  if (ctx_.opt.dtype == DType::kF32) return;  // the stored parameters are the master
  const Slice sl = Owned(u, p, stored);
  ctx_.kernels().convert(sl.master, DType::kF32, stored, ctx_.opt.dtype, sl.end - sl.begin);
}

void ShardedAdamW::ResetMoments() {
  ctx_.device->Zero(m_.data(), m_.bytes());
  ctx_.device->Zero(v_.data(), v_.bytes());
}

}  // namespace shardgpt
