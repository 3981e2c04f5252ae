// Flag groups that several subcommands share (CLI11), and the numeric check they use. Each
// group holds the flags' parsed text; Add registers them on a subcommand, Resolve turns them
// into the options the commands take (after parsing).
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/gpt.h"
#include "model/muon.h"
#include "parallel/engine_options.h"

namespace shardgpt {

// EngineOptions::shard_group_size for --shard-group-size auto: resolved per run from the nodes
// (Launcher::AutoShardGroupSize).
constexpr int kAutoShardGroup = -1;

// Numbers that must be finite and above (or at least) a bound, and at most `hi`: NaN and inf
// are refused too, which CLI11's Range/PositiveNumber let through for floating point.
CLI::Validator Finite(double lo, bool lo_inclusive, double hi = HUGE_VAL);

// An integer in [lo, hi] (plain decimal, as AddStrictNumberChecks accepts) or the word auto:
// "expected <what> in [lo, hi] or auto, got <v>" otherwise. For --micro-batch and
// --shard-group-size, whose option text the caller resolves after parsing.
CLI::Validator IntOrAuto(long long lo, long long hi, const std::string& what);

// Flags that describe the model: a preset, then explicit overrides.
struct ModelFlags {
  std::string preset = "tiny";
  int n_layer = 0, n_head = 0, n_embd = 0, max_seq_len = 0, vocab_size = 0;
  // --arch and the llama options (0 / false: the architecture's default)
  std::string arch = "gpt2";
  int n_kv_head = 0, ffn_hidden = 0;
  double rope_theta = 0, norm_eps = 0;
  bool tie_embeddings = false;
  CLI::App* app = nullptr;  // set by Add
  void Add(CLI::App* app);
  // The shape flags given on the command line (--model and the overrides), e.g. "--n-layer 3",
  // with the value each sets in `cfg`; for refusing those that disagree with an imported model.
  struct Given {
    std::string flag;
    int value;
    int GPTConfig::*field;
  };
  std::vector<Given> GivenShape() const;
  // For each architecture flag given (--arch when arch_given, --rope-theta, --norm-eps,
  // --tie-embeddings) that differs from the imported model's config, one line naming the flag
  // and the model's value. Reads no CLI state (callable after the parser is gone).
  std::vector<std::string> GivenArch(const GPTConfig& imported, bool arch_given) const;
  // The preset with the overrides applied, validated. A --seq-len above the model's maximum
  // is the caller's error to report, never a silent raise.
  StatusOr<GPTConfig> Resolve() const;
};

// Flags of the data-parallel engine, shared by train and plan.
struct EngineFlags {
  int zero_stage = 0;
  std::string dtype = "fp32", reduce_dtype, reduce_grads = "every-micro", shard_layout = "flat";
  double bucket_mb = 25.0;
  bool reshard_after_forward = true;
  std::string shard_group_size;  // empty: all ranks
  std::string optimizer = "adamw";
  MuonConfig muon;
  void Add(CLI::App* app);
  // shard_group_size is kAutoShardGroup for --shard-group-size auto.
  EngineOptions Resolve() const;
};

// Flags of activation memory, shared by train and plan: --recompute and --memory.
struct RecomputeFlags {
  std::string recompute = "none", memory;
  void Add(CLI::App* app, const char* memory_help);
  Recompute mode() const;
  double memory_bytes() const;  // 0 when --memory is not given
};

}  // namespace shardgpt
