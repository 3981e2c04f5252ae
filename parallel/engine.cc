#include "parallel/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "parallel/bf16.h"

namespace shardgpt {

namespace {
double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
// dst (dtype) = src (fp32), n elements
void StoreF32(const float* src, void* dst, DType dtype, size_t n) {
  if (dtype == DType::kF32)
    std::memcpy(dst, src, n * sizeof(float));
  else
    FloatToBf16(src, static_cast<uint16_t*>(dst), n);
}
// dst (fp32) = src (dtype)
void LoadF32(const void* src, float* dst, DType dtype, size_t n) {
  if (dtype == DType::kF32)
    std::memcpy(dst, src, n * sizeof(float));
  else
    Bf16ToFloat(static_cast<const uint16_t*>(src), dst, n);
}
// dst (to) = src (from), through fp32
void Convert(const void* src, DType from, void* dst, DType to, size_t n) {
  std::vector<float> f32(n);
  LoadF32(src, f32.data(), from, n);
  StoreF32(f32.data(), dst, to, n);
}
// dst (dtype) += src (src_dtype); bf16 sums are rounded once (RNE)
void Accumulate(void* dst, DType dtype, const void* src, DType src_dtype, size_t n) {
  if (dtype == DType::kF32 && src_dtype == DType::kF32) {
    float* d = static_cast<float*>(dst);
    const float* s = static_cast<const float*>(src);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) d[i] += s[i];
    return;
  }
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    float s = src_dtype == DType::kF32 ? static_cast<const float*>(src)[i]
                                        : Bf16ToFloat(static_cast<const uint16_t*>(src)[i]);
    if (dtype == DType::kF32) {
      static_cast<float*>(dst)[i] += s;
    } else {
      uint16_t* d = static_cast<uint16_t*>(dst) + i;
      *d = FloatToBf16(Bf16ToFloat(*d) + s);
    }
  }
}
double SumSquares(const void* x, DType dtype, size_t n) {
  double ss = 0;
#pragma omp parallel for schedule(static) reduction(+ : ss)
  for (size_t i = 0; i < n; i++) {
    double v = dtype == DType::kF32 ? static_cast<const float*>(x)[i] : Bf16ToFloat(static_cast<const uint16_t*>(x)[i]);
    ss += v * v;
  }
  return ss;
}
std::shared_ptr<TrackedBuffer> NewBuffer(MemoryLedger* ledger, MemKind kind, size_t bytes) {
  return std::make_shared<TrackedBuffer>(ledger, kind, bytes);
}
}  // namespace

// The per-unit transient state (FSDP's FlatParamHandle): its gathered and fp32 compute
// parameters and its gradient scratch, which live only while the unit runs.
struct Engine::Unit {
  UnitShardInfo info;
  size_t own_begin = 0, own_end = 0;     // owned real elements, unit coordinates
  TrackedBuffer gathered;                // stage 3: full padded parameters (dtype)
  std::shared_ptr<Work> gather_work;     // in-flight all-gather into `gathered`
  TrackedBuffer compute;                 // fp32 copy of the full parameters (bf16 only)
  std::shared_ptr<TrackedBuffer> grad_scratch;  // fp32 gradient of this micro-batch
};

Status EngineOptions::Validate() const {
  if (zero_stage < 0 || zero_stage > 3)
    return Status::InvalidArgument("--zero-stage must be 0, 1, 2 or 3, got " + std::to_string(zero_stage));
  if (dtype == DType::kF32 && reduce_dtype == DType::kBF16)
    return Status::InvalidArgument("--reduce-dtype bf16 needs --dtype bf16 (fp32 gradients are reduced in fp32)");
  if (!(bucket_mb > 0)) return Status::InvalidArgument("--bucket-mb must be > 0");
  if (!reduce_every_micro && zero_stage < 2)
    return Status::InvalidArgument(
        "--reduce-grads applies to --zero-stage 2 and 3 only (stages 0 and 1 always sync in the last micro-batch)");
  return Status::OK();
}

double Formula::ModelStateBytes(double psi, int world, int stage, DType dtype) {
  const double p = DTypeSize(dtype), g = DTypeSize(dtype), k = dtype == DType::kBF16 ? 12 : 8, N = world;
  switch (stage) {
    case 0: return (p + g + k) * psi;
    case 1: return (p + g) * psi + k * psi / N;
    case 2: return p * psi + (g + k) * psi / N;
    default: return (p + g + k) * psi / N;
  }
}

double Formula::TrafficBytes(double psi, int world, int stage, DType dtype, DType reduce_dtype, int accum,
                             bool reduce_every_micro) {
  const double f = (world - 1.0) / world, p = DTypeSize(dtype), r = DTypeSize(reduce_dtype);
  const double rs_times = (stage >= 2 && reduce_every_micro) ? accum : 1;
  switch (stage) {
    case 0: return 2 * r * psi * f;                          // all-reduce = reduce-scatter + all-gather
    case 1:
    case 2: return rs_times * r * psi * f + p * psi * f;    // reduce-scatter grads, all-gather params
    default: return rs_times * r * psi * f + 2 * accum * p * psi * f;  // + gather in forward and backward
  }
}

StateSizes Engine::PersistentStateSizes(const ShardPlan& plan, const EngineOptions& o) {
  const uint64_t Tp = plan.total_padded(), Ts = plan.total_shard(), elt = DTypeSize(o.dtype);
  const uint64_t opt_elems = o.zero_stage >= 1 ? Ts : Tp;
  const bool full_grads = o.zero_stage < 2 || !o.reduce_every_micro;
  StateSizes s;
  s.params = (o.zero_stage >= 3 ? Ts : Tp) * elt;
  s.grads = (full_grads ? Tp : Ts) * elt;
  s.optimizer = opt_elems * 4 * (o.dtype == DType::kBF16 ? 3 : 2);  // (master,) m, v in fp32
  return s;
}

// Consecutive units in backward order (final, blocks L..1, embed) until a bucket holds
// bucket_mb; consecutive units are adjacent in the padded buffer, so a bucket is one range.
// As in PyTorch DDP, the first bucket is capped at 1 MiB so that communication starts early.
std::vector<std::vector<int>> Engine::PlanBuckets(const ShardPlan& plan, const EngineOptions& o) {
  std::vector<std::vector<int>> buckets;
  const double cap = o.bucket_mb * 1024 * 1024, first_cap = std::min(cap, 1024.0 * 1024);
  double filled = 0;
  for (int u = plan.num_units() - 1; u >= 0; u--) {
    if (buckets.empty() || filled >= (buckets.size() == 1 ? first_cap : cap)) buckets.emplace_back(), filled = 0;
    buckets.back().push_back(u);
    filled += static_cast<double>(plan.unit(u).padded) * DTypeSize(o.reduce_dtype);
  }
  return buckets;
}

CommLedger Engine::ExpectedStepTraffic(const ParamLayout& layout, const ShardPlan& plan, const EngineOptions& o,
                                       int accum) {
  CommLedger l;
  const int N = plan.world_size();
  auto add = [&](CollKind k, uint64_t count, DType d, int times) {
    for (int i = 0; i < times; i++) l.Add(k, CommLedger::RingBytes(k, count, d, N));
  };
  if (o.zero_stage == 0) {
    for (const auto& b : PlanBuckets(plan, o)) {
      uint64_t count = 0;
      for (int u : b) count += plan.unit(u).padded;
      add(CollKind::kAllReduce, count, o.reduce_dtype, 1);
    }
    return l;
  }
  const int rs_times = (o.zero_stage >= 2 && o.reduce_every_micro) ? accum : 1;
  for (int u = 0; u < plan.num_units(); u++) {
    const uint64_t shard = plan.unit(u).shard;
    const bool root = u == ParamLayout::kEmbedUnit || u == layout.final_unit();
    if (o.zero_stage == 3) {
      // forward gathers every unit; backward re-gathers the blocks that were resharded
      add(CollKind::kAllGather, shard, o.dtype, accum);
      if (o.reshard_after_forward && !root) add(CollKind::kAllGather, shard, o.dtype, accum);
    }
    add(CollKind::kReduceScatter, shard, o.reduce_dtype, rs_times);
    if (o.zero_stage < 3) add(CollKind::kAllGather, shard, o.dtype, 1);
  }
  return l;
}

StatusOr<std::unique_ptr<Engine>> Engine::Create(const ParamLayout& layout, Communicator* comm,
                                                 const EngineOptions& options) {
  SHARDGPT_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<Engine>(new Engine(layout, comm, options));
}

Engine::Engine(const ParamLayout& layout, Communicator* comm, const EngineOptions& options)
    : layout_(layout),
      comm_(comm),
      opt_(options),
      plan_(layout, comm->world_size()),
      rank_(comm->rank()),
      world_(comm->world_size()) {
  const StateSizes sizes = PersistentStateSizes(plan_, opt_);
  params_ = TrackedBuffer(&memory_, MemKind::kParams, sizes.params);
  if (opt_.dtype == DType::kBF16) master_ = TrackedBuffer(&memory_, MemKind::kOptimizer, sizes.optimizer / 3);
  m_ = TrackedBuffer(&memory_, MemKind::kOptimizer, sizes.optimizer / (opt_.dtype == DType::kBF16 ? 3 : 2));
  v_ = TrackedBuffer(&memory_, MemKind::kOptimizer, m_.bytes());
  if (keeps_full_grads())
    grads_ = TrackedBuffer(&memory_, MemKind::kGrads, sizes.grads);
  else
    grad_shards_ = TrackedBuffer(&memory_, MemKind::kGrads, sizes.grads);
  for (int u = 0; u < plan_.num_units(); u++) {
    auto unit = std::make_unique<Unit>();
    unit->info = plan_.unit(u);
    unit->own_begin = plan_.OwnedBegin(u, rank_);
    unit->own_end = plan_.OwnedEnd(u, rank_);
    units_.push_back(std::move(unit));
  }
  buckets_ = PlanBuckets(plan_, opt_);
  bucket_of_unit_.assign(plan_.num_units(), 0);
  for (size_t b = 0; b < buckets_.size(); b++)
    for (int u : buckets_[b]) bucket_of_unit_[u] = static_cast<int>(b);
  bucket_ready_.assign(buckets_.size(), 0);
}

Engine::~Engine() { WaitAll(); }

// ---- pointers into the persistent buffers ----

void* Engine::FullGrads(int u) {
  return grads_.as<uint8_t>() + units_[u]->info.padded_offset * elt();
}
float* Engine::FullGradsF32(int u) { return static_cast<float*>(FullGrads(u)); }

void* Engine::OwnedGrads(int u) {
  const UnitShardInfo& s = units_[u]->info;
  if (!shards_optimizer()) return FullGrads(u);
  if (keeps_full_grads()) return grads_.as<uint8_t>() + (s.padded_offset + rank_ * s.shard) * elt();
  return grad_shards_.as<uint8_t>() + s.shard_offset * elt();
}

void* Engine::ParamsOwned(int u) {
  const UnitShardInfo& s = units_[u]->info;
  if (shards_params()) return params_.as<uint8_t>() + s.shard_offset * elt();
  if (!shards_optimizer()) return params_.as<uint8_t>() + s.padded_offset * elt();
  return params_.as<uint8_t>() + (s.padded_offset + rank_ * s.shard) * elt();
}

Engine::OwnedState Engine::Owned(int u) {
  const Unit& unit = *units_[u];
  const size_t off = shards_optimizer() ? unit.info.shard_offset : unit.info.padded_offset;
  OwnedState st;
  st.begin = shards_optimizer() ? unit.own_begin : 0;
  st.end = shards_optimizer() ? unit.own_end : unit.info.numel;
  st.master = opt_.dtype == DType::kBF16 ? master_.as<float>() + off : static_cast<float*>(ParamsOwned(u));
  st.m = m_.as<float>() + off;
  st.v = v_.as<float>() + off;
  return st;
}

// ---- asynchronous work ----

void Engine::Enqueue(std::shared_ptr<Work> work, std::function<void()> on_done) {
  pending_.push_back(Pending{std::move(work), std::move(on_done)});
}

// Retires finished collectives in call order (the communicator completes them in order),
// running their completion step: accumulate a reduced shard, free the send buffer.
void Engine::RetireCompleted() {
  while (!pending_.empty() && pending_.front().work->IsCompleted()) {
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    retired_++;
    if (p.on_done) p.on_done();
  }
}

// Blocks on the oldest collective (counted as exposed communication), then retires it and
// whatever else has completed.
void Engine::WaitOldest() {
  const double t0 = Now();
  pending_.front().work->Wait();
  exposed_s_ += Now() - t0;
  RetireCompleted();
}

void Engine::WaitAll() {
  while (!pending_.empty()) WaitOldest();
}

// ---- parameters ----

void Engine::Gather(int u) {
  Unit& unit = *units_[u];
  unit.gathered = TrackedBuffer(&memory_, MemKind::kParams, unit.info.padded * elt());
  unit.gather_work = comm_->AllGather(ParamsOwned(u), unit.gathered.data(), unit.info.shard, opt_.dtype);
}

void Engine::WaitUnitGather(int u) {
  Unit& unit = *units_[u];
  if (unit.gather_work == nullptr) return;
  const double t0 = Now();
  unit.gather_work->Wait();
  exposed_s_ += Now() - t0;
  unit.gather_work.reset();
}

const float* Engine::ComputeParams(int u) {
  Unit& unit = *units_[u];
  const void* full = shards_params() ? unit.gathered.data() : params_.as<uint8_t>() + unit.info.padded_offset * elt();
  if (opt_.dtype == DType::kF32) return static_cast<const float*>(full);
  if (unit.compute.empty()) {
    unit.compute = TrackedBuffer(&memory_, MemKind::kParams, unit.info.padded * sizeof(float));
    LoadF32(full, unit.compute.as<float>(), DType::kBF16, unit.info.padded);
  }
  return unit.compute.as<float>();
}

void Engine::ReleaseParams(int u) {
  Unit& unit = *units_[u];
  unit.compute.Free();
  if (shards_params()) {
    WaitUnitGather(u);
    unit.gathered.Free();
  }
}

void Engine::AllGatherParams(int u) {
  const UnitShardInfo& s = units_[u]->info;
  void* full = params_.as<uint8_t>() + s.padded_offset * elt();
  Enqueue(comm_->AllGather(ParamsOwned(u), full, s.shard, opt_.dtype), nullptr);
}

// ---- UnitHooks ----

const float* Engine::PreForward(int u) {
  RetireCompleted();
  if (shards_params()) {
    if (units_[u]->gathered.empty()) Gather(u);
    WaitUnitGather(u);
    const int next = u + 1;  // forward order: embed, blocks, final
    if (next < plan_.num_units() && units_[next]->gathered.empty()) Gather(next);
  }
  return ComputeParams(u);
}

void Engine::PostForward(int u) {
  if (is_root_unit(u)) return;  // used again at once by backward (FSDP2 keeps the root gathered)
  if (shards_params()) {
    if (opt_.reshard_after_forward) ReleaseParams(u);
  } else {
    units_[u]->compute.Free();
  }
}

UnitBuffers Engine::PreBackward(int u) {
  RetireCompleted();
  Unit& unit = *units_[u];
  if (shards_params()) {
    if (unit.gathered.empty()) Gather(u);
    WaitUnitGather(u);
    // backward order: final, blocks L..1, embed; the next unit is u - 1, except that embed is
    // already gathered (its backward starts first, for the tied LM head)
    const int next = u - 1;
    if (next >= 1 && units_[next]->gathered.empty()) Gather(next);
  }
  UnitBuffers b;
  b.params = ComputeParams(u);
  if (keeps_full_grads() && opt_.dtype == DType::kF32) {
    b.grads = FullGradsF32(u);  // accumulate straight into the persistent gradient
  } else {
    unit.grad_scratch = NewBuffer(&memory_, MemKind::kGrads, unit.info.padded * sizeof(float));
    b.grads = unit.grad_scratch->as<float>();
  }
  return b;
}

void Engine::PostBackward(int u) {
  Unit& unit = *units_[u];
  if (unit.grad_scratch) {
    if (keeps_full_grads()) {
      Accumulate(FullGrads(u), opt_.dtype, unit.grad_scratch->data(), DType::kF32, unit.info.padded);
      unit.grad_scratch.reset();
    } else {
      LaunchReduceScatter(u, unit.grad_scratch->as<float>());
    }
  }
  if (sync_micro_ && keeps_full_grads()) {
    if (!shards_optimizer()) {
      const int b = bucket_of_unit_[u];
      if (++bucket_ready_[b] == static_cast<int>(buckets_[b].size())) LaunchBucket(b);
    } else {
      LaunchReduceScatter(u, nullptr);
    }
  }
  if (shards_params()) {
    ReleaseParams(u);
  } else {
    unit.compute.Free();
  }
  RetireCompleted();
  if (u == ParamLayout::kEmbedUnit && sync_micro_) {  // the end of the last backward
    int done = retired_;
    for (const Pending& p : pending_) done += p.work->IsCompleted() ? 1 : 0;
    report_.buckets_done_during_backward = done;
  }
}

// ---- gradient reduction ----

// Stage 0: average one bucket (a contiguous range of the padded gradient buffer) in place,
// through a buffer of the reduce dtype when it differs from the gradient dtype.
void Engine::LaunchBucket(int b) {
  const int lo = buckets_[b].back(), hi = buckets_[b].front();  // backward order: high unit first
  const size_t begin = plan_.unit(lo).padded_offset, count = plan_.unit(hi).padded_offset + plan_.unit(hi).padded - begin;
  void* grads = grads_.as<uint8_t>() + begin * elt();
  if (opt_.reduce_dtype == opt_.dtype) {
    Enqueue(comm_->AllReduce(grads, count, opt_.dtype, ReduceOp::kAvg), nullptr);
    return;
  }
  auto tmp = NewBuffer(&memory_, MemKind::kGrads, count * DTypeSize(opt_.reduce_dtype));
  Convert(grads, opt_.dtype, tmp->data(), opt_.reduce_dtype, count);
  Enqueue(comm_->AllReduce(tmp->data(), count, opt_.reduce_dtype, ReduceOp::kAvg), [this, tmp, grads, count]() {
    Convert(tmp->data(), opt_.reduce_dtype, grads, opt_.dtype, count);
  });
}

// Stages >= 1: reduce-scatter (average) unit u's gradient. From `scratch` (fp32, this
// micro-batch only; stage 2/3 every micro-batch): the reduced shard is added to the sharded
// gradient and the scratch freed as soon as the collective completes. From the full gradient
// (scratch == nullptr): in place, the owned block of the full buffer receives the result.
void Engine::LaunchReduceScatter(int u, float* scratch) {
  Unit& unit = *units_[u];
  const UnitShardInfo s = unit.info;
  const DType rd = opt_.reduce_dtype;
  if (scratch != nullptr) {
    // Rate limit (as FSDP's): at most kMaxInflightReductions unit gradients wait for their
    // reduce-scatter, otherwise a slow network lets every unit's full gradient pile up and
    // stage 2's memory saving is lost.
    while (inflight_reductions_ >= kMaxInflightReductions) WaitOldest();
    inflight_reductions_++;
    std::shared_ptr<TrackedBuffer> send = unit.grad_scratch;
    unit.grad_scratch.reset();
    if (rd == DType::kBF16) {  // convert now and free the fp32 scratch at once
      auto bf = NewBuffer(&memory_, MemKind::kGrads, s.padded * 2);
      FloatToBf16(scratch, bf->as<uint16_t>(), s.padded);
      send = bf;
    }
    // the reduced shard lands in this rank's own block of the send buffer (in place)
    void* recv = send->as<uint8_t>() + rank_ * s.shard * DTypeSize(rd);
    Enqueue(comm_->ReduceScatter(send->data(), recv, s.shard, rd, ReduceOp::kAvg),
            [this, u, send, recv, rd, s]() mutable {
              Accumulate(OwnedGrads(u), opt_.dtype, recv, rd, s.shard);
              send.reset();
              inflight_reductions_--;
            });
    return;
  }
  void* full = FullGrads(u);
  if (rd == opt_.dtype) {
    Enqueue(comm_->ReduceScatter(full, static_cast<uint8_t*>(full) + rank_ * s.shard * elt(), s.shard, rd,
                                 ReduceOp::kAvg),
            nullptr);
    return;
  }
  auto tmp = NewBuffer(&memory_, MemKind::kGrads, s.padded * DTypeSize(rd));
  Convert(full, opt_.dtype, tmp->data(), rd, s.padded);
  void* own_in_tmp = tmp->as<uint8_t>() + rank_ * s.shard * DTypeSize(rd);
  Enqueue(comm_->ReduceScatter(tmp->data(), own_in_tmp, s.shard, rd, ReduceOp::kAvg),
          [this, u, tmp, own_in_tmp, rd, s]() { Convert(own_in_tmp, rd, OwnedGrads(u), opt_.dtype, s.shard); });
}

// ---- step ----

void Engine::LoadFullParams(const float* full) {
  WaitAll();
  for (int u = 0; u < plan_.num_units(); u++) {
    const Unit& unit = *units_[u];
    const float* src = full + layout_.units()[u].offset;
    if (shards_params()) {
      StoreF32(src + unit.own_begin, ParamsOwned(u), opt_.dtype, unit.own_end - unit.own_begin);
    } else {
      StoreF32(src, params_.as<uint8_t>() + unit.info.padded_offset * elt(), opt_.dtype, unit.info.numel);
    }
    OwnedState st = Owned(static_cast<int>(u));
    if (opt_.dtype == DType::kBF16) std::memcpy(st.master, src + st.begin, (st.end - st.begin) * sizeof(float));
  }
  std::memset(m_.data(), 0, m_.bytes());
  std::memset(v_.data(), 0, v_.bytes());
  t_ = 0;
}

void Engine::SyncParamsFromMaster() {
  WaitAll();
  for (int u = 0; u < plan_.num_units(); u++) {
    OwnedState st = Owned(u);
    if (opt_.dtype == DType::kBF16) StoreF32(st.master, ParamsOwned(u), opt_.dtype, st.end - st.begin);
    if (shards_optimizer() && !shards_params()) AllGatherParams(u);
  }
  WaitAll();
}

void Engine::GatherFullParams(float* out) {
  WaitAll();
  for (int u = 0; u < plan_.num_units(); u++) {
    const Unit& unit = *units_[u];
    OwnedState st = Owned(u);
    float* dst = out + layout_.units()[u].offset;
    if (!shards_optimizer()) {
      std::memcpy(dst, st.master, unit.info.numel * sizeof(float));
      continue;
    }
    std::vector<float> full(unit.info.padded, 0.0f);
    std::memcpy(full.data() + rank_ * unit.info.shard, st.master, (st.end - st.begin) * sizeof(float));
    comm_->AllGather(full.data() + rank_ * unit.info.shard, full.data(), unit.info.shard, DType::kF32)->Wait();
    std::memcpy(dst, full.data(), unit.info.numel * sizeof(float));
  }
}

void Engine::ReleaseAll() {
  for (int u = 0; u < plan_.num_units(); u++) ReleaseParams(u);
}

void Engine::BeginStep() {
  WaitAll();
  if (!grads_.empty()) std::memset(grads_.data(), 0, grads_.bytes());
  if (!grad_shards_.empty()) std::memset(grad_shards_.data(), 0, grad_shards_.bytes());
  comm_->ledger().Reset();
  memory_.ResetPeaks();
  exposed_s_ = 0;
  busy_at_step_begin_ = comm_->busy_seconds();
  retired_ = 0;
}

void Engine::BeginMicroBatch(int micro, int num_micro) {
  sync_micro_ = micro == num_micro - 1;
  std::fill(bucket_ready_.begin(), bucket_ready_.end(), 0);
}

float Engine::Step(float lr, float grad_clip) {
  WaitAll();
  report_.backward_exposed_s = exposed_s_;
  // Global gradient norm: every element counted once. Stage 0 holds the whole averaged
  // gradient on every rank; stages >= 1 sum their owned slices' squares over ranks.
  double ss = 0;
  for (int u = 0; u < plan_.num_units(); u++) {
    OwnedState st = Owned(u);
    ss += SumSquares(OwnedGrads(u), opt_.dtype, st.end - st.begin);
  }
  if (shards_optimizer()) ss = comm_->AllReduceScalar(ss, ReduceOp::kSum);
  const float norm = static_cast<float>(std::sqrt(ss));
  const float scale = (grad_clip > 0 && norm > grad_clip) ? grad_clip / (norm + 1e-6f) : 1.0f;

  t_++;
  std::vector<float> g32;
  for (int u = 0; u < plan_.num_units(); u++) {
    OwnedState st = Owned(u);
    const size_t n = st.end - st.begin;
    const float* g = static_cast<const float*>(OwnedGrads(u));
    if (opt_.dtype == DType::kBF16) {
      g32.resize(n);
      LoadF32(OwnedGrads(u), g32.data(), DType::kBF16, n);
      g = g32.data();
    }
    for (const DecayRange& r : layout_.DecayRanges(u, st.begin, st.end)) {
      const size_t i = r.begin - st.begin;
      adamw_update(st.master + i, g + i, st.m + i, st.v + i, r.end - r.begin, lr,
                   r.decay ? opt_.adamw.weight_decay : 0.0f, opt_.adamw, t_, scale);
    }
    if (opt_.dtype == DType::kBF16) StoreF32(st.master, ParamsOwned(u), opt_.dtype, n);
    if (shards_optimizer() && !shards_params()) AllGatherParams(u);
  }
  WaitAll();

  report_.comm = comm_->ledger();
  report_.params_bytes = memory_.current(MemKind::kParams);
  report_.grads_bytes = memory_.current(MemKind::kGrads);
  report_.optimizer_bytes = memory_.current(MemKind::kOptimizer);
  report_.model_state_bytes = memory_.Total();
  report_.peak_grads_bytes = memory_.peak(MemKind::kGrads);
  report_.peak_params_bytes = memory_.peak(MemKind::kParams);
  report_.exposed_comm_s = exposed_s_;
  report_.comm_busy_s = comm_->busy_seconds() - busy_at_step_begin_;
  return norm;
}

}  // namespace shardgpt
