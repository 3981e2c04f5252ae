// ShardPlan's owned pieces: over all ranks they cover every real element of every unit
// exactly once, each piece lies inside its rank's shard, and no two pieces of one rank
// overlap there (what the optimizer, initialisation and checkpoints rely on).
#include "parallel/shard_plan.h"

#include <gtest/gtest.h>

#include <vector>

namespace shardgpt {
namespace {

GPTConfig Tiny() {
  GPTConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 24;
  c.max_seq_len = 16;
  c.vocab_size = 97;
  return c;
}

TEST(ShardPlan, OwnedPiecesCoverEveryElementOnce) {
  const ParamLayout L(Tiny());
  for (ShardLayout sl : {ShardLayout::kFlat, ShardLayout::kPerParam})
  for (int world = 1; world <= 7; world++) {
    SCOPED_TRACE(ShardLayoutName(sl));
    const ShardPlan plan(L, world, sl);
    for (int u = 0; u < plan.num_units(); u++) {
      const UnitShardInfo& s = plan.unit(u);
      std::vector<int> owners(s.numel, 0);
      for (int r = 0; r < world; r++) {
        std::vector<int> shard_used(s.shard, 0);
        for (const OwnedPiece& p : plan.OwnedPieces(u, r)) {
          ASSERT_LT(p.begin, p.end) << "world " << world << " unit " << u << " rank " << r;
          ASSERT_LE(p.end, s.numel);
          ASSERT_LE(p.shard_offset + (p.end - p.begin), s.shard);
          for (size_t i = p.begin; i < p.end; i++) owners[i]++;
          for (size_t i = 0; i < p.end - p.begin; i++) EXPECT_EQ(shard_used[p.shard_offset + i]++, 0);
        }
      }
      for (size_t i = 0; i < s.numel; i++)
        ASSERT_EQ(owners[i], 1) << "element " << i << " of unit " << u << ", world " << world;
      // The copy runs place every element once in the rank-major buffer, inside its rank's block.
      std::vector<int> placed(s.padded, 0);
      size_t copied = 0;
      for (const CopyRun& c : plan.CopyRuns(u)) {
        ASSERT_LE(c.rank_major + c.count, s.padded);
        for (size_t i = 0; i < c.count; i++) EXPECT_EQ(placed[c.rank_major + i]++, 0);
        copied += c.count;
      }
      EXPECT_EQ(copied, s.numel);
    }
  }
}

// Per-param: each piece is whole rows of one tensor, rank r's rows [r*R, (r+1)*R) with
// R = ceil(rows / N), so every rank's shard of a tensor has the same size; the flat layout
// pads each unit by < N elements.
TEST(ShardPlan, PerParamPiecesAreRowSlicesOfOneTensor) {
  const ParamLayout L(Tiny());
  const int N = 5;
  const ShardPlan plan(L, N, ShardLayout::kPerParam);
  for (int u = 0; u < plan.num_units(); u++)
    for (int r = 0; r < N; r++)
      for (const OwnedPiece& p : plan.OwnedPieces(u, r)) {
        const UnitInfo& ui = L.units()[u];
        const TensorInfo* t = nullptr;
        for (int i = ui.first_tensor; i < ui.first_tensor + ui.num_tensors; i++)
          if (L.tensors()[i].offset <= p.begin && p.begin < L.tensors()[i].offset + L.tensors()[i].numel)
            t = &L.tensors()[i];
        ASSERT_NE(t, nullptr);
        const size_t cols = t->numel / t->shape[0], R = (t->shape[0] + N - 1) / N;
        EXPECT_LE(p.end, t->offset + t->numel) << t->name << ": a piece crosses into the next tensor";
        EXPECT_EQ(p.begin - t->offset, r * R * cols) << t->name << " rank " << r;
        EXPECT_EQ(p.end - p.begin, std::min<size_t>(R, t->shape[0] - r * R) * cols) << t->name << " rank " << r;
      }
  const ShardPlan flat(L, N);
  for (int u = 0; u < flat.num_units(); u++) EXPECT_LT(flat.unit(u).padded - flat.unit(u).numel, size_t(N));
}

// The padding each layout costs, counted by hand for Tiny (C = 24, 2 layers, Vp = 128,
// maxT = 16) at N = 5. Per-param pads each tensor's rows to a multiple of 5:
//   wte [128, 24]: 2 rows; wpe [16, 24]: 4 rows        -> (2 + 4) * 24          = 144
//   per block: ln_1 w/b [24]: 1 each; c_attn w [72, 24]: 3 rows, b [72]: 3;
//     attn c_proj w [24, 24]: 1 row, b [24]: 1; ln_2 w/b: 1 each;
//     c_fc w [96, 24]: 4 rows, b [96]: 4; mlp c_proj w [24, 96]: 1 row, b [24]: 1
//     -> 1+1 + 72+3 + 24+1 + 1+1 + 96+4 + 96+1        = 301 per block
//   ln_f w/b [24]: 1 each                                = 2
// total 144 + 2 * 301 + 2 = 748. Flat: each unit to a multiple of 5.
TEST(ShardPlan, PaddingOfEachLayout) {
  const ParamLayout L(Tiny());
  ASSERT_EQ(L.config().padded_vocab(), 128);
  EXPECT_EQ(ShardPlan(L, 5, ShardLayout::kPerParam).total_padding(), 748u);
  size_t flat = 0;
  for (const UnitInfo& u : L.units()) flat += (5 - u.numel % 5) % 5;
  EXPECT_EQ(ShardPlan(L, 5).total_padding(), flat);
  EXPECT_EQ(ShardPlan(L, 1, ShardLayout::kPerParam).total_padding(), 0u);
}

}  // namespace
}  // namespace shardgpt
