// Fuzz target: llm.c tokenizer files (io/tokenizer.h, LoadLlmcTokenizer).
// Contract: any file gives either an error naming it, or a decode table whose header is valid
// (magic, version 1 or 2, vocab >= 1, eot -1 or inside the vocab) and whose pieces are
// exactly the file's length-prefixed records, which end where the file ends. The vocab size
// is checked against the file's size before anything is reserved.
#include <cstring>

#include "fuzz_util.h"
#include "io/tokenizer.h"

using namespace shardgpt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::WriteInput("tokenizer.bin", data, size);
  auto t = LoadLlmcTokenizer(path);
  if (!t.ok()) {
    fuzz::CheckError(t.status(), path);
    return 0;
  }
  FUZZ_CHECK(size >= 1024 && fuzz::LE32(data) == 20240328, "accepted a bad magic");
  const uint32_t version = fuzz::LE32(data + 4);
  FUZZ_CHECK(version == 1 || version == 2, "accepted version %u", version);
  const int vocab = t->vocab_size();
  FUZZ_CHECK(vocab >= 1 && static_cast<uint32_t>(vocab) == fuzz::LE32(data + 8), "vocab %d", vocab);
  FUZZ_CHECK(t->eot_token() >= -1 && t->eot_token() < vocab, "eot %d", t->eot_token());
  size_t at = 1024;
  for (int i = 0; i < vocab; i++) {
    FUZZ_CHECK(at < size, "token %d past the end", i);
    const size_t len = data[at];
    FUZZ_CHECK(at + 1 + len <= size, "token %d past the end", i);
    const std::string piece = t->Decode(i);
    FUZZ_CHECK(piece.size() == len && std::memcmp(piece.data(), data + at + 1, len) == 0, "token %d differs", i);
    at += 1 + len;
  }
  FUZZ_CHECK(at == size, "accepted %zu trailing bytes", size - at);
  FUZZ_CHECK(t->Decode(vocab) == Tokenizer::kUnknown && t->Decode(-1) == Tokenizer::kUnknown, "bad ids");
  return 0;
}
