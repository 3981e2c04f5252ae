// Prepare: turns text files and JSON Lines files (either gzip'd or not; io/text_input.h) into
// train.bin / val.bin token shards with the byte-level tokenizer, or with a Hugging Face
// byte-level BPE tokenizer.json (GPT-2's), so a run needs no external tokenization step.
//
// Both stream: the ids go to out_dir/train.bin.tmp (locked while written; removed on any
// error and on SIGINT, SIGTERM, SIGHUP, with out_dir when this prepare made it and it is
// empty), then the last floor(total * val_fraction) ids go to val.bin and the temporary is
// renamed onto train.bin. Every input is checked to be a readable non-empty file before
// anything is written.
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
  uint64_t input_bytes = 0;  // the inputs' file sizes (compressed, for gzip)
  double seconds = 0;      // wall time of the encoding
  int token_bytes = 2;     // 2: uint16 shards (GPT-2 format), 4: uint32 (Llama 3 format)
};

// Reads the documents of `inputs` in the given order (a text file is one, a JSONL record is
// one: its field `text_field`), concatenates their bytes (nothing inserted between
// documents), and byte-level tokenizes them into uint16 shards. The last
// floor(total * val_fraction) tokens go to out_dir/val.bin, the rest to out_dir/train.bin;
// out_dir is created if missing. val_fraction must be in [0, 1). `stats` may be null.
Status PrepareByteLevel(const std::vector<std::string>& inputs, const std::string& out_dir,
                        double val_fraction = 0.05, PrepareStats* stats = nullptr,
                        const std::string& text_field = "text");

class BpeTokenizer;

// What PrepareBpe does besides its inputs.
struct BpePrepareOptions {
  double val_fraction = 0.05;
  int threads = 1;        // encoding threads (documents and pieces of them in parallel)
  bool progress = false;  // a progress line on stderr (rewritten in place on a terminal)
  std::string text_field = "text";  // the JSONL field that holds each document
};
// Encodes `inputs` with `tok`: every document (a text file, a JSONL record) is preceded by
// the tokenizer's <|endoftext|> when it has one (as llm.c's data scripts do), else by its
// TemplateProcessing prefix (text_prefix: Llama 3's <|begin_of_text|>), else by nothing; the text is read
// in blocks of one or many documents and cut only where encoding the pieces apart gives the
// ids of the whole (BpeTokenizer::SafeCut), the pieces encoded by `threads` threads. The
// shards hold uint16 ids when the vocabulary has at most 65,536 ids, else uint32. Text that
// is not UTF-8 is refused (naming the file, or file:line, and the byte); on any error nothing
// is left in out_dir.
Status PrepareBpe(const BpeTokenizer& tok, const std::vector<std::string>& inputs, const std::string& out_dir,
                  const BpePrepareOptions& options, PrepareStats* stats);

}  // namespace shardgpt
