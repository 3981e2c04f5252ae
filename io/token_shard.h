// Token shards in the llm.c formats: the on-disk form of tokenized training data.
//
// A shard is a 1024-byte header of 256 little-endian int32 values followed by the
// tokens as little-endian unsigned integers of one width, which the header names:
//   GPT-2 format:   header[0] = 20240520, header[1] = 1, tokens uint16;
//   Llama 3 format: header[0] = 20240801, header[1] = 7, tokens uint32;
//   header[2] = token count, header[3..255] = 0.
// The file size must be exactly 1024 + width * count, so a truncated copy is caught
// before any of it is trained on. See docs/DATA.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace shardgpt {

constexpr int32_t kTokenShardMagic = 20240520;  // GPT-2 format: uint16 tokens
constexpr int32_t kTokenShardVersion = 1;
constexpr int32_t kTokenShard32Magic = 20240801;  // Llama 3 format: uint32 tokens
constexpr int32_t kTokenShard32Version = 7;
constexpr uint64_t kTokenShardHeaderBytes = 1024;  // 256 x int32
// header[2] is an int32, so one shard holds at most this many tokens.
constexpr uint64_t kTokenShardMaxTokens = 2147483647;

// What the header says, after it has been checked against the file size.
struct TokenShardInfo {
  uint64_t num_tokens = 0;
  uint64_t file_bytes = 0;
  int token_bytes = 2;  // 2 (GPT-2 format, uint16) or 4 (Llama 3 format, uint32)
};

// A whole shard: its ids widened to uint32, and the width the file stored them in.
struct TokenShard {
  int token_bytes = 2;
  std::vector<uint32_t> ids;
};

// The width prepare writes for a tokenizer of `vocab_size` ids: 2 (uint16) when every id
// fits, i.e. vocab_size <= 65536, else 4 (uint32).
int TokenBytesForVocab(int64_t vocab_size);

// Reads only the header and the file size (no token data): cheap enough to call on
// every shard of a large data set before loading any of them.
StatusOr<TokenShardInfo> ReadTokenShardInfo(const std::string& path);

// Reads and validates a whole shard of either format: readable, >= 1024 bytes, a known
// (magic, version) pair, and file size == 1024 + width * count.
StatusOr<TokenShard> ReadTokenShard(const std::string& path);

// Writes `tokens` in the GPT-2 format (uint16) to path + ".tmp" and renames it onto
// `path`, so a crash or a full disk never leaves a half-written shard under the real name.
Status WriteTokenShard(const std::string& path, const std::vector<uint16_t>& tokens);

// The same with the width chosen: token_bytes 2 writes the GPT-2 format (every id must be
// <= 65535), 4 the Llama 3 format.
Status WriteTokenShard(const std::string& path, const std::vector<uint32_t>& ids, int token_bytes);

// The 1024-byte header of a shard of `count` tokens of `token_bytes` (2 or 4) bytes each.
void EncodeTokenShardHeader(int token_bytes, int32_t count, unsigned char header[kTokenShardHeaderBytes]);

// Largest token id in `tokens` (0 for an empty vector). One pass over memory, far
// cheaper than the read that produced the vector; used to check against a vocab size.
uint32_t MaxTokenId(const std::vector<uint32_t>& tokens);

}  // namespace shardgpt
