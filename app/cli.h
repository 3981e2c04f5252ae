// The command line: subcommands and flags (CLI11), MPI initialisation, error reporting.
// Every bad input ends in exactly one "shardgpt: error: ..." line and a non-zero exit on all
// ranks.
#pragma once

namespace shardgpt {

int Main(int argc, char** argv);

}  // namespace shardgpt
