// ShardPlan: which flat range of each unit every rank owns (FSDP1-style flat sharding).
//
// A unit's flat buffer of n elements is padded with zeros to P = ceil(n / N) * N elements and
// split into N equal shards of S = P / N; rank r owns [r*S, (r+1)*S) of the padded buffer,
// i.e. the real elements [r*S, min((r+1)*S, n)). Shards cross tensor boundaries freely. The
// padding costs at most N-1 elements per unit in memory and in every collective; with
// N = 3 on a 3.3M-parameter model that is a few dozen elements.
// The plan is pure arithmetic on (layout, N): checkpoints store it, and resharding on load is
// the intersection of the saved plan with the loading run's plan.
#pragma once

#include <cstddef>
#include <vector>

#include "model/param_layout.h"

namespace shardgpt {

struct UnitShardInfo {
  size_t numel = 0;          // real elements of the unit
  size_t padded = 0;         // numel rounded up to a multiple of the world size
  size_t shard = 0;          // padded / world
  size_t padded_offset = 0;  // offset of the unit in a buffer of all units, each padded
  size_t shard_offset = 0;   // offset of the unit's shard in a buffer of all shards
};

// A run of real elements rank r owns of unit u: unit coordinates [begin, end), held at
// shard_offset within that rank's shard of the unit. Code that must work for every layout
// (optimizer, initialisation, checkpoints, Muon) walks the pieces, never assumes one range.
struct OwnedPiece {
  size_t begin = 0, end = 0;
  size_t shard_offset = 0;
};

class ShardPlan {
 public:
  ShardPlan(const ParamLayout& layout, int world_size);

  int world_size() const { return world_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  const UnitShardInfo& unit(int u) const { return units_[u]; }
  size_t total_padded() const { return total_padded_; }
  size_t total_shard() const { return total_shard_; }
  // Real elements of unit u owned by rank r: [begin, end) in unit coordinates (may be empty).
  size_t OwnedBegin(int u, int r) const;
  size_t OwnedEnd(int u, int r) const;
  // The same as pieces (flat layout: one piece, or none when r owns only padding).
  std::vector<OwnedPiece> OwnedPieces(int u, int r) const;
  // Padding elements over all units (what the padding costs per full copy).
  size_t total_padding() const { return total_padded_ - total_numel_; }

 private:
  int world_;
  std::vector<UnitShardInfo> units_;
  size_t total_padded_ = 0, total_shard_ = 0, total_numel_ = 0;
};

}  // namespace shardgpt
