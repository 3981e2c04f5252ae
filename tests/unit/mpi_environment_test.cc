// PrepareMpiEnvironment (app/launcher.h): under srun --mpi=pmix, and only there, Open MPI's
// direct modex is asked for before MPI_Init (MPI_Init then has no modex fence, inside which a
// faster peer's first message could reach ob1 before its handlers exist); a user's own
// setting is kept.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "app/launcher.h"

namespace shardgpt {
namespace {

constexpr const char* kAsync = "OMPI_MCA_pmix_base_async_modex";
constexpr const char* kCollect = "OMPI_MCA_pmix_base_collect_data";

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "(unset)" : v;
}

// A clean launch environment: srun's and mpirun's markers and the two settings unset.
void Clear() {
  for (const char* n : {"SLURM_STEP_ID", "PMIX_NAMESPACE", "OMPI_COMM_WORLD_SIZE", kAsync, kCollect}) unsetenv(n);
}

TEST(MpiEnvironment, SrunPmixGetsTheDirectModex) {
  Clear();
  setenv("SLURM_STEP_ID", "0", 1);
  setenv("PMIX_NAMESPACE", "slurm.pmix.42.0", 1);
  PrepareMpiEnvironment();
  EXPECT_EQ(Env(kAsync), "1");
  EXPECT_EQ(Env(kCollect), "0");
  Clear();
}

TEST(MpiEnvironment, MpirunAndASingleProcessAreLeftAlone) {
  Clear();  // a single process: no launcher
  PrepareMpiEnvironment();
  EXPECT_EQ(Env(kAsync), "(unset)");
  // mpirun inside a Slurm job: its ranks have SLURM_* and PMIX_* too, and OMPI_COMM_WORLD_SIZE
  setenv("SLURM_STEP_ID", "0", 1);
  setenv("PMIX_NAMESPACE", "prterun-x-1@1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  PrepareMpiEnvironment();
  EXPECT_EQ(Env(kAsync), "(unset)");
  EXPECT_EQ(Env(kCollect), "(unset)");
  Clear();
}

TEST(MpiEnvironment, TheUsersChoiceIsKept) {
  Clear();
  setenv("SLURM_STEP_ID", "0", 1);
  setenv("PMIX_NAMESPACE", "slurm.pmix.42.0", 1);
  setenv(kAsync, "0", 1);
  setenv(kCollect, "1", 1);
  PrepareMpiEnvironment();
  EXPECT_EQ(Env(kAsync), "0");
  EXPECT_EQ(Env(kCollect), "1");
  Clear();
}

}  // namespace
}  // namespace shardgpt
