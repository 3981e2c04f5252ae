// The estimate of NCCL's own device memory (parallel/nccl_memory.h) against hand-worked cases.
#include "parallel/nccl_memory.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace shardgpt {
namespace {

constexpr double MiB = 1024.0 * 1024;

NcclMemoryAssumptions Env(const std::map<std::string, std::string>& env, bool nvls_available) {
  return NcclAssumptionsFromEnvironment(
      [&env](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      nvls_available);
}

// 8 ranks on one node, no HSDP, NCCL's defaults, no NVLS: one communicator, 16 channels x 2
// connections = 32 buffer sets of 4 MiB (Simple) + 0.5 MiB (LL) + 4.6875 MiB (LL128):
// 128 MiB + 166 MiB = 294 MiB.
TEST(NcclMemory, OneNodeDefaults) {
  const NcclMemoryEstimate e = EstimateNcclMemory(8, 8, 8, Env({}, false));
  ASSERT_EQ(e.comms.size(), 1u);
  EXPECT_EQ(e.comms[0].name, "world");
  EXPECT_DOUBLE_EQ(e.simple(), 128 * MiB);
  EXPECT_DOUBLE_EQ(e.ll(), 166 * MiB);
  EXPECT_DOUBLE_EQ(e.nvls(), 0);
  EXPECT_DOUBLE_EQ(e.total(), 294 * MiB);
}

// The same with NVLS: 16 channels x 2 x 128 KiB x 8 steps x 8 local ranks = 256 MiB more.
TEST(NcclMemory, OneNodeWithNvls) {
  const NcclMemoryEstimate e = EstimateNcclMemory(8, 8, 8, Env({}, true));
  EXPECT_DOUBLE_EQ(e.nvls(), 256 * MiB);
  EXPECT_DOUBLE_EQ(e.total(), 550 * MiB);
  EXPECT_DOUBLE_EQ(EstimateNcclMemory(8, 8, 8, Env({{"NCCL_NVLS_ENABLE", "0"}}, true)).nvls(), 0);
  EXPECT_DOUBLE_EQ(EstimateNcclMemory(8, 8, 8, Env({{"NCCL_NVLS_ENABLE", "1"}}, true)).nvls(), 256 * MiB);
}

// HSDP on 2 nodes of 8 (G = 8): world (16 ranks, 8 local) 294 + 256 NVLS, shard (8, 8 local)
// 294 + 256, replica (2 ranks, one per node: 1 local, no NVLS) 294: 1394 MiB.
TEST(NcclMemory, HsdpTwoNodes) {
  const NcclMemoryEstimate e = EstimateNcclMemory(16, 8, 8, Env({}, true));
  ASSERT_EQ(e.comms.size(), 3u);
  EXPECT_EQ(e.comms[1].name, "shard");
  EXPECT_EQ(e.comms[1].ranks, 8);
  EXPECT_EQ(e.comms[1].local_ranks, 8);
  EXPECT_EQ(e.comms[2].name, "replica");
  EXPECT_EQ(e.comms[2].ranks, 2);
  EXPECT_EQ(e.comms[2].local_ranks, 1);
  EXPECT_DOUBLE_EQ(e.comms[2].nvls, 0);
  EXPECT_DOUBLE_EQ(e.nvls(), 512 * MiB);
  EXPECT_DOUBLE_EQ(e.total(), 1394 * MiB);
}

// HSDP inside one node of 4 (G = 2): world (4 ranks, 4 local) 294 + NVLS 16x2x0.125x8x4 = 128;
// shard (2, 2 local) 294 + 64; replica (2, 2 local: both groups on the node) 294 + 64: 1138 MiB.
TEST(NcclMemory, HsdpInsideOneNode) {
  const NcclMemoryEstimate e = EstimateNcclMemory(4, 2, 4, Env({}, true));
  ASSERT_EQ(e.comms.size(), 3u);
  EXPECT_DOUBLE_EQ(e.comms[0].nvls, 128 * MiB);
  EXPECT_DOUBLE_EQ(e.comms[1].nvls, 64 * MiB);
  EXPECT_EQ(e.comms[2].local_ranks, 2);
  EXPECT_DOUBLE_EQ(e.comms[2].nvls, 64 * MiB);
  EXPECT_DOUBLE_EQ(e.total(), 1138 * MiB);
}

TEST(NcclMemory, OneRankConnectsNothing) {
  const NcclMemoryEstimate e = EstimateNcclMemory(1, 1, 1, Env({}, true));
  ASSERT_EQ(e.comms.size(), 1u);
  EXPECT_DOUBLE_EQ(e.total(), 0);
}

TEST(NcclMemory, EnvironmentOverrides) {
  // NCCL_BUFFSIZE 8 MiB: the Simple part doubles (128 -> 256 MiB), LL and LL128 do not change
  const NcclMemoryEstimate twice = EstimateNcclMemory(8, 8, 8, Env({{"NCCL_BUFFSIZE", "8388608"}}, false));
  EXPECT_DOUBLE_EQ(twice.simple(), 256 * MiB);
  EXPECT_DOUBLE_EQ(twice.ll(), 166 * MiB);
  // NCCL_MAX_NCHANNELS=8: half the channels, half of everything: 147 MiB
  EXPECT_DOUBLE_EQ(EstimateNcclMemory(8, 8, 8, Env({{"NCCL_MAX_NCHANNELS", "8"}}, false)).total(), 147 * MiB);
  // NCCL_MIN_NCHANNELS=32: twice the channels
  EXPECT_DOUBLE_EQ(EstimateNcclMemory(8, 8, 8, Env({{"NCCL_MIN_NCHANNELS", "32"}}, false)).total(), 588 * MiB);
  // NVLS chunk 256 KiB and 8 NVLS channels: 8 x 2 x 0.25 x 8 x 8 = 256 MiB
  EXPECT_DOUBLE_EQ(
      EstimateNcclMemory(8, 8, 8, Env({{"NCCL_NVLS_CHUNKSIZE", "262144"}, {"NCCL_NVLS_NCHANNELS", "8"}}, true)).nvls(),
      256 * MiB);
  // values that are not positive decimal integers are ignored
  for (const char* bad : {"4M", "", "-1", "0", "0x400000", " 4194304"})
    EXPECT_DOUBLE_EQ(EstimateNcclMemory(8, 8, 8, Env({{"NCCL_BUFFSIZE", bad}}, false)).simple(), 128 * MiB) << bad;
}

// Properties: HSDP adds communicators, so costs more than the same world without it; doubling
// NCCL_BUFFSIZE doubles the buffer part whatever the configuration.
TEST(NcclMemory, Properties) {
  for (bool nvls : {false, true}) {
    for (int world : {4, 8, 16, 64}) {
      for (int node : {1, 4, 8}) {
        const double flat = EstimateNcclMemory(world, world, node, Env({}, nvls)).total();
        for (int g = 2; g < world; g *= 2) {
          EXPECT_GT(EstimateNcclMemory(world, g, node, Env({}, nvls)).total(), flat) << world << " " << g << " " << node;
          const double one = EstimateNcclMemory(world, g, node, Env({}, nvls)).simple();
          const double two = EstimateNcclMemory(world, g, node, Env({{"NCCL_BUFFSIZE", "8388608"}}, nvls)).simple();
          EXPECT_DOUBLE_EQ(two, 2 * one);
        }
      }
    }
  }
}

TEST(NcclMemory, DescribeNamesTheAssumptions) {
  const NcclMemoryAssumptions a = Env({}, true);
  const std::string d = EstimateNcclMemory(16, 8, 8, a).Describe(a);
  EXPECT_NE(d.find("3 communicators (world 16 ranks, shard 8, replica 2)"), std::string::npos) << d;
  EXPECT_NE(d.find("16 channels x 2 connections x (NCCL_BUFFSIZE 4 MiB + LL 0.5 MiB + LL128 4.6875 MiB)"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("NVLS"), std::string::npos) << d;
}

}  // namespace
}  // namespace shardgpt
