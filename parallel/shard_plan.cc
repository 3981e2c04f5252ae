#include "parallel/shard_plan.h"

#include <algorithm>

namespace shardgpt {

ShardPlan::ShardPlan(const ParamLayout& layout, int world_size) : world_(world_size) {
  const size_t N = static_cast<size_t>(world_size);
  for (const UnitInfo& u : layout.units()) {
    UnitShardInfo s;
    s.numel = u.numel;
    s.padded = (u.numel + N - 1) / N * N;
    s.shard = s.padded / N;
    s.padded_offset = total_padded_;
    s.shard_offset = total_shard_;
    total_padded_ += s.padded;
    total_shard_ += s.shard;
    total_numel_ += s.numel;
    units_.push_back(s);
  }
}

size_t ShardPlan::OwnedBegin(int u, int r) const {
  return std::min(units_[u].numel, static_cast<size_t>(r) * units_[u].shard);
}

size_t ShardPlan::OwnedEnd(int u, int r) const {
  return std::min(units_[u].numel, static_cast<size_t>(r + 1) * units_[u].shard);
}

std::vector<OwnedPiece> ShardPlan::OwnedPieces(int u, int r) const {
  const size_t b = OwnedBegin(u, r), e = OwnedEnd(u, r);
  if (b == e) return {};
  return {OwnedPiece{b, e, 0}};
}

}  // namespace shardgpt
