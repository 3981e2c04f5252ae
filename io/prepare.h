// Prepare: turns plain text files into train.bin / val.bin token shards with the
// byte-level tokenizer, so a run needs no external tokenization step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace shardgpt {

// What PrepareByteLevel wrote.
struct PrepareStats {
  uint64_t total_tokens = 0;
  uint64_t train_tokens = 0;
  uint64_t val_tokens = 0;
  std::string train_path;  // out_dir/train.bin
  std::string val_path;    // out_dir/val.bin
};

// Reads `inputs` in the given order, concatenates their bytes (nothing inserted between
// files), and byte-level tokenizes them. The last floor(total * val_fraction) tokens go to
// out_dir/val.bin, the rest to out_dir/train.bin; out_dir is created if missing.
// val_fraction must be in [0, 1). Every input must exist, be readable and be non-empty.
// `stats` may be null.
Status PrepareByteLevel(const std::vector<std::string>& inputs, const std::string& out_dir,
                        double val_fraction = 0.05, PrepareStats* stats = nullptr);

}  // namespace shardgpt
