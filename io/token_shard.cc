#include "io/token_shard.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

namespace shardgpt {
namespace {

// Closes the FILE on every return path.
struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

int32_t LoadLE32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                              (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24));
}

void StoreLE32(unsigned char* p, int32_t v) {
  const uint32_t u = static_cast<uint32_t>(v);
  p[0] = static_cast<unsigned char>(u & 0xff);
  p[1] = static_cast<unsigned char>((u >> 8) & 0xff);
  p[2] = static_cast<unsigned char>((u >> 16) & 0xff);
  p[3] = static_cast<unsigned char>((u >> 24) & 0xff);
}

// The two (magic, version) pairs a reader accepts, for error messages.
const char kAccepted[] = "20240520 version 1 (GPT-2, uint16 tokens) or 20240801 version 7 (Llama 3, uint32 tokens)";

// Opens the file and checks the header against the file size. On success the FILE is
// positioned at the first token.
Status OpenAndCheck(const std::string& path, FilePtr* file, TokenShardInfo* info) {
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    const int err = errno;
    return Status::NotFound(path + ": cannot open (" + std::strerror(err) + "); expected an llm.c token shard");
  }
  if (std::fseek(f.get(), 0, SEEK_END) != 0) {
    return Status::IOError(path + ": cannot seek (" + std::strerror(errno) + "); expected a regular file");
  }
  const long end = std::ftell(f.get());
  if (end < 0) {
    return Status::IOError(path + ": cannot get the file size (" + std::strerror(errno) +
                           "); expected a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(end);
  if (size < kTokenShardHeaderBytes) {
    return Status::Corruption(path + ": file has " + std::to_string(size) +
                              " bytes, too short (expected at least 1024, the llm.c token shard header)");
  }
  std::rewind(f.get());
  unsigned char header[kTokenShardHeaderBytes];
  if (std::fread(header, 1, sizeof(header), f.get()) != sizeof(header)) {
    return Status::IOError(path + ": cannot read the 1024-byte header (expected an llm.c token shard)");
  }
  const int32_t magic = LoadLE32(header);
  const int32_t version = LoadLE32(header + 4);
  const int32_t count = LoadLE32(header + 8);
  int width = 0;
  if (magic == kTokenShardMagic && version == kTokenShardVersion) width = 2;
  if (magic == kTokenShard32Magic && version == kTokenShard32Version) width = 4;
  if (width == 0 && magic != kTokenShardMagic && magic != kTokenShard32Magic) {
    return Status::Corruption(path + ": bad magic " + std::to_string(magic) + " version " + std::to_string(version) +
                              " (expected magic " + kAccepted + ": an llm.c token shard)");
  }
  if (width == 0) {
    return Status::Corruption(path + ": magic " + std::to_string(magic) + " with unsupported version " +
                              std::to_string(version) + " (expected magic " + kAccepted + ")");
  }
  if (count < 0) {
    return Status::Corruption(path + ": negative token count " + std::to_string(count) +
                              " in header (expected >= 0)");
  }
  const uint64_t expected = kTokenShardHeaderBytes + static_cast<uint64_t>(width) * static_cast<uint64_t>(count);
  if (size != expected) {
    return Status::Corruption(path + ": file has " + std::to_string(size) + " bytes, header says " +
                              std::to_string(expected) + " (1024 + " + std::to_string(width) + " * " +
                              std::to_string(count) + " tokens); truncated or not an llm.c token shard");
  }
  info->num_tokens = static_cast<uint64_t>(count);
  info->file_bytes = size;
  info->token_bytes = width;
  *file = std::move(f);
  return Status::OK();
}

// Writes header + raw to path.tmp and renames it onto path.
Status WriteShardFile(const std::string& path, int token_bytes, uint64_t count, const std::vector<unsigned char>& raw) {
  const std::string tmp = path + ".tmp";
  FilePtr f(std::fopen(tmp.c_str(), "wb"));
  if (!f) {
    return Status::IOError(tmp + ": cannot create (" + std::strerror(errno) + "); expected a writable directory");
  }
  unsigned char header[kTokenShardHeaderBytes];
  EncodeTokenShardHeader(token_bytes, static_cast<int32_t>(count), header);
  bool ok = std::fwrite(header, 1, sizeof(header), f.get()) == sizeof(header);
  ok = ok && (raw.empty() || std::fwrite(raw.data(), 1, raw.size(), f.get()) == raw.size());
  ok = ok && std::fflush(f.get()) == 0;
  const int err = errno;
  ok = (std::fclose(f.release()) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    return Status::IOError(tmp + ": write failed (" + std::strerror(err ? err : EIO) +
                           "); expected " + std::to_string(kTokenShardHeaderBytes + raw.size()) + " bytes written");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rerr = errno;
    std::remove(tmp.c_str());
    return Status::IOError(path + ": cannot rename " + tmp + " onto it (" + std::strerror(rerr) + ")");
  }
  return Status::OK();
}

Status CheckCount(const std::string& path, size_t n) {
  if (n > kTokenShardMaxTokens) {
    return Status::InvalidArgument(path + ": " + std::to_string(n) +
                                   " tokens do not fit one shard (expected at most 2147483647, header[2] is int32)");
  }
  return Status::OK();
}

}  // namespace

int TokenBytesForVocab(int64_t vocab_size) { return vocab_size > 65536 ? 4 : 2; }

void EncodeTokenShardHeader(int token_bytes, int32_t count, unsigned char header[kTokenShardHeaderBytes]) {
  std::memset(header, 0, kTokenShardHeaderBytes);
  StoreLE32(header, token_bytes == 4 ? kTokenShard32Magic : kTokenShardMagic);
  StoreLE32(header + 4, token_bytes == 4 ? kTokenShard32Version : kTokenShardVersion);
  StoreLE32(header + 8, count);
}

StatusOr<TokenShardInfo> ReadTokenShardInfo(const std::string& path) {
  FilePtr f;
  TokenShardInfo info;
  SHARDGPT_RETURN_IF_ERROR(OpenAndCheck(path, &f, &info));
  return info;
}

StatusOr<TokenShard> ReadTokenShard(const std::string& path) {
  FilePtr f;
  TokenShardInfo info;
  SHARDGPT_RETURN_IF_ERROR(OpenAndCheck(path, &f, &info));
  TokenShard shard;
  shard.token_bytes = info.token_bytes;
  shard.ids.resize(info.num_tokens);
  // Read raw bytes, then decode little endian explicitly: correct on any host, and the
  // loops compile to plain widening copies on little-endian ones.
  const uint64_t w = static_cast<uint64_t>(info.token_bytes);
  std::vector<unsigned char> raw(w * info.num_tokens);
  if (!raw.empty() && std::fread(raw.data(), 1, raw.size(), f.get()) != raw.size()) {
    return Status::IOError(path + ": short read of " + std::to_string(info.num_tokens) +
                           " tokens (file changed while reading?)");
  }
  const unsigned char* r = raw.data();
  if (w == 2) {
    for (uint64_t i = 0; i < info.num_tokens; ++i) shard.ids[i] = static_cast<uint32_t>(r[2 * i] | (r[2 * i + 1] << 8));
  } else {
    for (uint64_t i = 0; i < info.num_tokens; ++i) shard.ids[i] = static_cast<uint32_t>(LoadLE32(r + 4 * i));
  }
  return shard;
}

Status WriteTokenShard(const std::string& path, const std::vector<uint16_t>& tokens) {
  SHARDGPT_RETURN_IF_ERROR(CheckCount(path, tokens.size()));
  std::vector<unsigned char> raw(2 * tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    raw[2 * i] = static_cast<unsigned char>(tokens[i] & 0xff);
    raw[2 * i + 1] = static_cast<unsigned char>(tokens[i] >> 8);
  }
  return WriteShardFile(path, 2, tokens.size(), raw);
}

Status WriteTokenShard(const std::string& path, const std::vector<uint32_t>& ids, int token_bytes) {
  if (token_bytes != 2 && token_bytes != 4) {
    return Status::InvalidArgument(path + ": token width " + std::to_string(token_bytes) +
                                   " bytes (expected 2, uint16, or 4, uint32)");
  }
  SHARDGPT_RETURN_IF_ERROR(CheckCount(path, ids.size()));
  std::vector<unsigned char> raw(static_cast<size_t>(token_bytes) * ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (token_bytes == 2 && ids[i] > 65535) {
      return Status::InvalidArgument(path + ": token " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                                     " does not fit uint16 (expected <= 65535, or the uint32 format)");
    }
    for (int b = 0; b < token_bytes; ++b) raw[token_bytes * i + b] = static_cast<unsigned char>(ids[i] >> (8 * b));
  }
  return WriteShardFile(path, token_bytes, ids.size(), raw);
}

uint32_t MaxTokenId(const std::vector<uint32_t>& tokens) {
  return tokens.empty() ? 0 : *std::max_element(tokens.begin(), tokens.end());
}

}  // namespace shardgpt
