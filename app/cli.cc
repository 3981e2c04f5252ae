#include "app/cli.h"

#include <CLI/CLI.hpp>
#include <mpi.h>
#include <cstdio>
#include <new>
#include <stdexcept>

#include "app/cli_numbers.h"
#include "app/command_flags.h"
#include "app/launcher.h"
#include "app/train_flags.h"
#include "model/device.h"

namespace shardgpt {

int Main(int argc, char** argv) {
  InstallStopSignalHandlers();  // before MPI starts: see train.h
  Launcher launcher(&argc, &argv);

  CLI::App app{"shardgpt: train GPT models with DDP / ZeRO-1/2/3 over MPI"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all");
  // a flag given twice takes the last value, as argparse does (scripts append overrides)
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  TrainFlags train;
  PrepareFlags prepare;
  SampleFlags sample;
  EvalFlags eval;
  PlanFlags plan;
  CkptFlags ckpt;
  ExportFlags exporter;
  DiagnoseFlags diagnose;
  // the order of --help
  train.Register(app);
  prepare.Register(app);
  sample.Register(app);
  eval.Register(app);
  plan.Register(app);
  ckpt.Register(app);
  exporter.Register(app);
  diagnose.Register(app);
  AddStrictNumberChecks(&app);  // plain decimal numbers only, on every subcommand

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (launcher.rank() == 0) {
      if (e.get_exit_code() == 0) app.exit(e);  // --help
      else std::fprintf(stderr, "shardgpt: error: %s (see --help)\n", e.what());
    }
    return e.get_exit_code() == 0 ? 0 : 2;
  }

  int rc = 0;
  Status st;
  if (!*train.command) RestoreDefaultStopSignalHandlers();
  // Out of memory that a command does not turn into its own line (train and eval do, naming
  // the flags to change) is one line here, never an abort trace; on several ranks the others
  // may wait in a collective, so they are ended.
  try {
    if (*train.command) st = train.Run(launcher, &rc);
    else if (*prepare.command) st = prepare.Run(launcher);
    else if (*ckpt.command) st = ckpt.Run(launcher);
    else if (*exporter.command) st = exporter.Run(launcher);
    else if (*sample.command) st = sample.Run(launcher);
    else if (*eval.command) st = eval.Run(launcher);
    else if (*plan.command) st = plan.Run(launcher);
    else if (*diagnose.command) st = diagnose.Run(launcher, &rc);
  } catch (const std::exception& e) {  // DeviceOutOfMemory, std::bad_alloc
    const bool oom = dynamic_cast<const std::bad_alloc*>(&e) != nullptr ||
                     dynamic_cast<const DeviceOutOfMemory*>(&e) != nullptr;
    if (!oom) throw;
    std::string what = e.what();
    if (what.rfind("out of host memory", 0) != 0) what = "out of host memory (" + what + ")";
    std::fprintf(stderr, "shardgpt: error: rank %d: %s: %s; the model or its inputs do not fit in this process's "
                 "memory (a smaller model, --micro-batch, --seq-len, or more memory)\n",
                 launcher.rank(), app.get_subcommands().empty() ? "" : app.get_subcommands()[0]->get_name().c_str(),
                 what.substr(0, what.find(';')).c_str());
    std::fflush(stderr);
    if (launcher.world_size() > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  if (!st.ok()) {
    if (!st.message().empty()) std::fprintf(stderr, "shardgpt: error: %s\n", st.message().c_str());
    if (rc == 0) rc = 1;  // a command may have set its own (75: requeue after failed checkpoints)
  }
  std::fflush(stdout);
  return rc;
}

}  // namespace shardgpt
