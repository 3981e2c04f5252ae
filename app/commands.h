// The small subcommands: prepare (text -> token shards), sample (text from a model file) and
// plan (memory and traffic of a configuration, without training).
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/gpt.h"
#include "parallel/engine.h"

namespace shardgpt {

// Byte-level prepare (PrepareByteLevel), local, rank 0 only; `text_field` is the JSONL field of
// each document. Prints the split.
Status RunPrepare(const std::vector<std::string>& inputs, const std::string& out_dir, double val_fraction,
                  const std::string& text_field);

struct SampleOptions {
  std::string model_file;
  std::string checkpoint;  // alternative to model_file
  std::string tokenizer_file;
  std::string prompt = "\n";
  std::vector<int> prompt_ids;
  int tokens = 200;
  float temperature = 1.0f;
  int top_k = 40;
  uint64_t seed = 1337;
};
Status RunSample(const SampleOptions& options, int threads);

struct PlanOptions {
  GPTConfig model;
  EngineOptions engine;
  int ranks = 2;
  int micro_batch = 8;
  int seq_len = 128;
  int grad_accum = 1;
  double mem_gib = 0;  // > 0: say which stages fit in this much memory per rank
  Recompute recompute = Recompute::kNone;  // --recompute: the activations of the main table
  double memory_bytes = 0;  // --memory: > 0 prints the largest micro-batch per stage x recompute mode
  // --device cuda with --comm nccl (auto is nccl on cuda): the table gets a row for NCCL's own
  // buffers (parallel/nccl_memory.h), from the NCCL_* variables of plan's environment
  std::string device = "cpu";
  std::string comm = "auto";
  int ranks_per_node = 0;  // 0: min(ranks, 8)
  bool nvls = false;       // --nvls: NCCL uses NVLink SHARP (NVSwitch nodes) unless NCCL_NVLS_ENABLE=0
};

// "80GiB", "512MiB", "1.5TiB", "4096" (bytes); units B, KiB, MiB, GiB, TiB (powers of 1024) and
// KB, MB, GB, TB (powers of 1000). For --memory of `plan` and `train`.
StatusOr<double> ParseMemorySize(const std::string& text);
Status RunPlan(const PlanOptions& options);

}  // namespace shardgpt
