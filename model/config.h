// GPTConfig: the shape of a GPT-2 or Llama family model, and the named presets.
//
// The config is the model's identity: checkpoints and llm.c model files are refused when
// theirs differs. Training-time choices (batch, sequence length used, precision) are not
// part of it.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace shardgpt {

// The block architecture. kGpt2: LayerNorm, learned positions, GELU MLP, multi-head attention,
// biases, the LM head tied to wte. kLlama: RMSNorm, rotary positions on q and k, SwiGLU MLP,
// grouped-query attention, no biases, the head tied or not (tie_embeddings).
enum class Arch { kGpt2, kLlama };
const char* ArchName(Arch a);  // "gpt2", "llama"

struct GPTConfig {
  // The widest llama n_embd and ffn_hidden Validate accepts (so that q|k|v and gate|up widths fit
  // an int).
  static constexpr int kMaxLlamaWidth = 1 << 22;

  int n_layer = 2;
  int n_head = 4;
  int n_embd = 64;
  int max_seq_len = 128;  // gpt2: rows of the position embedding; llama: the longest T trained
  int vocab_size = 256;   // real vocabulary V; the model pads it to padded_vocab()
  Arch arch = Arch::kGpt2;
  // Llama only (a GPT-2 config keeps the defaults; Validate refuses others):
  int n_kv_head = 0;             // key/value heads, dividing n_head (0: n_head, plain multi-head)
  int ffn_hidden = 0;            // SwiGLU hidden width F (0: 8/3 C rounded up to a multiple of 256)
  float rope_theta = 10000.0f;   // rotary base: frequency i of a head is theta^(-2i/hs)
  float norm_eps = 1e-5f;        // RMSNorm's epsilon
  bool tie_embeddings = true;    // gpt2: always; llama: the LM head is the token embedding

  // V rounded up to a multiple of 128 (as llm.c): padded logits never win, never get probability.
  int padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
  int head_size() const { return n_embd / n_head; }
  bool llama() const { return arch == Arch::kLlama; }
  // Key/value heads (n_head for gpt2) and the MLP's hidden width (4C for gpt2).
  int kv_heads() const { return llama() && n_kv_head > 0 ? n_kv_head : n_head; }
  int ffn() const;
  // Width of the fused q|k|v projection's output: (n_head + 2 kv_heads) x head_size (3C for gpt2).
  int qkv_width() const { return (n_head + 2 * kv_heads()) * head_size(); }
  // Checks that the numbers make a model (positive, n_embd divisible by n_head, ...).
  Status Validate() const;
  // "L12 H12 C768 V50257 T1024"; llama appends its own fields: "llama KV4 F2048 theta10000 ..."
  std::string ToString() const;
  // The first field that differs from other, as "n_layer: 12 vs 6", or "" when equal.
  std::string FirstDifference(const GPTConfig& other) const;
};

// Presets: tiny (tests), d6, d12 (GPT-2 124M), d24 (350M), d36 (774M), d48 (1558M).
StatusOr<GPTConfig> PresetConfig(const std::string& name);
std::vector<std::string> PresetNames();

}  // namespace shardgpt
