// main() for multi-rank GoogleTest binaries: initialises MPI with thread support, runs the
// tests on every rank, and prints the GoogleTest report from rank 0 only. A failing
// assertion on any rank makes the whole job fail (the exit code is all-reduced).
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
  MPI_Finalize();
  return any_failed;
}
