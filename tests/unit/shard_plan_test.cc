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
  for (int world = 1; world <= 7; world++) {
    const ShardPlan plan(L, world);
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
    }
  }
}

}  // namespace
}  // namespace shardgpt
