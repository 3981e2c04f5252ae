#include "parallel/shard_plan.h"

#include <algorithm>

namespace shardgpt {

const char* ShardLayoutName(ShardLayout l) { return l == ShardLayout::kFlat ? "flat" : "per-param"; }

StatusOr<ShardLayout> ParseShardLayout(const std::string& s) {
  if (s == "flat") return ShardLayout::kFlat;
  if (s == "per-param") return ShardLayout::kPerParam;
  return Status::InvalidArgument("--shard-layout must be flat or per-param, got '" + s + "'");
}

ShardPlan::ShardPlan(const ParamLayout& layout, int world_size, ShardLayout shard_layout)
    : world_(world_size), shard_layout_(shard_layout) {
  const size_t N = static_cast<size_t>(world_size);
  for (int ui = 0; ui < layout.num_units(); ui++) {
    const UnitInfo& u = layout.units()[ui];
    UnitShardInfo s;
    s.numel = u.numel;
    std::vector<std::vector<OwnedPiece>> per_rank(N);
    if (shard_layout == ShardLayout::kFlat) {
      s.shard = (u.numel + N - 1) / N;
      for (size_t r = 0; r < N; r++) {
        const size_t b = std::min(u.numel, r * s.shard), e = std::min(u.numel, (r + 1) * s.shard);
        if (b < e) per_rank[r].push_back(OwnedPiece{b, e, 0});
      }
    } else {
      // Each tensor: rows [r*R, min((r+1)*R, rows)) x cols on rank r, at the tensor's place
      // in the shard (its padded row-slices R*cols of the tensors before it).
      for (int t = u.first_tensor; t < u.first_tensor + u.num_tensors; t++) {
        const TensorInfo& ti = layout.tensors()[t];
        const size_t rows = static_cast<size_t>(ti.shape[0]), cols = ti.numel / rows;
        const size_t R = (rows + N - 1) / N;
        for (size_t r = 0; r < N; r++) {
          const size_t rb = std::min(rows, r * R), re = std::min(rows, (r + 1) * R);
          if (rb < re) per_rank[r].push_back(OwnedPiece{ti.offset + rb * cols, ti.offset + re * cols, s.shard});
        }
        s.shard += R * cols;
      }
    }
    s.padded = s.shard * N;
    s.padded_offset = total_padded_;
    s.shard_offset = total_shard_;
    std::vector<CopyRun> runs;
    for (size_t r = 0; r < N; r++)
      for (const OwnedPiece& p : per_rank[r]) runs.push_back(CopyRun{p.begin, p.end - p.begin, r * s.shard + p.shard_offset});
    total_padded_ += s.padded;
    total_shard_ += s.shard;
    total_numel_ += s.numel;
    units_.push_back(s);
    pieces_.push_back(std::move(per_rank));
    runs_.push_back(std::move(runs));
  }
}

}  // namespace shardgpt
