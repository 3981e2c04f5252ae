// Reading and writing llm.c GPT-2 model files (.bin), so GPT-2 weights converted with
// llm.c's scripts can be fine-tuned here and our models sampled by llm.c.
//
// Format: int32 header[256]: [0] 20240326, [1] version (3 = fp32, 5 = bf16), [2] max_seq_len,
// [3] vocab_size, [4] n_layer, [5] n_head, [6] n_embd, [7] padded_vocab_size; then every
// tensor, grouped by kind across layers: wte, wpe, ln1w[L], ln1b[L], qkvw[L], qkvb[L],
// attprojw[L], attprojb[L], ln2w[L], ln2b[L], fcw[L], fcb[L], fcprojw[L], fcprojb[L], lnfw, lnfb.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/param_layout.h"

namespace shardgpt {
class HfGpt2Reader;
class HfLlamaReader;
}

namespace shardgpt {

struct LlmcModel {
  GPTConfig config;
  std::vector<float> params;  // in ParamLayout(config) order (the global flat buffer)
};

// Reads version 3 (fp32) or 5 (bf16, widened to fp32). Errors name the file and the problem.
// The header is checked field by field and the size it implies against the file's before
// anything is allocated; a NaN or infinite weight is refused naming the tensor.
StatusOr<LlmcModel> ReadLlmcModel(const std::string& path);
// An llm.c model file whose header and size were checked, read range by range: how --init
// fills a sharded engine with only the elements each rank owns (ZeRO-3 never holds the full
// model on any rank). Open also takes a Hugging Face GPT-2 directory (or its
// model.safetensors) and reads it through HfGpt2Reader (io/hf_gpt2.h), or, when its config.json
// names another model_type, through HfLlamaReader (io/hf_llama.h: LlamaForCausalLM, single or
// sharded), so --init, eval and sample accept all three. Thread/rank contract: local; one reader per thread.
class LlmcModelReader {
 public:
  // Checks the header field by field and the file size it implies (the same checks and
  // messages as ReadLlmcModel); reads no weights. An HF path: config.json and the tensor table.
  static StatusOr<std::unique_ptr<LlmcModelReader>> Open(const std::string& path);
  ~LlmcModelReader();
  const GPTConfig& config() const { return config_; }
  // Elements [begin, end) of the global flat buffer (ParamLayout order) into dst, widening
  // bf16: a seek and a read per tensor piece the range touches (the file groups tensors by
  // kind, not by unit). A NaN or infinity is refused naming the tensor and element.
  Status ReadRange(uint64_t begin, uint64_t end, float* dst);
  // Weight bytes read from the file so far (the header excluded).
  uint64_t bytes_read() const;

 private:
  LlmcModelReader() = default;
  struct Piece {
    uint64_t global, numel, file_elem;  // offset in the flat buffer, size, element offset in the file
    std::string name;
  };
  std::string path_;
  int fd_ = -1;
  int version_ = 3;
  GPTConfig config_;
  std::vector<Piece> pieces_;  // every tensor, sorted by global offset
  uint64_t bytes_read_ = 0;
  std::unique_ptr<HfGpt2Reader> hf_;         // set when Open was given a Hugging Face GPT-2 path
  std::unique_ptr<HfLlamaReader> hf_llama_;  // set when Open was given a Hugging Face Llama path
};

// Writes version 3 (fp32) from params in layout order, atomically (temp file + rename).
Status WriteLlmcModel(const std::string& path, const ParamLayout& layout, const float* params);

}  // namespace shardgpt
