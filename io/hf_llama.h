// Hugging Face Llama model directories (LlamaForCausalLM: config.json + model.safetensors, or
// model-0000i-of-0000n.safetensors shards + model.safetensors.index.json), written for
// `export --hf` of an --arch llama model and read for `--init`, `eval` and `sample`.
//
// Names and layouts: our tensor table already uses HF's names with "model." dropped
// ("layers.3.self_attn.q_proj.weight" is HF's "model.layers.3.self_attn.q_proj.weight";
// "lm_head.weight" keeps its name); every matrix is [out, in] on both sides and RoPE is HF's
// rotate-half convention, so weights travel as they are. embed_tokens and lm_head have the real
// vocabulary V rows in HF (ours: V padded to a multiple of 128, the padded rows zero). A tied
// model (tie_word_embeddings true) stores no lm_head.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "io/safetensors.h"
#include "model/param_layout.h"

namespace shardgpt {

// Default for WriteHfLlama's max_shard_bytes: tensor bytes per safetensors file above which the
// export is sharded. The environment variable SHARDGPT_HF_MAX_SHARD_BYTES (a positive integer)
// overrides it for `export --hf` (HfMaxShardBytes).
constexpr uint64_t kHfDefaultMaxShardBytes = uint64_t{2} << 30;
// kHfDefaultMaxShardBytes, or SHARDGPT_HF_MAX_SHARD_BYTES when set; an unparsable value is an error.
StatusOr<uint64_t> HfMaxShardBytes();

// True if path is an HF directory (or a .safetensors inside one) whose config.json names a
// model_type other than "gpt2": it is read through HfLlamaReader (which refuses any model_type
// but "llama" by name). A config.json that is absent, not JSON or without model_type gives false
// (the GPT-2 reader then reports on it).
bool IsHfLlamaPath(const std::string& path);

// Writes dir/config.json (LlamaForCausalLM, the config's sizes, rms_norm_eps, rope_theta, vocab_size
// unpadded, tie_word_embeddings, hidden_act silu, no biases) and the weights under "model."-prefixed
// names (fp32, or bf16 rounded to nearest even): one dir/model.safetensors when the tensor bytes
// fit max_shard_bytes, else model-0000i-of-0000n.safetensors files (tensors in layout order, a
// new file when the next tensor would overflow the limit; a tensor larger than it alone in its
// file) and model.safetensors.index.json (total_size, weight_map). The other form's files left
// by an earlier export (and its shards this export did not rewrite) are removed, so the directory
// holds one model. rms_norm_eps and rope_theta are written as the shortest decimals that read back
// as our fp32 values. dir is created if missing;
// each file goes through a temporary renamed into place. Refuses a gpt2 layout.
Status WriteHfLlama(const std::string& dir, const ParamLayout& layout, const float* params, bool bf16,
                    uint64_t max_shard_bytes = kHfDefaultMaxShardBytes);

// Parses an HF Llama config.json's text (errors start with `what`, then name the field):
// model_type "llama"; hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
// max_position_embeddings, vocab_size (positive integers); num_key_value_heads (absent or null:
// num_attention_heads); rms_norm_eps (default 1e-6), rope_theta (default 10000) positive numbers;
// tie_word_embeddings (default false). Every option that changes the computation must be absent
// or at the value shardgpt computes: hidden_act "silu", attention_bias false, mlp_bias false,
// rope_scaling null, sliding_window null, head_dim null or hidden_size / num_attention_heads.
// pretraining_tp (a positive integer) is accepted: it only slices the same matmuls.
// attention_dropout must be a number in [0, 1) (not applied). A field of another JSON type is
// refused naming it. Other fields are not read.
StatusOr<GPTConfig> ParseHfLlamaConfig(const std::string& what, const std::string& text);

// An HF Llama directory whose config, index and tensor tables were checked against each other:
// every expected tensor present once, at the shape config.json implies, in F32, BF16 or F16, in
// the shard the index names; nothing unexpected but rotary inv_freq buffers (older saves) and,
// with tie_word_embeddings true, an lm_head.weight equal to embed_tokens element for element (a
// tied head saved anyway; a different one is refused naming it).
// Thread/rank contract: local; one reader per thread.
class HfLlamaReader {
 public:
  // path: the directory, or its model.safetensors (config.json is then read beside it).
  static StatusOr<std::unique_ptr<HfLlamaReader>> Open(const std::string& path);
  const GPTConfig& config() const { return config_; }
  // Elements [begin, end) of the global flat buffer (ParamLayout order) into dst: padded
  // embed_tokens / lm_head rows are zero. A NaN or infinity is refused naming the tensor.
  Status ReadRange(uint64_t begin, uint64_t end, float* dst);
  uint64_t bytes_read() const;

 private:
  HfLlamaReader() = default;
  struct Source {
    SafetensorsReader* file = nullptr;
    const SafetensorsEntry* entry = nullptr;
  };
  GPTConfig config_;
  std::unique_ptr<ParamLayout> layout_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::vector<Source> sources_;  // per layout tensor
};

}  // namespace shardgpt
