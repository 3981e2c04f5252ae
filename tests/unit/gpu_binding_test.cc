// SharedGpuError (parallel/gpu_binding.h): NCCL's one-GPU-per-rank rule decided from every
// rank's (host, PCI bus id), without a GPU. Slurm's --gpu-bind=per_task:1 (every rank sees
// one GPU, its own) passes; two ranks on one GPU of a host are named with the GPU.
#include "parallel/gpu_binding.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace shardgpt {
namespace {

const std::string kAdvice =
    "; NCCL needs one GPU per rank (check --gpu-bind / CUDA_VISIBLE_DEVICES, or use --comm mpi to share GPUs)";

// 8 ranks on each of `nodes` hosts, rank r on GPU r % 8 of host n<r/8>: what per_task:1 binding gives.
std::vector<RankGpu> PerTaskBinding(int nodes) {
  const char* bus[] = {"0000:19:00.0", "0000:3b:00.0", "0000:4c:00.0", "0000:5d:00.0",
                       "0000:9b:00.0", "0000:bb:00.0", "0000:cb:00.0", "0000:db:00.0"};
  std::vector<RankGpu> ranks;
  for (int r = 0; r < 8 * nodes; r++) ranks.push_back({"n" + std::to_string(r / 8), bus[r % 8]});
  return ranks;
}

TEST(SharedGpuError, OneGpuPerRankIsAccepted) {
  EXPECT_EQ(SharedGpuError({}), "");
  EXPECT_EQ(SharedGpuError({{"n1", "0000:19:00.0"}}), "");
  EXPECT_EQ(SharedGpuError(PerTaskBinding(1)), "");  // 8 ranks, each seeing 1 GPU: not a shared GPU
  EXPECT_EQ(SharedGpuError(PerTaskBinding(4)), "");  // the same bus ids on other hosts are other GPUs
}

TEST(SharedGpuError, TwoRanksOnOneGpuAreNamed) {
  std::vector<RankGpu> ranks = PerTaskBinding(1);
  ranks[3].bus_id = ranks[0].bus_id;
  EXPECT_EQ(SharedGpuError(ranks), "--comm nccl: ranks 0 and 3 on host n0 share GPU 0000:19:00.0" + kAdvice);
}

TEST(SharedGpuError, ThreeRanksAndMoreSharedGpus) {
  // host n1: ranks 1, 2 and 5 on one GPU, ranks 4 and 6 on another; host n0 fine
  std::vector<RankGpu> ranks = {{"n0", "0000:19:00.0"}, {"n1", "0000:19:00.0"}, {"n1", "0000:19:00.0"},
                                {"n0", "0000:3b:00.0"}, {"n1", "0000:3b:00.0"}, {"n1", "0000:19:00.0"},
                                {"n1", "0000:3b:00.0"}};
  EXPECT_EQ(SharedGpuError(ranks),
            "--comm nccl: ranks 1, 2 and 5 on host n1 share GPU 0000:19:00.0 (and 1 more GPU shared likewise)" + kAdvice);
  // every rank of a node on its GPU 0 (binding lost): one line, the others counted
  std::vector<RankGpu> all_on_zero;
  for (int r = 0; r < 16; r++) all_on_zero.push_back({"n" + std::to_string(r / 8), "0000:19:00.0"});
  EXPECT_EQ(SharedGpuError(all_on_zero), "--comm nccl: ranks 0, 1, 2, 3, 4, 5, 6 and 7 on host n0 share GPU "
                                         "0000:19:00.0 (and 1 more GPU shared likewise)" + kAdvice);
}

// The machine (boot id), where known, decides which ranks share a GPU, not the host name:
// containers on two nodes may both be called "trainer"; two containers on one node are one machine.
TEST(SharedGpuError, TheMachineIdNotTheHostNameDecides) {
  EXPECT_EQ(SharedGpuError({{"trainer", "0000:19:00.0", "boot-a"}, {"trainer", "0000:19:00.0", "boot-b"}}), "");
  EXPECT_EQ(SharedGpuError({{"c1", "0000:19:00.0", "boot-a"}, {"c2", "0000:3b:00.0", "boot-a"},
                            {"c3", "0000:19:00.0", "boot-a"}}),
            "--comm nccl: ranks 0 and 2 on host c1 share GPU 0000:19:00.0" + kAdvice);
}

TEST(SharedGpuError, ThisMachineIdIsKnownAndStable) {
  const std::string id = ThisMachineId();
  EXPECT_FALSE(id.empty()) << "neither /proc/sys/kernel/random/boot_id nor /etc/machine-id could be read";
  EXPECT_EQ(id, ThisMachineId());
}

TEST(SharedGpuError, UnknownBusIdsAreNotCompared) {
  EXPECT_EQ(SharedGpuError({{"n0", ""}, {"n0", ""}, {"n0", "0000:19:00.0"}}), "");
}

}  // namespace
}  // namespace shardgpt
