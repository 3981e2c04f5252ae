// Checks shared by the readers of files that come from outside (llm.c model files,
// checkpoint indexes): a model config read from a file is checked field by field, and its
// parameter count is computed without overflow and without building the layout, so a
// reader can compare it with the file's size BEFORE allocating anything for it.
//
// Pure functions, no I/O; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "model/config.h"

namespace shardgpt {

// The largest parameter count a file may describe (2^50, a quadrillion, far above any model
// this program can hold). Keeps every size derived from a config inside 64 bits.
constexpr uint64_t kMaxFileParams = uint64_t{1} << 50;

// The config's fields as a file stores them: n_layer, n_head, n_embd, max_seq_len >= 1,
// n_embd divisible by n_head, vocab_size in [2, 2000000] (ids of a uint32 token shard, a
// bound that keeps the vocabulary's tables and logits within memory). The message starts with `where`
// and names the field ("x.bin: header n_embd 0 (expected >= 1)").
Status CheckFileConfig(const GPTConfig& c, const std::string& where);

// ParamLayout(c).total_numel() without building the layout: false when the config is not
// valid (CheckFileConfig) or the count exceeds kMaxFileParams.
bool FileParamCount(const GPTConfig& c, uint64_t* count);

}  // namespace shardgpt
