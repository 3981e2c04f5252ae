// ShardPlan: which elements of each unit every rank owns, in one of two layouts, and how a
// unit's N shards sit in the rank-major buffer its all-gather fills / its reduce-scatter reads.
//
//   kFlat (FSDP1)     A unit's flat buffer of n elements is padded with zeros to
//                     P = ceil(n / N) * N elements and split into N equal shards of S = P / N;
//                     rank r owns the real elements [r*S, min((r+1)*S, n)). Shards cross tensor
//                     boundaries freely; the rank-major buffer IS the unit's flat buffer, so
//                     collectives run on it in place. Padding: at most N-1 elements per unit.
//   kPerParam (FSDP2) Every tensor is split on its own along dim 0: a tensor of `rows` rows
//                     (a 1-D tensor: one element per row) of c elements each gets R =
//                     ceil(rows / N) rows per rank, rank r owning rows [r*R, min((r+1)*R, rows)).
//                     Rank r's shard of the unit is the concatenation of its row-slices of the
//                     unit's tensors, each padded to R*c: S = sum over tensors of R*c, P = N*S.
//                     Padding: up to (N-1)*c elements per TENSOR. The rank-major buffer
//                     (shard 0, shard 1, ...) is not the unit's flat order: after an all-gather
//                     each tensor is copied out of it into its place in the unit (CopyRuns),
//                     and a full gradient is copied into it before a reduce-scatter.
//
// Everything the optimizer, initialisation and checkpoints touch is expressed as OwnedPieces
// (one per flat shard; one per tensor row-slice), so no code outside this file knows the layout.
// The plan is pure arithmetic on (param layout, N, shard layout): checkpoints store the pieces,
// and resharding on load is the intersection of the saved pieces with the loading run's.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/param_layout.h"

namespace shardgpt {

enum class ShardLayout { kFlat, kPerParam };
const char* ShardLayoutName(ShardLayout l);  // "flat", "per-param"
// "flat" or "per-param"; anything else is InvalidArgument naming --shard-layout.
StatusOr<ShardLayout> ParseShardLayout(const std::string& s);

struct UnitShardInfo {
  size_t numel = 0;          // real elements of the unit
  size_t padded = 0;         // N * shard: the rank-major buffer (and every full buffer of the unit)
  size_t shard = 0;          // elements of one rank's shard of the unit, padding included
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

// One contiguous copy between a unit's flat order and its rank-major buffer: `count` elements
// at unit offset `begin` <-> rank-major offset `rank_major`.
struct CopyRun {
  size_t begin = 0, count = 0, rank_major = 0;
};

class ShardPlan {
 public:
  ShardPlan(const ParamLayout& layout, int world_size, ShardLayout shard_layout = ShardLayout::kFlat);

  int world_size() const { return world_; }
  ShardLayout shard_layout() const { return shard_layout_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  const UnitShardInfo& unit(int u) const { return units_[u]; }
  size_t total_padded() const { return total_padded_; }
  size_t total_shard() const { return total_shard_; }
  // The real elements of unit u owned by rank r, in shard order (flat: one piece, or none
  // when r owns only padding; per-param: one per tensor with rows on r).
  const std::vector<OwnedPiece>& OwnedPieces(int u, int r) const { return pieces_[u][r]; }
  // Whether a unit's rank-major buffer equals its flat order (flat layout: collectives work
  // in place, no copies).
  bool rank_major_is_flat() const { return shard_layout_ == ShardLayout::kFlat; }
  // Every piece of every rank of unit u as a copy between flat order and rank-major order
  // (the FSDP2 copy-out after an all-gather, copy-in before a reduce-scatter).
  const std::vector<CopyRun>& CopyRuns(int u) const { return runs_[u]; }
  // Padding elements over all units (what the padding costs per full copy).
  size_t total_padding() const { return total_padded_ - total_numel_; }

 private:
  int world_;
  ShardLayout shard_layout_;
  std::vector<UnitShardInfo> units_;
  std::vector<std::vector<std::vector<OwnedPiece>>> pieces_;  // [unit][rank]
  std::vector<std::vector<CopyRun>> runs_;                    // [unit]
  size_t total_padded_ = 0, total_shard_ = 0, total_numel_ = 0;
};

}  // namespace shardgpt
