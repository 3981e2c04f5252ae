// Fuzz target: llm.c token shards (io/token_shard.h) and the DataLoader over one shard.
// Contract: any file gives either an error naming it, or exactly what the format says (the
// 1024-byte header with magic and version of one of the two formats and count, and a size of
// exactly 1024 + width * count)
// with the tokens equal to the file's bytes; the loader over a valid shard yields windows
// of the file, within the vocabulary. No allocation beyond the file's size (libFuzzer's
// -malloc_limit_mb catches one).
#include <cstdint>
#include <vector>

#include "fuzz_util.h"
#include "io/data_loader.h"
#include "io/token_shard.h"

using namespace shardgpt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::WriteInput("shard.bin", data, size);
  auto info = ReadTokenShardInfo(path);
  auto tokens = ReadTokenShard(path);
  FUZZ_CHECK(info.ok() == tokens.ok(), "header-only and full reads disagree");
  if (!tokens.ok()) {
    fuzz::CheckError(tokens.status(), path);
    return 0;
  }
  const bool u16 = size >= 1024 && fuzz::LE32(data) == 20240520 && fuzz::LE32(data + 4) == 1;
  const bool u32 = size >= 1024 && fuzz::LE32(data) == 20240801 && fuzz::LE32(data + 4) == 7;
  FUZZ_CHECK(u16 || u32, "accepted a bad header");
  const uint64_t w = u16 ? 2 : 4;
  const uint64_t n = fuzz::LE32(data + 8);
  FUZZ_CHECK(size == 1024 + w * n && info->num_tokens == n && info->file_bytes == size && tokens->ids.size() == n &&
                 tokens->token_bytes == static_cast<int>(w) && info->token_bytes == static_cast<int>(w),
             "size %zu for %llu tokens", size, static_cast<unsigned long long>(n));
  for (uint64_t i = 0; i < n; i++) {
    uint32_t v = 0;
    for (uint64_t b = 0; b < w; b++) v |= static_cast<uint32_t>(data[1024 + w * i + b]) << (8 * b);
    FUZZ_CHECK(tokens->ids[i] == v, "token %llu differs", static_cast<unsigned long long>(i));
  }

  // The loader over this shard, with parameters that vary with the input.
  DataLoaderOptions o;
  o.pattern = path;
  o.B = 1 + static_cast<int>(size % 3);
  o.T = 1 + static_cast<int>((size / 3) % 16);
  o.vocab_size = (n > 0 && (tokens->ids[0] & 1)) ? 256 : 65536;
  o.seed = size;
  o.shuffle = (size & 2) != 0;
  auto loader = DataLoader::Open(o);
  if (!loader.ok()) {
    fuzz::CheckError(loader.status(), path);
    return 0;
  }
  const uint64_t T = static_cast<uint64_t>(o.T);
  FUZZ_CHECK(loader->num_samples() == (n == 0 ? 0 : (n - 1) / T), "windows");
  FUZZ_CHECK(loader->num_samples() >= static_cast<uint64_t>(o.B), "opened without one batch");
  std::vector<int32_t> x(o.B * T), y(o.B * T);
  for (int step = 0; step < 3; step++) {
    loader->NextBatch(x.data(), y.data());
    for (size_t i = 0; i < x.size(); i++) {
      FUZZ_CHECK(x[i] >= 0 && x[i] < o.vocab_size && y[i] >= 0 && y[i] < o.vocab_size, "token out of vocab");
      if ((i + 1) % T != 0) FUZZ_CHECK(y[i] == x[i + 1], "targets are not the next inputs");
    }
  }
  return 0;
}
