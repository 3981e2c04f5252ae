// The `train` subcommand: its flags (CLI11) and what they resolve to on this rank.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "app/flags.h"
#include "app/launcher.h"
#include "app/train.h"
#include "base/status.h"

namespace shardgpt {

struct TrainFlags {
  TrainOptions options;  // the flags that map one to one; the rest are resolved by Resolve
  ModelFlags model;
  EngineFlags engine;
  RecomputeFlags recompute;
  Launcher::DeviceChoice device;
  std::string schedule = "cosine", gelu = "separate";
  std::string micro_batch = std::to_string(TrainOptions().micro_batch);  // a number, or auto
  bool no_shuffle = false;
  std::string trace_steps;  // --trace-steps A:B (Resolve sets options.trace_first / trace_last)
  CLI::App* command = nullptr;  // set by Register; *command is true when `train` was given

  // Adds `train` and its flags to app.
  void Register(CLI::App& app);
  // The parsed flags as TrainOptions: the model, the engine (--shard-group-size auto from
  // the nodes: collective), the batch and the schedule. The first flag that cannot be used is
  // the error.
  StatusOr<TrainOptions> Resolve(const Launcher& launcher) const;
  // Trains on this rank's device and communicator; *exit_code as RunTrain sets it. Collective.
  Status Run(Launcher& launcher, int* exit_code) const;
};

}  // namespace shardgpt
