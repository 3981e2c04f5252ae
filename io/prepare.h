// Prepare: turns plain text files into train.bin / val.bin token shards with the
// byte-level tokenizer, or with a Hugging Face byte-level BPE tokenizer.json (GPT-2's), so a
// run needs no external tokenization step.
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
  uint64_t input_bytes = 0;
  double seconds = 0;      // wall time of the encoding
};

// Reads `inputs` in the given order, concatenates their bytes (nothing inserted between
// files), and byte-level tokenizes them. The last floor(total * val_fraction) tokens go to
// out_dir/val.bin, the rest to out_dir/train.bin; out_dir is created if missing.
// val_fraction must be in [0, 1). Every input must exist, be readable and be non-empty.
// `stats` may be null.
Status PrepareByteLevel(const std::vector<std::string>& inputs, const std::string& out_dir,
                        double val_fraction = 0.05, PrepareStats* stats = nullptr);

class BpeTokenizer;

// What PrepareBpe does besides its inputs.
struct BpePrepareOptions {
  double val_fraction = 0.05;
  int threads = 1;        // encoding threads (documents and pieces of them in parallel)
  bool progress = false;  // a progress line on stderr (rewritten in place on a terminal)
};
// Encodes `inputs` with `tok`: every file is a document, preceded by the tokenizer's
// <|endoftext|> when it has one (as llm.c's data scripts do); the text is read in blocks and
// cut only where encoding the pieces apart gives the ids of the whole (BpeTokenizer::SafeCut),
// the pieces encoded by `threads` threads and streamed to out_dir/train.bin.tmp; the last
// floor(total * val_fraction) tokens then go to val.bin, the rest is renamed to train.bin.
// Vocabularies above 65,535 ids are refused (the shards hold uint16), as is text that is not
// UTF-8 (naming the file and byte); on any error nothing is left in out_dir. Every input is
// checked to be a readable non-empty file before anything is written.
Status PrepareBpe(const BpeTokenizer& tok, const std::vector<std::string>& inputs, const std::string& out_dir,
                  const BpePrepareOptions& options, PrepareStats* stats);

}  // namespace shardgpt
