// Reading and writing llm.c GPT-2 model files (.bin), so GPT-2 weights converted with
// llm.c's scripts can be fine-tuned here and our models sampled by llm.c.
//
// Format: int32 header[256]: [0] 20240326, [1] version (3 = fp32, 5 = bf16), [2] max_seq_len,
// [3] vocab_size, [4] n_layer, [5] n_head, [6] n_embd, [7] padded_vocab_size; then every
// tensor, grouped by kind across layers: wte, wpe, ln1w[L], ln1b[L], qkvw[L], qkvb[L],
// attprojw[L], attprojb[L], ln2w[L], ln2b[L], fcw[L], fcb[L], fcprojw[L], fcprojb[L], lnfw, lnfb.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "model/param_layout.h"

namespace shardgpt {

struct LlmcModel {
  GPTConfig config;
  std::vector<float> params;  // in ParamLayout(config) order (the global flat buffer)
};

// Reads version 3 (fp32) or 5 (bf16, widened to fp32). Errors name the file and the problem.
// The header is checked field by field and the size it implies against the file's before
// anything is allocated; a NaN or infinite weight is refused naming the tensor.
StatusOr<LlmcModel> ReadLlmcModel(const std::string& path);
// Writes version 3 (fp32) from params in layout order, atomically (temp file + rename).
Status WriteLlmcModel(const std::string& path, const ParamLayout& layout, const float* params);

}  // namespace shardgpt
