#include "parallel/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace shardgpt {

StatusOr<std::unique_ptr<Engine>> Engine::Create(const ParamLayout& layout, Communicator* comm,
                                                 const EngineOptions& options, Device& device) {
  SHARDGPT_RETURN_IF_ERROR(options.Validate());
  auto G = options.ShardGroupSize(comm->world_size());
  if (!G.ok()) return G.status();
  std::unique_ptr<Communicator> shard, replica;
  if (G.value() < comm->world_size()) {
    // consecutive ranks form a group (one node under the usual by-slot placement); the
    // replica group of a rank is the ranks with its index in the other groups
    const int g = G.value(), r = comm->rank();
    auto s = comm->Split(r / g, r);
    if (!s.ok()) return s.status();
    auto x = comm->Split(r % g, r);
    if (!x.ok()) return x.status();
    shard = std::move(s.value()), replica = std::move(x.value());
    if (FlightRing* ring = shard->flight_ring()) ring->SetName("shard");
    if (FlightRing* ring = replica->flight_ring()) ring->SetName("replica");
  }
  return std::unique_ptr<Engine>(new Engine(layout, comm, std::move(shard), std::move(replica), options, device));
}

Engine::Engine(const ParamLayout& layout, Communicator* world, std::unique_ptr<Communicator> shard,
               std::unique_ptr<Communicator> replica, const EngineOptions& options, Device& device)
    : world_(world),
      own_shard_(std::move(shard)),
      own_replica_(std::move(replica)),
      ctx_(layout, own_shard_ ? own_shard_.get() : world, &device, options, own_replica_.get()),
      params_(ParamStore::Create(&ctx_)),
      grads_(GradReducer::Create(&ctx_)),
      adamw_(&ctx_) {
  if (options.optimizer == OptimizerKind::kMuon) muon_ = std::make_unique<ShardedMuon>(&ctx_);
  ss_ = DeviceBuffer(&device, nullptr, MemKind::kWorkspace, sizeof(double), "gradient sum of squares");
  gathered_ = DeviceBuffer(&device, nullptr, MemKind::kWorkspace, world->world_size() * sizeof(double),
                           "per-rank step scalars");
  clip_ = DeviceBuffer(&device, nullptr, MemKind::kWorkspace, 2 * sizeof(float), "gradient norm and clip factor");
}

Engine::~Engine() {
  ctx_.queue.WaitAll();
  CloseWeightReuse();
}

// The weight reuse window (Kernels::begin_weight_reuse): open from a step's first micro-batch
// until anything can write parameters. Where the matmuls read the one persistent parameter
// buffer (stages 0-2, fp32 storage), a weight converted once serves the whole step. With bf16
// storage (every stage) each unit's fp32 compute copy is noted as the widening of the stored
// bf16 parameters (ParamStore::ComputeView), which the matmuls then read directly; compute
// copies and stage 3's gathered units are freed and reused for other units, but what a kernel
// set derived from memory is forgotten when that memory is freed. Not at stage 3 with fp32
// storage: there a copy would be made per gathered unit, kept for the step (2 bytes per
// parameter: the memory stage 3 is there to save) or made again after every gather. The
// window belongs to the device, which engines may share: every engine closes it before it
// writes parameters, and one that cannot reuse closes it when its micro-batch begins.
bool Engine::WeightsReusable() const { return ctx_.opt.dtype == DType::kBF16 || !ctx_.opt.shards_params(); }

void Engine::CloseWeightReuse() { ctx_.kernels().end_weight_reuse(); }

// ---- UnitHooks: the model calls these around each unit ----

const float* Engine::PreForward(int u) {
  SetFlightPhase(FlightPhase::kForward, u);
  SetFlightUnit(u);
  ctx_.queue.RetireCompleted();
  return params_->PreForward(u);
}

void Engine::PostForward(int u) { params_->PostForward(u); }

UnitBuffers Engine::PreBackward(int u) {
  SetFlightPhase(FlightPhase::kBackward, u);
  SetFlightUnit(u);
  ctx_.queue.RetireCompleted();
  if (!in_backward_) {  // the forward of this micro-batch ended
    in_backward_ = true;
    report_.forward_wait_s += ctx_.queue.exposed_seconds() - phase_mark_s_;
    phase_mark_s_ = ctx_.queue.exposed_seconds();
  }
  UnitBuffers b;
  b.params = params_->PreBackward(u);
  b.grads = grads_->PreBackward(u);
  return b;
}

void Engine::PostBackward(int u) {
  SetFlightUnit(u);  // the reduction it may issue (a bucket: the unit that completed it)
  grads_->PostBackward(u);
  params_->PostBackward(u);
  ctx_.queue.RetireCompleted();
  if (u == ParamLayout::kEmbedUnit) {  // the end of this micro-batch's backward
    in_backward_ = false;
    report_.backward_wait_s += ctx_.queue.exposed_seconds() - phase_mark_s_;
    phase_mark_s_ = ctx_.queue.exposed_seconds();
    if (sync_micro_) report_.buckets_done_during_backward = ctx_.queue.CompletedCount();
  }
}

// ---- step ----

void Engine::ReleaseAll() { params_->ReleaseAll(); }

void Engine::BeginStep() {
  ctx_.queue.WaitAll();
  CloseWeightReuse();
  grads_->BeginStep();
  ctx_.comm->ledger().Reset();
  if (ctx_.replica) ctx_.replica->ledger().Reset();
  ctx_.memory.ResetPeaks();
  ctx_.queue.ResetCounters();
  busy_at_step_begin_ = CommBusySeconds();
  report_.forward_wait_s = report_.backward_wait_s = report_.after_backward_wait_s = 0;
  in_backward_ = false, phase_mark_s_ = 0;
}

void Engine::BeginMicroBatch(int micro, int num_micro) {
  SetFlightMicro(micro);
  sync_micro_ = micro == num_micro - 1;
  in_backward_ = false, phase_mark_s_ = ctx_.queue.exposed_seconds();
  grads_->BeginMicroBatch(sync_micro_);
  if (!WeightsReusable()) {
    CloseWeightReuse();
  } else if (micro == 0) {
    ctx_.queue.WaitAll();  // no publish of the last step still writing parameters (BeginStep waited already)
    ctx_.kernels().begin_weight_reuse();
  }
}

// Global gradient norm: every element counted once. Stage 0 holds the whole averaged gradient
// on every rank; stages >= 1 sum their owned slices' squares over ranks. The per-piece sums of
// squares were taken by the GradReducer as each unit's reduction completed; here they are
// added in piece order (sum_f64: 0 + s0 + s1 + ..., one fixed order).
float Engine::HostNormAndScale(float grad_clip, float* scale) {
  double ss = 0;
  ctx_.kernels().sum_f64(ss_.as<double>(), grads_->norm_partials(), grads_->num_norm_partials(), 1.0);
  ctx_.device->CopyToHost(&ss, ss_.data(), sizeof(double));
  if (ctx_.opt.shards_optimizer()) ss = ctx_.comm->AllReduceScalar(ss, ReduceOp::kSum);
  const float norm = static_cast<float>(std::sqrt(ss));
  *scale = (grad_clip > 0 && norm > grad_clip) ? grad_clip / (norm + 1e-6f) : 1.0f;
  return norm;
}

void Engine::SumOverRanks(Communicator& comm, double* value, double divisor) {
  const int W = comm.world_size();
  if (W > 1) {
    double* all = gathered_.as<double>();
    CommLedger& ledger = comm.ledger();
    const CommLedger::Counter before = ledger[CollKind::kAllGather];
    std::shared_ptr<Work> work = comm.AllGather(value, all, sizeof(double) / sizeof(float), DType::kF32);
    ledger.kinds[static_cast<size_t>(CollKind::kAllGather)] = before;  // control traffic, not the model's
    ledger.AddControl(sizeof(double));
    ctx_.queue.WaitStream(*work);  // the sum below runs after the gather (a host wait on host backends)
    ctx_.kernels().sum_f64(value, all, W, divisor);
  } else if (divisor != 1.0) {
    ctx_.kernels().sum_f64(value, value, 1, divisor);
  }
}

float Engine::Step(float lr, float grad_clip) {
  StepDeferred(lr, grad_clip);
  float norm = 0;
  ctx_.device->CopyToHost(&norm, device_norm(), sizeof(float));
  return norm;
}

void Engine::StepDeferred(float lr, float grad_clip) {
  CloseWeightReuse();  // the optimizer writes the parameters
  const double at_step = ctx_.queue.exposed_seconds();
  SetFlightPhase(FlightPhase::kGradSync);
  SetFlightUnit(-1);
  ctx_.queue.WaitAll();
  SetFlightPhase(FlightPhase::kOptimizer);
  // A GPU keeps the norm and the clip factor on the device (no host wait); the CPU computes
  // them on the host, as it always has (its results must not change by a bit).
  const bool on_device = ctx_.device->is_cuda();
  float scale = 1.0f;
  const float* scale_dev = nullptr;
  if (on_device) {
    // the per-piece sums of squares were taken as each unit's reduction completed
    ctx_.kernels().sum_f64(ss_.as<double>(), grads_->norm_partials(), grads_->num_norm_partials(), 1.0);
    if (ctx_.opt.shards_optimizer()) SumOverRanks(*ctx_.comm, ss_.as<double>(), 1.0);
    ctx_.kernels().clip_factor(clip_.as<float>(), ss_.as<double>(), grad_clip);
    scale_dev = clip_.as<float>() + 1;
    // Muon's step takes the factor as a host value: one wait, with --optimizer muon only.
    if (muon_) ctx_.device->CopyToHost(&scale, scale_dev, sizeof(float));
  } else {
    float host[2];
    host[0] = HostNormAndScale(grad_clip, &host[1]);
    scale = host[1];
    ctx_.device->CopyToDevice(clip_.data(), host, sizeof(host));
  }

  t_++;
  if (muon_) {  // the Muon matrices' master weights first; the loop below stores and publishes them
    muon_->Step([this](int u, size_t at) { return LocateForMuon(u, at); }, lr, scale);
    report_.muon_ns_s = muon_->last_ns_seconds();
    report_.muon_ns_cpu_s = muon_->last_ns_cpu_seconds();
  }
  for (int u = 0; u < ctx_.plan.num_units(); u++) {
    for (const OwnedPiece& p : ctx_.Pieces(u))
      adamw_.Update(u, p, grads_->OwnedAt(u, p), params_->OwnedAt(u, p), lr, scale, t_, scale_dev);
    SetFlightUnit(u);
    params_->Publish(u);
  }
  ctx_.queue.WaitAll();

  const MemoryLedger& m = ctx_.memory;
  report_.comm = ctx_.comm->ledger();
  report_.comm_across = ctx_.replica ? ctx_.replica->ledger() : CommLedger();
  report_.params_bytes = m.current(MemKind::kParams);
  report_.grads_bytes = m.current(MemKind::kGrads);
  report_.optimizer_bytes = m.current(MemKind::kOptimizer);
  report_.model_state_bytes = m.StateTotal();
  report_.activation_bytes = m.current(MemKind::kActivations);
  report_.peak_bytes = m.PeakTotal();
  report_.peak_grads_bytes = m.peak(MemKind::kGrads);
  report_.peak_params_bytes = m.peak(MemKind::kParams);
  report_.exposed_comm_s = ctx_.queue.exposed_seconds();
  report_.after_backward_wait_s = report_.exposed_comm_s - at_step;
  report_.comm_busy_s = CommBusySeconds() - busy_at_step_begin_;
}

double Engine::CommBusySeconds() const {
  return ctx_.comm->busy_seconds() + (ctx_.replica ? ctx_.replica->busy_seconds() : 0.0);
}

// ---- whole-model parameters in host memory ----

std::vector<Engine::OwnedState> Engine::Pieces(int u, bool with_v) {
  std::vector<OwnedState> out;
  for (const OwnedPiece& p : ctx_.Pieces(u)) out.push_back(adamw_.Owned(u, p, params_->OwnedAt(u, p), with_v));
  return out;
}

ShardedMuon::Where Engine::LocateForMuon(int u, size_t at) {
  for (const OwnedPiece& p : ctx_.Pieces(u)) {
    if (at < p.begin || at >= p.end) continue;
    const OwnedState st = adamw_.Owned(u, p, params_->OwnedAt(u, p));
    const size_t i = at - p.begin;
    return ShardedMuon::Where{static_cast<const uint8_t*>(grads_->OwnedAt(u, p)) + i * ctx_.elt(), st.master + i,
                              st.m + i};
  }
  std::fprintf(stderr, "shardgpt: internal error: Muon element %zu of unit %d is not owned by this rank\n", at, u);
  std::abort();
}

void Engine::StoreAndPublish(int u) {
  CloseWeightReuse();  // every other write of the parameters (loads, init, SyncParamsFromMaster) comes here
  for (const OwnedPiece& p : ctx_.Pieces(u)) adamw_.StoreFromMaster(u, p, params_->OwnedAt(u, p));
  params_->Publish(u);
}

void Engine::LoadFullParams(const float* full) {
  ctx_.queue.WaitAll();
  for (int u = 0; u < ctx_.plan.num_units(); u++) {
    const float* src = full + ctx_.layout.units()[u].offset;
    for (const OwnedState& st : MasterPieces(u))
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
    for (const OwnedState& st : MasterPieces(u)) {
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

Status Engine::LoadOwnedParams(const std::function<Status(int, uint64_t, uint64_t, float*)>& read) {
  ctx_.queue.WaitAll();
  std::vector<float> slice;
  Status st;
  for (int u = 0; u < ctx_.plan.num_units() && st.ok(); u++)
    for (const OwnedState& own : MasterPieces(u)) {
      slice.resize(own.end - own.begin);
      st = read(u, own.begin, own.end, slice.data());
      if (!st.ok()) break;
      ctx_.device->CopyToDevice(own.master, slice.data(), slice.size() * sizeof(float));
    }
  // Every rank publishes (stage 1/2 all-gather) even after a local error: the others do too.
  for (int u = 0; u < ctx_.plan.num_units(); u++) StoreAndPublish(u);
  adamw_.ResetMoments();
  ctx_.queue.WaitAll();
  t_ = 0;
  return st;
}

void Engine::SyncParamsFromMaster() {
  ctx_.queue.WaitAll();
  adamw_.CommitV();  // Muon: pack the second moments a checkpoint load wrote
  for (int u = 0; u < ctx_.plan.num_units(); u++) StoreAndPublish(u);
  ctx_.queue.WaitAll();
}

void Engine::GatherFullParams(float* out) {
  ctx_.queue.WaitAll();
  for (int u = 0; u < ctx_.plan.num_units(); u++) {
    const UnitShardInfo& s = ctx_.plan.unit(u);
    const std::vector<OwnedState> pieces = MasterPieces(u);
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
