// main() for multi-rank GoogleTest binaries: initialises MPI with thread support, runs the
// tests on every rank, and prints the GoogleTest report from rank 0 only. A failing
// assertion on any rank makes the whole job fail (the exit code is all-reduced).
// Built with SHARDGPT_ALL_SKIPPED_EXIT=N (the GPU binaries: N = 77, CTest's SKIP_RETURN_CODE):
// where no test failed on any rank and every test that ran skipped on every rank, the job exits
// N, so that CTest reports it skipped; one skipped test never turns a sibling's failure into a
// skip.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_failed && local_failed) std::fprintf(stderr, "rank %d: tests failed\n", rank);
  int exit_code = any_failed;
#ifdef SHARDGPT_ALL_SKIPPED_EXIT
  const auto* unit = ::testing::UnitTest::GetInstance();
  int local_all_skipped = unit->test_to_run_count() > 0 && unit->skipped_test_count() == unit->test_to_run_count();
  int all_skipped = 0;
  MPI_Allreduce(&local_all_skipped, &all_skipped, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  if (!any_failed && all_skipped) exit_code = SHARDGPT_ALL_SKIPPED_EXIT;
#endif
  MPI_Finalize();
  return exit_code;
}
