// The subcommands of the Hugging Face round trip: `prepare --tokenizer
// tokenizer.json` (byte-level BPE token shards) and `eval MODEL --data GLOB` (mean loss and
// perplexity over consecutive windows). `export --hf` is in ckpt_commands.h, `--init DIR` in
// io/llmc_model.h (LlmcModelReader opens HF directories too).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace shardgpt {

// Local, rank 0 only. Prints the split and tokens/s.
Status RunPrepareTokenizer(const std::string& tokenizer_json, const std::vector<std::string>& inputs,
                           const std::string& out_dir, double val_fraction, int threads,
                           const std::string& text_field);

struct EvalOptions {
  std::string model;  // llm.c .bin, HF GPT-2 / Llama directory or its model.safetensors, checkpoint or --ckpt-dir
  std::string data;   // glob of token shards
  int seq_len = 0;    // 0: the model's max_seq_len
  int micro_batch = 4;
  int64_t batches = 0;     // micro-batches in all (over every rank); 0: every window
  int threads = 1;         // compute threads per rank
  std::string logits_out;  // if set: rank 0 writes the first micro-batch's logits [B, T, V] as raw fp32
};
// Every rank loads the model and evaluates micro-batches b = rank, rank + N, ... of the
// windows k = 0, 1, ... (tokens [kT, kT + T + 1) of the files in order, as the loader's
// unshuffled windows); the sums are all-reduced over MPI_COMM_WORLD and rank 0 prints one JSON
// line {"loss", "perplexity", "tokens", ...}. Collective: every rank returns the same status
// (ranks other than 0 with an empty message, so the error prints once).
Status RunEval(const EvalOptions& options);

}  // namespace shardgpt
