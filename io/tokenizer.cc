#include "io/tokenizer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

namespace shardgpt {

std::vector<uint16_t> ByteLevelTokenizer::Encode(const std::string& text) {
  std::vector<uint16_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteLevelTokenizer::Decode(int id) {
  if (id < 0 || id >= kVocabSize) return Tokenizer::kUnknown;
  return std::string(1, static_cast<char>(id));
}

Tokenizer Tokenizer::FromPieces(std::vector<std::string> pieces, int eot_token) {
  Tokenizer t;
  t.pieces_ = std::move(pieces);
  t.eot_token_ = eot_token;
  return t;
}

Tokenizer Tokenizer::ByteLevel() {
  Tokenizer t;
  t.pieces_.reserve(ByteLevelTokenizer::kVocabSize);
  for (int i = 0; i < ByteLevelTokenizer::kVocabSize; ++i) t.pieces_.push_back(ByteLevelTokenizer::Decode(i));
  return t;
}

std::string Tokenizer::Decode(int id) const {
  if (id < 0 || id >= vocab_size()) return kUnknown;
  return pieces_[static_cast<size_t>(id)];
}

std::string Tokenizer::DecodeAll(const std::vector<int>& ids) const {
  std::string out;
  for (int id : ids) out += Decode(id);
  return out;
}

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};

int32_t LoadLE32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                              (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24));
}

}  // namespace

StatusOr<Tokenizer> LoadLlmcTokenizer(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    return Status::NotFound(path + ": cannot open (" + std::strerror(errno) + "); expected an llm.c tokenizer file");
  }
  unsigned char header[1024];
  const size_t got = std::fread(header, 1, sizeof(header), f.get());
  if (got != sizeof(header)) {
    return Status::Corruption(path + ": file has " + std::to_string(got) +
                              " bytes, too short (expected at least 1024, the llm.c tokenizer header)");
  }
  const int32_t magic = LoadLE32(header);
  const int32_t version = LoadLE32(header + 4);
  const int32_t vocab = LoadLE32(header + 8);
  if (magic != kLlmcTokenizerMagic) {
    return Status::Corruption(path + ": bad magic " + std::to_string(magic) + " (expected " +
                              std::to_string(kLlmcTokenizerMagic) + ", an llm.c tokenizer file)");
  }
  if (version != 1 && version != 2) {
    return Status::Corruption(path + ": unsupported version " + std::to_string(version) + " (expected 1 or 2)");
  }
  if (vocab <= 0) {
    return Status::Corruption(path + ": vocab size " + std::to_string(vocab) + " in header (expected >= 1)");
  }
  // Version 1 files predate header[3]; they were all GPT-2, whose end-of-text id is 50256.
  const int32_t eot = version == 1 ? 50256 : LoadLE32(header + 12);
  if (eot < -1 || eot >= vocab) {
    return Status::Corruption(path + ": eot token " + std::to_string(eot) + " outside the vocab (expected -1 or < " +
                              std::to_string(vocab) + ")");
  }

  // Every token takes at least its length byte, so the file's size bounds the vocab: checked
  // before reserving anything, so a header cannot make us allocate what the file cannot hold.
  if (std::fseek(f.get(), 0, SEEK_END) != 0) {
    return Status::IOError(path + ": cannot seek (" + std::strerror(errno) + "); expected a regular file");
  }
  const long size = std::ftell(f.get());
  if (size < 0 || std::fseek(f.get(), sizeof(header), SEEK_SET) != 0) {
    return Status::IOError(path + ": cannot get the file size (" + std::strerror(errno) + ")");
  }
  const uint64_t body = static_cast<uint64_t>(size) - sizeof(header);
  if (static_cast<uint64_t>(vocab) > body) {
    return Status::Corruption(path + ": vocab size " + std::to_string(vocab) + " in header, but the " +
                              std::to_string(body) + " bytes after it hold at most " + std::to_string(body) +
                              " tokens (truncated or not an llm.c tokenizer file)");
  }

  Tokenizer t;
  t.eot_token_ = eot;
  t.pieces_.reserve(static_cast<size_t>(vocab));
  char buf[256];
  for (int32_t i = 0; i < vocab; ++i) {
    const int len = std::fgetc(f.get());
    if (len == EOF) {
      return Status::Corruption(path + ": truncated at token " + std::to_string(i) + " (expected " +
                                std::to_string(vocab) + " tokens, as the header says)");
    }
    if (len > 0 && std::fread(buf, 1, static_cast<size_t>(len), f.get()) != static_cast<size_t>(len)) {
      return Status::Corruption(path + ": truncated inside token " + std::to_string(i) + " (expected " +
                                std::to_string(len) + " bytes, of " + std::to_string(vocab) + " tokens)");
    }
    t.pieces_.emplace_back(buf, static_cast<size_t>(len));
  }
  // Trailing bytes mean the header's vocab size and the body disagree.
  if (std::fgetc(f.get()) != EOF) {
    return Status::Corruption(path + ": extra bytes after " + std::to_string(vocab) +
                              " tokens (expected the file to end; header vocab size wrong?)");
  }
  return t;
}

}  // namespace shardgpt
