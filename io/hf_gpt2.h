// Hugging Face GPT-2 model directories (config.json + model.safetensors), written for
// `export --hf` and read for `--init`, `eval` and `sample`.
//
// Names and layouts: HF calls our "h.3.attn.c_attn.weight" "transformer.h.3.attn.c_attn.weight"
// and stores the four block matrices as Conv1D weights, [in, out] (ours are [out, in] as in
// torch.nn.Linear), so they are transposed both ways. wte has the real vocabulary V rows
// (ours: V padded to a multiple of 128, the padded rows zero); the LM head is tied to wte and
// not stored (a stored one must equal wte: shardgpt has no untied head). Unprefixed names (GPT2Model's, as on the Hub's "gpt2") are accepted on read.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "io/safetensors.h"
#include "model/param_layout.h"

namespace shardgpt {

// True if path is a directory holding config.json, or a file whose name ends in .safetensors.
bool IsHfGpt2Path(const std::string& path);

// Writes dir/model.safetensors (fp32, or bf16 rounded to nearest even) and dir/config.json
// (GPT2LMHeadModel, gelu_new, eps 1e-5, tied embeddings, vocab_size unpadded); dir is created
// if missing. Each file goes through a temporary renamed into place.
Status WriteHfGpt2(const std::string& dir, const ParamLayout& layout, const float* params, bool bf16);

// Parses an HF GPT-2 config.json's text (errors start with `what`, then name the field): the
// five sizes (positive integers), and every option that changes what the model computes, which
// must be absent or at the one value shardgpt computes: activation_function "gelu_new" (or
// "gelu_pytorch_tanh"), layer_norm_epsilon 1e-5, n_inner null or 4 x n_embd,
// tie_word_embeddings true, scale_attn_weights true, scale_attn_by_inverse_layer_idx false,
// reorder_and_upcast_attn false, add_cross_attention false, is_encoder_decoder false,
// pruned_heads {}; dropout probabilities must be numbers in [0, 1) (not applied). A field of
// another JSON type (null included) is refused naming it. Other fields are not read.
StatusOr<GPTConfig> ParseHfGpt2Config(const std::string& what, const std::string& text);

// An HF GPT-2 directory whose config and tensor table were checked against each other: every
// expected tensor present once, at the shape config.json implies, in F32, BF16 or F16; nothing
// unexpected but the attention-mask buffers and an lm_head.weight equal to wte element for
// element (a tied head stored anyway; an untied one is refused naming it). Weights are read range
// by range in our flat layout order (as LlmcModelReader), so a ZeRO-3 rank reads only the
// tensors its owned ranges touch. Thread/rank contract: local; one reader per thread.
class HfGpt2Reader {
 public:
  // path: the directory, or its model.safetensors (config.json is then read beside it).
  static StatusOr<std::unique_ptr<HfGpt2Reader>> Open(const std::string& path);
  const GPTConfig& config() const { return config_; }
  // Elements [begin, end) of the global flat buffer (ParamLayout order) into dst: padded wte
  // rows are zero, Conv1D matrices transposed. A NaN or infinity is refused naming the tensor.
  Status ReadRange(uint64_t begin, uint64_t end, float* dst);
  uint64_t bytes_read() const { return st_->bytes_read(); }

 private:
  HfGpt2Reader() = default;
  struct Source {
    const SafetensorsEntry* entry = nullptr;
    bool transposed = false;  // a Conv1D matrix: HF [in, out] for our [out, in]
  };
  GPTConfig config_;
  std::unique_ptr<ParamLayout> layout_;
  std::unique_ptr<SafetensorsReader> st_;
  std::vector<Source> sources_;  // per layout tensor
  // the last transposed tensor read whole (a column of it is one of our rows)
  const SafetensorsEntry* cached_ = nullptr;
  std::vector<float> cache_;
};

}  // namespace shardgpt
