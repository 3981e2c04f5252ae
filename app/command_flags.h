// The subcommands other than `train` (prepare, sample, eval, plan, ckpt, export): each one's
// flags (CLI11), registered by its own Register, and its Run. A Run returns OK or the one
// error line the command ends with; the commands that run on one process run on rank 0 only.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "app/ckpt_commands.h"
#include "app/commands.h"
#include "app/flags.h"
#include "app/hf_commands.h"
#include "app/launcher.h"
#include "base/status.h"

namespace shardgpt {

struct PrepareFlags {
  std::vector<std::string> inputs;
  std::string out, tokenizer;
  std::string text_field = "text";
  double val_fraction = 0.05;
  int threads = 0;  // 0: the cores
  CLI::App* command = nullptr;
  void Register(CLI::App& app);
  Status Run(const Launcher& launcher) const;
};

struct SampleFlags {
  SampleOptions options;
  CLI::App* command = nullptr;
  void Register(CLI::App& app);
  Status Run(const Launcher& launcher) const;
};

struct EvalFlags {
  EvalOptions options;
  CLI::App* command = nullptr;
  void Register(CLI::App& app);
  Status Run(const Launcher& launcher) const;  // collective: every rank evaluates its windows
};

struct PlanFlags {
  PlanOptions options;
  ModelFlags model;
  EngineFlags engine;
  RecomputeFlags recompute;
  std::string act_dtype;
  CLI::App* command = nullptr;
  void Register(CLI::App& app);
  Status Run(const Launcher& launcher) const;
};

// `ckpt verify PATH` and `ckpt inspect PATH`.
struct CkptFlags {
  std::string path;
  CLI::App *command = nullptr, *verify = nullptr, *inspect = nullptr;
  void Register(CLI::App& app);
  Status Run(const Launcher& launcher) const;
};

// `diagnose DIR`: the flight dumps' verdict (app/diagnose.h); *exit_code 0 or kDiagnoseFound.
// `diagnose --merge-trace DIR [--output FILE]`: the ranks' --trace files merged (app/trace.h).
struct DiagnoseFlags {
  std::string dir, merge_trace, output;
  bool json = false;
  CLI::App* command = nullptr;
  void Register(CLI::App& app);
  Status Run(const Launcher& launcher, int* exit_code) const;
};

struct ExportFlags {
  std::string path;
  ExportOptions options;
  CLI::App* command = nullptr;
  void Register(CLI::App& app);
  Status Run(const Launcher& launcher) const;
};

}  // namespace shardgpt
