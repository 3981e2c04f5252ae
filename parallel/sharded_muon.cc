#include "parallel/sharded_muon.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>

#include "base/bf16.h"
#include "model/muon.h"

namespace shardgpt {

namespace {
double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
size_t Total(const std::vector<size_t>& v) {
  size_t t = 0;
  for (size_t x : v) t += x;
  return t;
}
std::vector<size_t> Sizes(const std::vector<std::vector<MuonSegment>>& segs) {
  std::vector<size_t> n;
  for (const auto& peer : segs) {
    size_t t = 0;
    for (const MuonSegment& s : peer) t += s.size();
    n.push_back(t);
  }
  return n;
}
}  // namespace

ShardedMuon::ShardedMuon(EngineContext* ctx)
    : ctx_(*ctx), plan_(ctx->layout, ctx->plan, !ctx->opt.shards_optimizer(), ctx->opt.muon.ns_steps) {
  const int N = ctx_.world, me = ctx_.rank;
  const bool st0 = plan_.stage0();
  for (int p = 0; p < N; p++) {
    send1_.push_back(st0 ? std::vector<MuonSegment>{} : plan_.Segments(p, me, false));  // my U -> owner p
    recv1_.push_back(st0 ? std::vector<MuonSegment>{} : plan_.Segments(me, p, false));  // p's U of my matrices
    send2_.push_back(plan_.Segments(me, p, st0));  // updates of my matrices -> p
    recv2_.push_back(plan_.Segments(p, me, st0));  // updates of p's matrices -> me
  }
  send1_n_ = Sizes(send1_), recv1_n_ = Sizes(recv1_), send2_n_ = Sizes(send2_), recv2_n_ = Sizes(recv2_);
  mat_offset_.assign(plan_.matrices().size(), 0);
  for (size_t k = 0; k < plan_.matrices().size(); k++)
    if (plan_.owner(static_cast<int>(k)) == me) {
      mine_.push_back(static_cast<int>(k));
      mat_offset_[k] = mats_numel_;
      mats_numel_ += plan_.matrices()[k].numel();
    }
  // Transient buffers of the exchanges (not model state: counted by no MemKind).
  const size_t s = std::max(Total(send1_n_), Total(send2_n_)), r = std::max(Total(recv1_n_), Total(recv2_n_));
  wire_send_ = DeviceBuffer(ctx_.device, nullptr, MemKind::kGrads, std::max<size_t>(s, 1) * sizeof(float), "Muon send");
  wire_recv_ = DeviceBuffer(ctx_.device, nullptr, MemKind::kGrads, std::max<size_t>(r, 1) * sizeof(float), "Muon recv");
}

void ShardedMuon::ReadGrad(float* dst, const void* src, size_t n) {
  if (ctx_.opt.dtype == DType::kF32) return ctx_.device->CopyToHost(dst, src, n * sizeof(float));
  std::vector<uint16_t> b(n);
  ctx_.device->CopyToHost(b.data(), src, n * sizeof(uint16_t));
  for (size_t i = 0; i < n; i++) dst[i] = Bf16ToFloat(b[i]);
}

void ShardedMuon::Step(const Locator& locate, float lr, float grad_scale) {
  const int N = ctx_.world;
  const float mu = ctx_.opt.muon.momentum;
  Device& dev = *ctx_.device;
  const auto& mats = plan_.matrices();
  std::vector<float> owned(mats_numel_);  // U, then the update, of the matrices this rank owns
  std::vector<float> g, m, tmp;

  // M = mu*M + G, U = G + mu*M over one segment; U into u_out (host).
  auto momentum = [&](const MuonSegment& s, float* u_out) {
    const Where at = locate(mats[s.matrix].unit, s.begin);
    const size_t n = s.size();
    g.resize(n), m.resize(n);
    ReadGrad(g.data(), at.grad, n);
    dev.CopyToHost(m.data(), at.momentum, n * sizeof(float));
    muon_momentum(m.data(), u_out, g.data(), n, mu, grad_scale);
    dev.CopyToDevice(at.momentum, m.data(), n * sizeof(float));
  };
  // One all-to-all-v of host fp32 values through the device wire buffers, travelling in the
  // gradients' reduce dtype (bf16 rounds each value once, RNE, on every path alike).
  const DType wire = ctx_.opt.reduce_dtype;
  std::vector<uint16_t> narrow;
  auto exchange = [&](const std::vector<float>& send, const std::vector<size_t>& sn, std::vector<float>* recv,
                      const std::vector<size_t>& rn) {
    recv->resize(Total(rn));
    if (wire == DType::kF32) {
      dev.CopyToDevice(wire_send_.data(), send.data(), send.size() * sizeof(float));
    } else {
      narrow.resize(send.size());
      for (size_t i = 0; i < send.size(); i++) narrow[i] = FloatToBf16(send[i]);
      dev.CopyToDevice(wire_send_.data(), narrow.data(), narrow.size() * sizeof(uint16_t));
    }
    auto w = ctx_.comm->AllToAllV(wire_send_.data(), sn, wire_recv_.data(), rn, wire);
    ctx_.queue.Wait(*w);
    if (wire == DType::kF32) {
      dev.CopyToHost(recv->data(), wire_recv_.data(), recv->size() * sizeof(float));
    } else {
      narrow.resize(recv->size());
      dev.CopyToHost(narrow.data(), wire_recv_.data(), narrow.size() * sizeof(uint16_t));
      for (size_t i = 0; i < narrow.size(); i++) (*recv)[i] = Bf16ToFloat(narrow[i]);
    }
  };

  if (plan_.stage0()) {
    // Every replica holds the whole averaged gradient and momentum: update all momenta alike;
    // only the owner keeps U.
    for (size_t k = 0; k < mats.size(); k++) {
      const MuonMatrix& mt = mats[k];
      const MuonSegment whole{static_cast<int>(k), mt.begin, mt.end(), mt.begin, 0};
      const bool mine = plan_.owner(static_cast<int>(k)) == ctx_.rank;
      tmp.resize(mine ? 0 : mt.numel());
      momentum(whole, mine ? owned.data() + mat_offset_[k] : tmp.data());
      if (mine && wire == DType::kBF16)  // as if U had travelled, like at stages >= 1
        for (size_t i = 0; i < mt.numel(); i++) owned[mat_offset_[k] + i] = Bf16ToFloat(FloatToBf16(owned[mat_offset_[k] + i]));
    }
  } else {
    std::vector<float> send(Total(send1_n_)), recv;
    size_t at = 0;
    for (int p = 0; p < N; p++)
      for (const MuonSegment& s : send1_[p]) momentum(s, send.data() + at), at += s.size();
    exchange(send, send1_n_, &recv, recv1_n_);
    at = 0;
    for (int p = 0; p < N; p++)
      for (const MuonSegment& s : recv1_[p]) {
        std::memcpy(owned.data() + mat_offset_[s.matrix] + s.in_matrix, recv.data() + at, s.size() * sizeof(float));
        at += s.size();
      }
  }

  // The owner's part: Newton-Schulz on whole matrices, then Moonlight's scale.
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = ThreadCpuSeconds();
  for (int k : mine_) {
    const MuonMatrix& mt = mats[k];
    float* x = owned.data() + mat_offset_[k];
    NewtonSchulz(x, mt.rows, mt.cols, ctx_.opt.muon.ns_steps);
    const float scale = MuonScale(mt.rows, mt.cols);
    for (size_t i = 0; i < mt.numel(); i++) x[i] *= scale;
  }
  ns_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ns_cpu_s_ = ThreadCpuSeconds() - c0;

  std::vector<float> send(Total(send2_n_)), recv;
  size_t at = 0;
  for (int p = 0; p < N; p++)
    for (const MuonSegment& s : send2_[p]) {
      std::memcpy(send.data() + at, owned.data() + mat_offset_[s.matrix] + s.in_matrix, s.size() * sizeof(float));
      at += s.size();
    }
  exchange(send, send2_n_, &recv, recv2_n_);
  // W = W*(1 - lr*wd) - lr*O on this rank's master elements.
  const float wd = ctx_.opt.adamw.weight_decay;
  at = 0;
  for (int p = 0; p < N; p++)
    for (const MuonSegment& s : recv2_[p]) {
      float* w = locate(mats[s.matrix].unit, s.begin).master;
      m.resize(s.size());
      dev.CopyToHost(m.data(), w, s.size() * sizeof(float));
      muon_apply(m.data(), recv.data() + at, s.size(), lr, wd);
      dev.CopyToDevice(w, m.data(), s.size() * sizeof(float));
      at += s.size();
    }
}

}  // namespace shardgpt
