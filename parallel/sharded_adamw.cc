#include "parallel/sharded_adamw.h"

#include <algorithm>

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
  const DType d = ctx_.opt.dtype;
  const size_t e = DTypeSize(d);
  // One pass per run: the gradient read in dtype, the stored parameters written beside the
  // master (adamw_mixed). The piece's elements outside every run (Muon's, which ShardedMuon
  // updated in the master already, and padding) are stored from the master here.
  size_t at = p.begin;
  for (const Run& r : runs_[u]) {
    if (r.begin < p.begin || r.begin >= p.end) continue;  // another piece's run
    if (r.begin > at) StoreRange(sl, stored, at - p.begin, r.begin - at);
    at = r.end;
    const size_t i = r.begin - p.begin;
    const float wd = r.decay ? ctx_.opt.adamw.weight_decay : 0.0f;
    ctx_.kernels().adamw_mixed(sl.master + i, static_cast<uint8_t*>(stored) + i * e, d,
                               static_cast<const uint8_t*>(grads) + i * e, d, sl.m + i, v_.as<float>() + r.vpos,
                               r.end - r.begin, lr, wd, ctx_.opt.adamw, t, grad_scale_dev, grad_scale);
  }
  if (at < p.end) StoreRange(sl, stored, at - p.begin, p.end - at);
}

void ShardedAdamW::StoreRange(const Slice& sl, void* stored, size_t i, size_t n) {
  if (ctx_.opt.dtype == DType::kF32) return;  // the stored parameters are the master
  ctx_.kernels().convert(sl.master + i, DType::kF32, static_cast<uint8_t*>(stored) + i * DTypeSize(ctx_.opt.dtype),
                         ctx_.opt.dtype, n);
}

void ShardedAdamW::StoreFromMaster(int u, const OwnedPiece& p, void* stored) {
  StoreRange(Owned(u, p, stored), stored, 0, p.end - p.begin);
}

void ShardedAdamW::ResetMoments() {
  v_view_.Free();
  ctx_.device->Zero(m_.data(), m_.bytes());
  ctx_.device->Zero(v_.data(), v_.bytes());
}

}  // namespace shardgpt
