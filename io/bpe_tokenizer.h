// A byte-level BPE tokenizer read from a Hugging Face tokenizer.json (GPT-2's kind): the
// GPT-2 pre-tokenization regex, the byte-to-unicode map, merges applied by rank, and added
// (special) tokens such as <|endoftext|> matched in the text first. Encodes to the same ids as
// Hugging Face `tokenizers`; used by `prepare --tokenizer` and `sample --tokenizer`.
//
// As `tokenizers` does: a pair listed twice in merges has the rank of its last occurrence;
// added tokens with "normalized": false (special tokens by default) are matched first, over the
// whole text, leftmost-longest, and those with "normalized": true then in the text between them;
// a word is merged in O(n log n) (a heap of candidate pairs over a linked list of symbols).
//
// What is refused, with one error naming the field: a model type other than BPE, a normalizer,
// a pre-tokenizer other than ByteLevel (use_regex, no prefix space), dropout, subword
// prefixes/suffixes, added tokens with lstrip/rstrip/single_word, a vocabulary without all 256
// byte symbols, merges of symbols not in the vocabulary.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "io/tokenizer.h"

namespace shardgpt {

class BpeTokenizer {
 public:
  // Reads and checks path (a tokenizer.json).
  static StatusOr<std::shared_ptr<const BpeTokenizer>> Load(const std::string& path);
  // The same from the file's text; errors start with `what`.
  static StatusOr<std::shared_ptr<const BpeTokenizer>> Parse(const std::string& what, const std::string& json);
  ~BpeTokenizer();

  // 1 + the largest id of the vocabulary and the added tokens.
  int vocab_size() const { return vocab_size_; }
  // The id of the added token "<|endoftext|>", or -1.
  int eot_token() const { return eot_; }
  // A decode table (id -> bytes) for printing samples.
  Tokenizer DecodeTable() const;
  // The bytes of one token (added tokens: their content), or Tokenizer::kUnknown.
  std::string Decode(int id) const { return id >= 0 && id < vocab_size_ ? pieces_[id] : Tokenizer::kUnknown; }

  // Per-thread encoding state (regex match data, a word cache). Not thread-safe; one per thread.
  class Session {
   public:
    explicit Session(const BpeTokenizer& tok);
    ~Session();
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;
    // Appends the ids of text (UTF-8) to *out. Invalid UTF-8 is refused naming `what` and the
    // byte offset (plus base_offset, where text sits in a larger file).
    Status Encode(const std::string& what, const char* text, size_t n, uint64_t base_offset, std::vector<int32_t>* out);

   private:
    Status EncodeOrdinary(const std::string& what, const char* text, size_t n, uint64_t base_offset,
                          std::vector<int32_t>* out);
    // Added tokens of `list` (0: not normalized, 1: normalized) split text; the rest goes to
    // the next list, after the last to EncodeOrdinary.
    Status EncodeAdded(int list, const std::string& what, const char* text, size_t n, uint64_t base_offset,
                       std::vector<int32_t>* out);
    void Bpe(const char* word, size_t n, std::vector<int32_t>* out);
    // Merges word_ (symbol ids) in place: the lowest-rank pair first, leftmost among equals.
    void MergeWord();
    const BpeTokenizer& tok_;
    void* match_data_ = nullptr;  // pcre2_match_data_8
    void* jit_stack_ = nullptr;   // pcre2_jit_stack_8
    void* match_ctx_ = nullptr;   // pcre2_match_context_8
    std::unordered_map<std::string, std::vector<int32_t>> cache_;
    std::vector<int32_t> word_;
    struct Symbol {
      int32_t id;
      int32_t prev, next;  // neighbours' indices in syms_, -1 at the ends
      bool alive;          // false once merged into its left neighbour
    };
    struct Candidate {  // the pair (syms_[pos], its next) merges into new_id at rank
      uint32_t rank;
      uint32_t pos;
      int32_t new_id;
    };
    std::vector<Symbol> syms_;
    std::vector<Candidate> heap_;  // a min-heap on (rank, pos)
  };

  // Where text may be cut so that encoding the pieces one by one gives the same ids as
  // encoding it whole: after a '\n' that follows an ASCII non-space byte and precedes one
  // (no pre-token of the regex crosses such a point, and no added token holds a '\n').
  // Returns the largest such cut p in (lo, hi) (s[p] must exist: hi is the buffer's end), or 0.
  size_t SafeCut(const char* text, size_t lo, size_t hi) const;

 private:
  BpeTokenizer() = default;
  friend class Session;
  int vocab_size_ = 0;
  int eot_ = -1;
  std::vector<std::string> pieces_;          // id -> bytes
  int32_t byte_id_[256] = {};                // byte -> id of its single-symbol token
  std::unordered_map<uint64_t, uint64_t> merges_;  // (left id << 32 | right id) -> rank << 32 | merged id
  // the merge of (a, b): true and *rank, *id when a b is in merges
  bool FindMerge(int32_t a, int32_t b, uint32_t* rank, int32_t* id) const;
  std::unordered_map<std::string, int32_t> word_ids_;  // byte string -> id (ignore_merges only)
  bool ignore_merges_ = false;
  struct Added {
    std::string content;
    int32_t id;
  };
  std::vector<Added> added_[2];  // [0] "normalized": false, [1] true; each longest first
  bool added_have_newline_ = false;
  void* code_ = nullptr;  // pcre2_code_8, JIT-compiled GPT-2 pattern
};

}  // namespace shardgpt
