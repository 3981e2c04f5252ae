// The GPU choice before MPI starts: the launcher's node-local rank read from an injected
// environment, the GPU it maps to, and the --device value seen before the command line is parsed.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "app/launcher.h"
#include "model/device_factory.h"

namespace shardgpt {
namespace {

LauncherLocalRank FromEnv(const std::map<std::string, std::string>& env) {
  return LocalRankFromEnvironment([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(LocalRankFromEnvironment, NoneSet) {
  const LauncherLocalRank r = FromEnv({});
  EXPECT_EQ(r.rank, -1);
  EXPECT_EQ(r.variable, "");
}

TEST(LocalRankFromEnvironment, EachLauncherAlone) {
  EXPECT_EQ(FromEnv({{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}}).rank, 3);
  EXPECT_EQ(FromEnv({{"SLURM_LOCALID", "5"}}).rank, 5);
  EXPECT_EQ(FromEnv({{"SLURM_LOCALID", "5"}}).variable, "SLURM_LOCALID");
  EXPECT_EQ(FromEnv({{"MPI_LOCALRANKID", "2"}}).rank, 2);
  EXPECT_EQ(FromEnv({{"PMI_LOCAL_RANK", "7"}}).rank, 7);
  EXPECT_EQ(FromEnv({{"LOCAL_RANK", "0"}}).rank, 0);
  EXPECT_EQ(FromEnv({{"LOCAL_RANK", "0"}}).variable, "LOCAL_RANK");
}

TEST(LocalRankFromEnvironment, OrderOfPrecedence) {
  // mpirun inside a Slurm batch script: the batch step's SLURM_LOCALID=0 is inherited, mpirun's wins
  const LauncherLocalRank r = FromEnv({{"SLURM_LOCALID", "0"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "6"}});
  EXPECT_EQ(r.rank, 6);
  EXPECT_EQ(r.variable, "OMPI_COMM_WORLD_LOCAL_RANK");
  EXPECT_EQ(FromEnv({{"LOCAL_RANK", "1"}, {"PMI_LOCAL_RANK", "4"}}).rank, 4);
  EXPECT_EQ(FromEnv({{"LOCAL_RANK", "1"}, {"MPI_LOCALRANKID", "2"}, {"SLURM_LOCALID", "3"}}).rank, 3);
}

TEST(LocalRankFromEnvironment, MalformedValuesAreSkipped) {
  for (const char* bad : {"", "-1", "1a", " 1", "+2", "0x1", "2147483648", "99999999999"}) {
    const LauncherLocalRank r = FromEnv({{"OMPI_COMM_WORLD_LOCAL_RANK", bad}, {"SLURM_LOCALID", "2"}});
    EXPECT_EQ(r.rank, 2) << "'" << bad << "'";
    EXPECT_EQ(r.variable, "SLURM_LOCALID") << "'" << bad << "'";
    EXPECT_EQ(FromEnv({{"LOCAL_RANK", bad}}).rank, -1) << "'" << bad << "'";
  }
  EXPECT_EQ(FromEnv({{"LOCAL_RANK", "2147483647"}}).rank, 2147483647);
  EXPECT_EQ(FromEnv({{"LOCAL_RANK", "007"}}).rank, 7);
}

TEST(GpuForLocalRank, ModuloTheVisibleGpus) {
  // 8 GPUs visible to each of 8 ranks (--gpu-bind=none): rank r on GPU r
  for (int r = 0; r < 8; r++) EXPECT_EQ(GpuForLocalRank(r, 8), r);
  // one visible GPU (--gpu-bind=per_task:1): always that one
  for (int r = 0; r < 8; r++) EXPECT_EQ(GpuForLocalRank(r, 1), 0);
  // more ranks than GPUs: wraps around
  EXPECT_EQ(GpuForLocalRank(5, 4), 1);
  EXPECT_EQ(GpuForLocalRank(9, 4), 1);
  EXPECT_EQ(GpuForLocalRank(3, 2), 1);
  EXPECT_EQ(GpuForLocalRank(-1, 4), 3);
}

std::string DeviceOf(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return DeviceFlagBeforeParse(static_cast<int>(args.size()), argv.data());
}

TEST(DeviceFlagBeforeParse, FormsAndLastWins) {
  EXPECT_EQ(DeviceOf({"shardgpt", "train", "--data", "x"}), "");
  EXPECT_EQ(DeviceOf({"shardgpt", "train", "--device", "cuda", "--steps", "3"}), "cuda");
  EXPECT_EQ(DeviceOf({"shardgpt", "train", "--device=cuda"}), "cuda");
  EXPECT_EQ(DeviceOf({"shardgpt", "train", "--device", "cuda", "--device", "cpu"}), "cpu");
  EXPECT_EQ(DeviceOf({"shardgpt", "train", "--device=cpu", "--device", "cuda"}), "cuda");
  EXPECT_EQ(DeviceOf({"shardgpt", "train", "--device"}), "");  // no value: the parser reports it
  EXPECT_EQ(DeviceOf({"shardgpt", "train", "--device", "cuda", "--", "--device", "cpu"}), "cuda");
  EXPECT_EQ(DeviceOf({"shardgpt", "train", "--devices", "cuda"}), "");
}

}  // namespace
}  // namespace shardgpt
