// Token shards in the llm.c format: the on-disk form of tokenized training data.
//
// A shard is a 1024-byte header of 256 little-endian int32 values followed by the
// tokens as little-endian uint16:
//   header[0] = 20240520 (magic), header[1] = 1 (version), header[2] = token count,
//   header[3..255] = 0.
// The file size must be exactly 1024 + 2 * count, so a truncated copy is caught
// before any of it is trained on. See docs/DATA.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace shardgpt {

constexpr int32_t kTokenShardMagic = 20240520;
constexpr int32_t kTokenShardVersion = 1;
constexpr uint64_t kTokenShardHeaderBytes = 1024;  // 256 x int32
// header[2] is an int32, so one shard holds at most this many tokens.
constexpr uint64_t kTokenShardMaxTokens = 2147483647;

// What the header says, after it has been checked against the file size.
struct TokenShardInfo {
  uint64_t num_tokens = 0;
  uint64_t file_bytes = 0;
};

// Reads only the header and the file size (no token data): cheap enough to call on
// every shard of a large data set before loading any of them.
StatusOr<TokenShardInfo> ReadTokenShardInfo(const std::string& path);

// Reads and validates a whole shard: readable, >= 1024 bytes, magic, version, and
// file size == 1024 + 2 * count.
StatusOr<std::vector<uint16_t>> ReadTokenShard(const std::string& path);

// Writes `tokens` to path + ".tmp" and renames it onto `path`, so a crash or a full
// disk never leaves a half-written shard under the real name.
Status WriteTokenShard(const std::string& path, const std::vector<uint16_t>& tokens);

// Largest token id in `tokens` (0 for an empty vector). One pass over memory, far
// cheaper than the read that produced the vector; used to check against a vocab size.
uint16_t MaxTokenId(const std::vector<uint16_t>& tokens);

}  // namespace shardgpt
