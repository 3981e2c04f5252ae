#include "app/cli.h"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "app/cli_numbers.h"
#include "app/command_flags.h"
#include "app/launcher.h"
#include "app/train_flags.h"

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
  if (*train.command) st = train.Run(launcher, &rc);
  else if (*prepare.command) st = prepare.Run(launcher);
  else if (*ckpt.command) st = ckpt.Run(launcher);
  else if (*exporter.command) st = exporter.Run(launcher);
  else if (*sample.command) st = sample.Run(launcher);
  else if (*eval.command) st = eval.Run(launcher);
  else if (*plan.command) st = plan.Run(launcher);
  else if (*diagnose.command) st = diagnose.Run(launcher, &rc);
  if (!st.ok()) {
    if (!st.message().empty()) std::fprintf(stderr, "shardgpt: error: %s\n", st.message().c_str());
    rc = 1;
  }
  std::fflush(stdout);
  return rc;
}

}  // namespace shardgpt
