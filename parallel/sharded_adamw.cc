#include "parallel/sharded_adamw.h"

#include <algorithm>

#include "parallel/memory_model.h"
#include "parallel/muon_plan.h"

namespace shardgpt {

namespace {
size_t OwnedElements(const EngineContext& ctx) {
  return ctx.opt.shards_optimizer() ? ctx.plan.total_shard() : ctx.plan.total_padded();
}
// [b, e) minus the sorted ranges `skip`, as runs passed to f(begin, end).
template <typename F>
void Subtract(size_t b, size_t e, const std::vector<std::pair<size_t, size_t>>& skip, F f) {
  size_t at = b;
  for (const auto& [sb, se] : skip) {
    if (se <= at || sb >= e) continue;
    if (sb > at) f(at, std::min(sb, e));
    at = std::max(at, se);
  }
  if (at < e) f(at, e);
}
}  // namespace

size_t ShardedAdamW::StateOffset(int u, const OwnedPiece& p) const {
  const UnitShardInfo& s = ctx_.plan.unit(u);
  // stage >= 1: state in shard order; stage 0: in flat order over the whole unit
  return ctx_.opt.shards_optimizer() ? s.shard_offset + p.shard_offset : s.padded_offset + p.begin;
}

ShardedAdamW::ShardedAdamW(EngineContext* ctx) : ctx_(*ctx), runs_(ctx->plan.num_units()) {
  const bool sharded = ctx_.opt.shards_optimizer();
  packed_ = ctx_.opt.optimizer == OptimizerKind::kMuon;
  std::vector<std::vector<std::pair<size_t, size_t>>> skip(ctx_.plan.num_units());
  if (packed_) {
    MuonPlan mp(ctx_.layout, ctx_.plan, !sharded, ctx_.opt.muon.ns_steps);
    for (int u = 0; u < ctx_.plan.num_units(); u++) skip[u] = mp.muon_ranges(u);
  }
  size_t vpos = 0;
  for (int u = 0; u < ctx_.plan.num_units(); u++)
    for (const OwnedPiece& p : ctx_.Pieces(u))
      for (const DecayRange& r : ctx_.layout.DecayRanges(u, p.begin, p.end))
        Subtract(r.begin, r.end, skip[u], [&](size_t b, size_t e) {
          const size_t at = StateOffset(u, p) + (b - p.begin);
          // unpacked: v sits beside m (same index); packed: runs follow one another
          runs_[u].push_back(Run{b, e, at, packed_ ? vpos : at, r.decay});
          vpos += e - b;
        });
  const size_t n = OwnedElements(ctx_) * sizeof(float);
  if (ctx_.opt.dtype == DType::kBF16) master_ = ctx_.NewBuffer(MemKind::kOptimizer, n, "fp32 master weights");
  m_ = ctx_.NewBuffer(MemKind::kOptimizer, n, packed_ ? "AdamW first moments / Muon momentum" : "AdamW first moments");
  v_ = ctx_.NewBuffer(MemKind::kOptimizer, packed_ ? vpos * sizeof(float) : n, "AdamW second moments");
  // bf16: the fp32 widening of one unit's owned gradient slice at a time (a shard at stages
  // >= 1, not a whole unit: for a tied 50257-row embedding that is the difference)
  const size_t ws = static_cast<size_t>(OptimizerWorkspaceBytes(ctx_.plan, ctx_.opt));
  if (ws > 0) grad32_ = ctx_.NewBuffer(MemKind::kWorkspace, ws, "fp32 gradient slice");
}

ShardedAdamW::Slice ShardedAdamW::Owned(int u, const OwnedPiece& p, void* stored, bool with_v) {
  const size_t off = StateOffset(u, p);
  Slice sl;
  sl.begin = p.begin;
  sl.end = p.end;
  sl.master = ctx_.opt.dtype == DType::kBF16 ? master_.as<float>() + off : static_cast<float*>(stored);
  sl.m = m_.as<float>() + off;
  if (!packed_) {
    sl.v = v_.as<float>() + off;
  } else if (with_v) {
    if (v_view_.data() == nullptr) {  // unpack: zeros at the Muon elements
      v_view_ = DeviceBuffer(ctx_.device, nullptr, MemKind::kOptimizer, OwnedElements(ctx_) * sizeof(float),
                             "unpacked AdamW second moments (checkpoint)");
      ctx_.device->Zero(v_view_.data(), v_view_.bytes());
      for (int w = 0; w < ctx_.plan.num_units(); w++)
        for (const Run& r : runs_[w])
          ctx_.device->Copy(v_view_.as<float>() + r.at, v_.as<float>() + r.vpos, (r.end - r.begin) * sizeof(float));
    }
    sl.v = v_view_.as<float>() + off;
  }
  return sl;
}

void ShardedAdamW::CommitV() {
  if (!packed_ || v_view_.data() == nullptr) return;
  for (int w = 0; w < ctx_.plan.num_units(); w++)
    for (const Run& r : runs_[w])
      ctx_.device->Copy(v_.as<float>() + r.vpos, v_view_.as<float>() + r.at, (r.end - r.begin) * sizeof(float));
  v_view_.Free();
}

void ShardedAdamW::Update(int u, const OwnedPiece& p, const void* grads, void* stored, float lr, float grad_scale,
                          int64_t t, const float* grad_scale_dev) {
  v_view_.Free();  // an unpacked copy goes stale now
  const Slice sl = Owned(u, p, stored);
  const size_t n = sl.end - sl.begin;
  const float* g = static_cast<const float*>(grads);
  if (ctx_.opt.dtype == DType::kBF16) {
    ctx_.kernels().convert(grads, DType::kBF16, grad32_.data(), DType::kF32, n);
    g = grad32_.as<float>();
  }
  for (const Run& r : runs_[u]) {
    if (r.begin < p.begin || r.begin >= p.end) continue;  // another piece's run
    const size_t i = r.begin - p.begin;
    const float wd = r.decay ? ctx_.opt.adamw.weight_decay : 0.0f;
    if (grad_scale_dev)
      ctx_.kernels().adamw_dev(sl.master + i, g + i, sl.m + i, v_.as<float>() + r.vpos, r.end - r.begin, lr, wd,
                               ctx_.opt.adamw, t, grad_scale_dev);
    else
      ctx_.kernels().adamw(sl.master + i, g + i, sl.m + i, v_.as<float>() + r.vpos, r.end - r.begin, lr, wd,
                           ctx_.opt.adamw, t, grad_scale);
  }
  StoreFromMaster(u, p, stored);
}

void ShardedAdamW::StoreFromMaster(int u, const OwnedPiece& p, void* stored) {
  if (ctx_.opt.dtype == DType::kF32) return;  // the stored parameters are the master
  const Slice sl = Owned(u, p, stored);
  ctx_.kernels().convert(sl.master, DType::kF32, stored, ctx_.opt.dtype, sl.end - sl.begin);
}

void ShardedAdamW::ResetMoments() {
  v_view_.Free();
  ctx_.device->Zero(m_.data(), m_.bytes());
  ctx_.device->Zero(v_.data(), v_.bytes());
}

}  // namespace shardgpt
