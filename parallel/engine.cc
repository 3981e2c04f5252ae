#include "parallel/engine.h"

#include <cmath>
#include <vector>

namespace shardgpt {

StatusOr<std::unique_ptr<Engine>> Engine::Create(const ParamLayout& layout, Communicator* comm,
                                                 const EngineOptions& options, Device& device) {
  SHARDGPT_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<Engine>(new Engine(layout, comm, options, device));
}

Engine::Engine(const ParamLayout& layout, Communicator* comm, const EngineOptions& options, Device& device)
    : ctx_(layout, comm, &device, options),
      params_(ParamStore::Create(&ctx_)),
      grads_(GradReducer::Create(&ctx_)),
      adamw_(&ctx_) {}

Engine::~Engine() { ctx_.queue.WaitAll(); }

// ---- UnitHooks: the model calls these around each unit ----

const float* Engine::PreForward(int u) {
  ctx_.queue.RetireCompleted();
  return params_->PreForward(u);
}

void Engine::PostForward(int u) { params_->PostForward(u); }

UnitBuffers Engine::PreBackward(int u) {
  ctx_.queue.RetireCompleted();
  UnitBuffers b;
  b.params = params_->PreBackward(u);
  b.grads = grads_->PreBackward(u);
  return b;
}

void Engine::PostBackward(int u) {
  grads_->PostBackward(u);
  params_->PostBackward(u);
  ctx_.queue.RetireCompleted();
  if (u == ParamLayout::kEmbedUnit && sync_micro_)  // the end of the last backward
    report_.buckets_done_during_backward = ctx_.queue.CompletedCount();
}

// ---- step ----

void Engine::ReleaseAll() { params_->ReleaseAll(); }

void Engine::BeginStep() {
  ctx_.queue.WaitAll();
  grads_->BeginStep();
  ctx_.comm->ledger().Reset();
  ctx_.memory.ResetPeaks();
  ctx_.queue.ResetCounters();
  busy_at_step_begin_ = ctx_.comm->busy_seconds();
}

void Engine::BeginMicroBatch(int micro, int num_micro) {
  sync_micro_ = micro == num_micro - 1;
  grads_->BeginMicroBatch(sync_micro_);
}

float Engine::Step(float lr, float grad_clip) {
  ctx_.queue.WaitAll();
  report_.backward_exposed_s = ctx_.queue.exposed_seconds();
  // Global gradient norm: every element counted once. Stage 0 holds the whole averaged
  // gradient on every rank; stages >= 1 sum their owned slices' squares over ranks.
  double ss = 0;
  for (int u = 0; u < ctx_.plan.num_units(); u++)
    for (const OwnedPiece& p : ctx_.Pieces(u))
      ss += ctx_.kernels().sum_squares(grads_->OwnedAt(u, p), ctx_.opt.dtype, p.end - p.begin);
  if (ctx_.opt.shards_optimizer()) ss = ctx_.comm->AllReduceScalar(ss, ReduceOp::kSum);
  const float norm = static_cast<float>(std::sqrt(ss));
  const float scale = (grad_clip > 0 && norm > grad_clip) ? grad_clip / (norm + 1e-6f) : 1.0f;

  t_++;
  for (int u = 0; u < ctx_.plan.num_units(); u++) {
    for (const OwnedPiece& p : ctx_.Pieces(u)) adamw_.Update(u, p, grads_->OwnedAt(u, p), params_->OwnedAt(u, p), lr, scale, t_);
    params_->Publish(u);
  }
  ctx_.queue.WaitAll();

  const MemoryLedger& m = ctx_.memory;
  report_.comm = ctx_.comm->ledger();
  report_.params_bytes = m.current(MemKind::kParams);
  report_.grads_bytes = m.current(MemKind::kGrads);
  report_.optimizer_bytes = m.current(MemKind::kOptimizer);
  report_.model_state_bytes = m.Total();
  report_.peak_grads_bytes = m.peak(MemKind::kGrads);
  report_.peak_params_bytes = m.peak(MemKind::kParams);
  report_.exposed_comm_s = ctx_.queue.exposed_seconds();
  report_.comm_busy_s = ctx_.comm->busy_seconds() - busy_at_step_begin_;
  return norm;
}

// ---- whole-model parameters in host memory ----

std::vector<Engine::OwnedState> Engine::OwnedPieces(int u) {
  std::vector<OwnedState> out;
  for (const OwnedPiece& p : ctx_.Pieces(u)) out.push_back(adamw_.Owned(u, p, params_->OwnedAt(u, p)));
  return out;
}

void Engine::StoreAndPublish(int u) {
  for (const OwnedPiece& p : ctx_.Pieces(u)) adamw_.StoreFromMaster(u, p, params_->OwnedAt(u, p));
  params_->Publish(u);
}

void Engine::LoadFullParams(const float* full) {
  ctx_.queue.WaitAll();
  for (int u = 0; u < ctx_.plan.num_units(); u++) {
    const float* src = full + ctx_.layout.units()[u].offset;
    for (const OwnedState& st : OwnedPieces(u))
      ctx_.device->CopyToDevice(st.master, src + st.begin, (st.end - st.begin) * sizeof(float));
    StoreAndPublish(u);
  }
  adamw_.ResetMoments();
  ctx_.queue.WaitAll();
  t_ = 0;
}

void Engine::InitOwned(uint64_t seed) {
  ctx_.queue.WaitAll();
  std::vector<float> slice;
  for (int u = 0; u < ctx_.plan.num_units(); u++) {
    for (const OwnedState& st : OwnedPieces(u)) {
      slice.resize(st.end - st.begin);
      InitParameterRange(ctx_.layout, seed, u, st.begin, st.end, slice.data());
      ctx_.device->CopyToDevice(st.master, slice.data(), slice.size() * sizeof(float));
    }
    StoreAndPublish(u);
  }
  adamw_.ResetMoments();
  ctx_.queue.WaitAll();
  t_ = 0;
}

void Engine::SyncParamsFromMaster() {
  ctx_.queue.WaitAll();
  for (int u = 0; u < ctx_.plan.num_units(); u++) StoreAndPublish(u);
  ctx_.queue.WaitAll();
}

void Engine::GatherFullParams(float* out) {
  ctx_.queue.WaitAll();
  for (int u = 0; u < ctx_.plan.num_units(); u++) {
    const UnitShardInfo& s = ctx_.plan.unit(u);
    const std::vector<OwnedState> pieces = OwnedPieces(u);
    float* dst = out + ctx_.layout.units()[u].offset;
    if (!ctx_.opt.shards_optimizer()) {
      ctx_.device->CopyToHost(dst, pieces[0].master, s.numel * sizeof(float));
      continue;
    }
    // The master pieces in rank-major order, all-gathered, then in flat order (copy-out).
    DeviceBuffer full(ctx_.device, nullptr, MemKind::kParams, s.padded * sizeof(float), "gathered master weights");
    float* own = full.as<float>() + ctx_.rank * s.shard;
    const std::vector<OwnedPiece>& owned = ctx_.Pieces(u);
    for (size_t i = 0; i < owned.size(); i++)
      ctx_.device->Copy(own + owned[i].shard_offset, pieces[i].master, (owned[i].end - owned[i].begin) * sizeof(float));
    ctx_.comm->AllGather(own, full.data(), s.shard, DType::kF32)->Wait();
    if (!ctx_.plan.rank_major_is_flat()) {
      DeviceBuffer flat(ctx_.device, nullptr, MemKind::kParams, s.padded * sizeof(float), "gathered master weights");
      ctx_.CopyOut(u, full.data(), flat.data(), sizeof(float));
      full = std::move(flat);
    }
    ctx_.device->CopyToHost(dst, full.data(), s.numel * sizeof(float));
  }
}

}  // namespace shardgpt
