// MuonPlan: which elements are Muon's, which rank orthogonalises each Muon matrix, and which
// pieces of each matrix travel between which ranks (pure arithmetic on layout, plan and stage;
// the engine's ShardedMuon, `plan`'s prediction and the tests all use it).
//
// Muon matrices: every 2-D weight of the transformer blocks, with attn.c_attn.weight [3C, C]
// split into its q, k and v rows (three C x C matrices). Everything else (wte/wpe, the tied
// head, LayerNorms, biases) stays with AdamW.
//
// Owners: greedy longest-processing-time on Newton-Schulz FLOPs (largest matrix first, to the
// least-loaded rank, ties to the lower rank and the lower matrix index): deterministic, so
// every rank computes the same table.
//
// Exchange (stage >= 1; Muon's momentum and U are sharded element-wise like AdamW's moments):
//   phase 1: every rank sends the U values of its owned pieces of matrix k to owner(k);
//   phase 2: owner(k) sends every rank the update values of that rank's owned pieces.
// Stage 0 (every rank holds the whole averaged gradient and momentum): no phase 1; in phase 2
// the owner sends the whole update of its matrices to every other rank.
// Ownership of elements comes from ShardPlan::OwnedPieces, never from one assumed range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/param_layout.h"
#include "parallel/shard_plan.h"

namespace shardgpt {

struct MuonMatrix {
  std::string name;  // tensor name, with ".q" / ".k" / ".v" for the parts of c_attn.weight
  int unit = 0;
  size_t begin = 0;  // unit coordinates of its first element; the matrix is [begin, begin + rows*cols)
  int rows = 0, cols = 0;
  size_t numel() const { return static_cast<size_t>(rows) * cols; }
  size_t end() const { return begin + numel(); }
  // FLOPs of `steps` quintic iterations on the r x c orientation (r <= c): X X^T, A A, B X.
  double NsFlops(int steps) const;
};

// One contiguous run of a matrix's elements held by one rank: unit coordinates [begin, end),
// at `local` in that rank's owned buffer of the unit and at `in_matrix` in the matrix.
struct MuonSegment {
  int matrix = 0;
  size_t begin = 0, end = 0;
  size_t local = 0, in_matrix = 0;
  size_t size() const { return end - begin; }
};

class MuonPlan {
 public:
  // stage0: every rank holds whole units (no element sharding of the optimizer).
  MuonPlan(const ParamLayout& layout, const ShardPlan& plan, bool stage0, int ns_steps);

  const std::vector<MuonMatrix>& matrices() const { return matrices_; }
  int owner(int k) const { return owners_[k]; }
  size_t muon_numel() const { return muon_numel_; }
  // Sorted Muon element ranges [begin, end) of unit u (AdamW skips them).
  const std::vector<std::pair<size_t, size_t>>& muon_ranges(int u) const { return ranges_[u]; }
  // Segments of the matrices owned by `owner` that rank `holder` holds, in (matrix, piece)
  // order. whole: the holder holds whole units (stage 0).
  std::vector<MuonSegment> Segments(int owner, int holder, bool whole) const;
  bool stage0() const { return stage0_; }
  // Elements rank r sends in one step (its own block excluded): phase 1 + phase 2.
  uint64_t SentElements(int r) const;
  // Newton-Schulz FLOPs of the matrices rank r owns.
  double OwnerFlops(int r) const;

 private:
  const ShardPlan& plan_;
  bool stage0_;
  int ns_steps_;
  std::vector<MuonMatrix> matrices_;
  std::vector<int> owners_;
  std::vector<std::vector<std::pair<size_t, size_t>>> ranges_;
  size_t muon_numel_ = 0;
};

}  // namespace shardgpt
