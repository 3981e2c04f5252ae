// The command line: the subcommands' flags (app/train_flags.h, app/command_flags.h), parsed
// with CLI11, run under one Launcher (app/launcher.h). Every bad input ends in exactly one
// "shardgpt: error: ..." line and a non-zero exit on all ranks: 2 for a flag that does not
// parse, 1 for any other error.
#pragma once

namespace shardgpt {

// The program: parses argv, runs the chosen subcommand, returns the process's exit status.
int Main(int argc, char** argv);

}  // namespace shardgpt
