// shardgpt executable: MPI set-up, then one subcommand (train, prepare, sample, plan).
#include "app/cli.h"

int main(int argc, char** argv) { return shardgpt::Main(argc, argv); }
