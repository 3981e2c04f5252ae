// GPTConfig: the shape of a GPT-2 family model, and the named presets.
//
// The config is the model's identity: checkpoints and llm.c model files are refused when
// theirs differs. Training-time choices (batch, sequence length used, precision) are not
// part of it.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace shardgpt {

struct GPTConfig {
  int n_layer = 2;
  int n_head = 4;
  int n_embd = 64;
  int max_seq_len = 128;  // rows of the position embedding; training T may be shorter
  int vocab_size = 256;   // real vocabulary V; the model pads it to padded_vocab()

  // V rounded up to a multiple of 128 (as llm.c): padded logits never win, never get probability.
  int padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
  int head_size() const { return n_embd / n_head; }
  // Checks that the numbers make a model (positive, n_embd divisible by n_head, ...).
  Status Validate() const;
  // "L12 H12 C768 V50257 T1024"
  std::string ToString() const;
  // The first field that differs from other, as "n_layer: 12 vs 6", or "" when equal.
  std::string FirstDifference(const GPTConfig& other) const;
};

// Presets: tiny (tests), d6, d12 (GPT-2 124M), d24 (350M), d36 (774M), d48 (1558M).
StatusOr<GPTConfig> PresetConfig(const std::string& name);
std::vector<std::string> PresetNames();

}  // namespace shardgpt
