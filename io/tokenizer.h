// Tokenizers: the byte-level tokenizer that PrepareByteLevel uses, and a decode table
// read from an llm.c tokenizer file (e.g. gpt2_tokenizer.bin), used to print samples.
//
// llm.c tokenizer files hold only each token's bytes, not the BPE merges, so a table read
// from one can decode but not encode. See docs/DATA.md for the file format.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace shardgpt {

constexpr int32_t kLlmcTokenizerMagic = 20240328;

// Byte-level tokenization: token id = byte value, vocab 256, no special tokens.
// Lossless for any byte string, which makes it the zero-setup choice for demos.
class ByteLevelTokenizer {
 public:
  static constexpr int kVocabSize = 256;
  static std::vector<uint16_t> Encode(const std::string& text);
  // The single byte `id`; ids outside [0, 256) decode to Tokenizer::kUnknown.
  static std::string Decode(int id);
};

// A decode table: id -> bytes. Built for byte level, or loaded from an llm.c file.
class Tokenizer {
 public:
  // What Decode returns for an id outside [0, vocab_size): visible in printed text and
  // never confused with a crash.
  static constexpr const char* kUnknown = "<?>";

  // The 256-entry table of ByteLevelTokenizer; eot_token() is -1 (it has none).
  static Tokenizer ByteLevel();
  // A table from given pieces (id -> bytes), e.g. a BPE tokenizer's (io/bpe_tokenizer.h).
  static Tokenizer FromPieces(std::vector<std::string> pieces, int eot_token);

  int vocab_size() const { return static_cast<int>(pieces_.size()); }
  // End-of-text id (llm.c version 1 files: 50256), or -1 when there is none.
  int eot_token() const { return eot_token_; }
  // The token's bytes (may be invalid UTF-8 on its own), or kUnknown for a bad id.
  std::string Decode(int id) const;
  // Concatenated Decode of each id.
  std::string DecodeAll(const std::vector<int>& ids) const;

 private:
  friend StatusOr<Tokenizer> LoadLlmcTokenizer(const std::string& path);
  std::vector<std::string> pieces_;
  int eot_token_ = -1;
};

// Reads an llm.c tokenizer file: int32[256] header (header[0] = 20240328, header[1] =
// version 1 or 2, header[2] = vocab size, header[3] = eot token in version 2), then per
// token a uint8 length and that many bytes. Errors name the file and what is wrong.
StatusOr<Tokenizer> LoadLlmcTokenizer(const std::string& path);

}  // namespace shardgpt
