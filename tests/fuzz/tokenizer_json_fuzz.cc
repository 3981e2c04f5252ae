// Fuzz target: Hugging Face tokenizer.json files (io/bpe_tokenizer.h, BpeTokenizer::Parse),
// with the JSON type mutator (json_mutate.h) beside libFuzzer's byte mutations.
// Contract: any text gives either an error (one line naming the file) or a tokenizer that
// encodes a few fixed texts and the input itself (where it is UTF-8) to ids inside its
// vocabulary, or refuses the input as invalid UTF-8 with one line; nothing crashes or hangs.
#include <cmath>
#include <vector>

#include "fuzz_util.h"
#include "io/bpe_tokenizer.h"
#include "json_mutate.h"

using namespace shardgpt;

SHARDGPT_FUZZ_JSON_MUTATOR()

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string what = "tokenizer.json";
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto t = BpeTokenizer::Parse(what, text);
  if (!t.ok()) {
    fuzz::CheckError(t.status(), what);
    return 0;
  }
  const BpeTokenizer& tok = *t.value();
  FUZZ_CHECK(tok.vocab_size() >= 1, "vocab %d", tok.vocab_size());
  FUZZ_CHECK(tok.eot_token() >= -1 && tok.eot_token() < tok.vocab_size(), "eot %d", tok.eot_token());
  BpeTokenizer::Session session(tok);
  const std::string samples[] = {"", "Hello, world! It's 2026.\n\n  \t x", "\xF0\x9F\x98\x80 caf\xC3\xA9 <|endoftext|>z",
                                 text.substr(0, 4096)};
  for (const std::string& s : samples) {
    std::vector<int32_t> ids;
    Status st = session.Encode("text", s.data(), s.size(), 0, &ids);
    if (!st.ok()) {
      fuzz::CheckError(st, "text");
      continue;
    }
    for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size(), "id %d outside the vocabulary", id);
    if (!s.empty()) FUZZ_CHECK(!ids.empty(), "non-empty text encoded to nothing");
  }
  const size_t cut = tok.SafeCut(text.data(), 0, text.size());
  FUZZ_CHECK(cut == 0 || (cut < text.size() && text[cut - 1] == '\n'), "bad cut %zu", cut);
  return 0;
}
