#include "parallel/muon_plan.h"

#include <algorithm>
#include <numeric>

namespace shardgpt {

double MuonMatrix::NsFlops(int steps) const {
  const double r = std::min(rows, cols), c = std::max(rows, cols);
  return steps * (2 * r * r * c + 2 * r * r * r + 2 * r * r * c);
}

MuonPlan::MuonPlan(const ParamLayout& layout, const ShardPlan& plan, bool stage0, int ns_steps)
    : plan_(plan), stage0_(stage0), ns_steps_(ns_steps), ranges_(layout.num_units()) {
  const std::string qkv = "attn.c_attn.weight";
  for (const TensorInfo& t : layout.tensors()) {
    const bool block = t.unit != ParamLayout::kEmbedUnit && t.unit != layout.final_unit();
    if (!block || t.shape.size() != 2) continue;
    const int rows = static_cast<int>(t.shape[0]), cols = static_cast<int>(t.shape[1]);
    const bool split = t.name.size() >= qkv.size() && t.name.compare(t.name.size() - qkv.size(), qkv.size(), qkv) == 0;
    const int parts = split ? 3 : 1;
    for (int p = 0; p < parts; p++) {
      MuonMatrix m;
      m.name = split ? t.name + "." + "qkv"[p] : t.name;
      m.unit = t.unit;
      m.rows = rows / parts;
      m.cols = cols;
      m.begin = t.offset + static_cast<size_t>(p) * m.numel();
      matrices_.push_back(m);
      muon_numel_ += m.numel();
    }
    ranges_[t.unit].emplace_back(t.offset, t.offset + t.numel);
  }
  for (auto& r : ranges_) std::sort(r.begin(), r.end());
  // Owners: LPT greedy on Newton-Schulz FLOPs.
  const int N = plan.world_size();
  std::vector<int> order(matrices_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return matrices_[a].NsFlops(ns_steps) > matrices_[b].NsFlops(ns_steps); });
  std::vector<double> load(N, 0.0);
  owners_.assign(matrices_.size(), 0);
  for (int k : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owners_[k] = r;
    load[r] += matrices_[k].NsFlops(ns_steps);
  }
}

std::vector<MuonSegment> MuonPlan::Segments(int owner, int holder, bool whole) const {
  std::vector<MuonSegment> out;
  for (size_t k = 0; k < matrices_.size(); k++) {
    if (owners_[k] != owner) continue;
    const MuonMatrix& m = matrices_[k];
    std::vector<OwnedPiece> pieces =
        whole ? std::vector<OwnedPiece>{OwnedPiece{0, plan_.unit(m.unit).numel, 0}} : plan_.OwnedPieces(m.unit, holder);
    for (const OwnedPiece& p : pieces) {
      const size_t b = std::max(m.begin, p.begin), e = std::min(m.end(), p.end);
      if (b >= e) continue;
      out.push_back(MuonSegment{static_cast<int>(k), b, e, p.shard_offset + (b - p.begin), b - m.begin});
    }
  }
  return out;
}

uint64_t MuonPlan::SentElements(int r) const {
  uint64_t n = 0;
  for (int o = 0; o < plan_.world_size(); o++) {
    if (o == r) continue;
    if (!stage0_)
      for (const MuonSegment& s : Segments(o, r, false)) n += s.size();  // phase 1: U to owner o
    for (const MuonSegment& s : Segments(r, o, stage0_)) n += s.size();  // phase 2: updates to rank o
  }
  return n;
}

double MuonPlan::OwnerFlops(int r) const {
  double f = 0;
  for (size_t k = 0; k < matrices_.size(); k++)
    if (owners_[k] == r) f += matrices_[k].NsFlops(ns_steps_);
  return f;
}

}  // namespace shardgpt
