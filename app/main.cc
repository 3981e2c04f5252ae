// shardgpt executable: MPI set-up, then one subcommand (train, prepare, sample, plan).
#include "app/cli.h"
#include "base/passive_wait.h"

int main(int argc, char** argv) {
  shardgpt::EnsurePassiveOpenMPWait(argv);
  return shardgpt::Main(argc, argv);
}
