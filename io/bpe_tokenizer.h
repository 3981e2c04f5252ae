// A byte-level BPE tokenizer read from a Hugging Face tokenizer.json (GPT-2's and Llama 3's
// kinds): pre-tokenization by regexes (GPT-2's built-in one of ByteLevel, or the patterns of
// Split pre-tokenizers), the byte-to-unicode map, merges applied by rank (or, with
// ignore_merges, a pre-token that is itself in the vocabulary taken whole), and added (special)
// tokens such as <|endoftext|> matched in the text first. Encodes to the same ids as Hugging Face
// `tokenizers`; used by `prepare --tokenizer` and `sample --tokenizer`.
//
// pre_tokenizer: ByteLevel (add_prefix_space false; use_regex true splits by GPT-2's regex,
// false not at all), or a Sequence of Split pre-tokenizers (behavior Isolated, invert false, a
// String or an Oniguruma Regex pattern translated to PCRE2) ending in one ByteLevel.
// post_processor: null, ByteLevel, TemplateProcessing (its "single" template: special tokens
// around the text, see text_prefix) or a Sequence of those.
//
// As `tokenizers` does: a pair listed twice in merges has the rank of its last occurrence;
// added tokens with "normalized": false (special tokens by default) are matched first, over the
// whole text, leftmost-longest, and those with "normalized": true then in the text between them;
// a word is merged in O(n log n) (a heap of candidate pairs over a linked list of symbols).
//
// What is refused, with one error naming the field: a model type other than BPE, a normalizer,
// other pre-tokenizer types, orders or options (add_prefix_space, Split behaviors other than
// Isolated, invert, regex constructs whose Oniguruma and PCRE2 meanings differ or that
// may match the empty string), other post-processors or templates, dropout, byte_fallback,
// subword prefixes/suffixes, added tokens with lstrip/rstrip/single_word, a vocabulary without
// all 256 byte symbols, merges of symbols not in the vocabulary.
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
  // The ids the post-processor's template puts before / after one encoded text (Llama 3's
  // <|begin_of_text|>: prefix {128000}); empty without a TemplateProcessing. Encode adds neither.
  const std::vector<int32_t>& text_prefix() const { return text_prefix_; }
  const std::vector<int32_t>& text_suffix() const { return text_suffix_; }
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
    // Splits text (valid UTF-8) by pre-tokenizer stage `stage` and passes each piece on to the
    // next stage, after the last to Bpe.
    Status PreTokenize(size_t stage, const std::string& what, const char* text, size_t n, uint64_t base_offset,
                       std::vector<int32_t>* out);
    // Added tokens of `list` (0: not normalized, 1: normalized) split text; the rest goes to
    // the next list, after the last to EncodeOrdinary.
    Status EncodeAdded(int list, const std::string& what, const char* text, size_t n, uint64_t base_offset,
                       std::vector<int32_t>* out);
    void Bpe(const char* word, size_t n, std::vector<int32_t>* out);
    // Merges word_ (symbol ids) in place: the lowest-rank pair first, leftmost among equals.
    void MergeWord();
    const BpeTokenizer& tok_;
    std::vector<void*> match_data_;  // pcre2_match_data_8, one per stage
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
  // (no pre-token of GPT-2's or Llama 3's regex crosses such a point, and no added token holds
  // a '\n'). Returns the largest such cut p in (lo, hi) (s[p] must exist: hi is the buffer's
  // end), or 0; always 0 for other pre-tokenizer patterns (the text is then encoded whole).
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
  // The pre-tokenizer as regex splits applied in order, each to the pieces of the one before.
  struct Stage {
    void* code;  // pcre2_code_8, JIT-compiled; matches and the text between them are pieces
  };
  std::vector<Stage> stages_;
  bool cuts_safe_ = false;  // every stage's pattern is one SafeCut's rule holds for
  std::vector<int32_t> text_prefix_, text_suffix_;
};

}  // namespace shardgpt
