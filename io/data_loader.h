// DataLoader: turns a set of token shards (uint16 or uint32, mixed freely) into [B, T]
// input/target batches for one rank, in an order fixed by (files, T, seed, shuffle) alone.
//
// The order is defined on a global stream of samples shared by all ranks, and the only
// state is the stream position. Because each rank's slice of a global micro-batch is a
// pure function of (position, rank, B, world_size), a run can stop and resume, even on a
// different number of ranks, and still see each sample the same number of times.
// The exact algorithm is in docs/DATA.md so an outside program can replay it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace shardgpt {

struct DataLoaderOptions {
  std::string pattern;   // glob(3) pattern, e.g. "data/train*.bin"; matches sorted bytewise
  int B = 0;             // micro-batch sequences per rank
  int T = 0;             // sequence length
  uint64_t seed = 0;     // shuffle seed
  bool shuffle = true;   // false: samples in file order
  int rank = 0;          // this rank, in [0, world_size)
  int world_size = 1;    // ranks sharing the stream
  int vocab_size = 0;    // every token must be < vocab_size (checked on open)
};

// The files a --data pattern names: glob(3), then sorted bytewise so the order does not depend
// on the locale (glob sorts with strcoll). NotFound when nothing matches. Thread-safe.
Status ExpandShardPattern(const std::string& pattern, std::vector<std::string>* files);

// Everything needed to resume: the number of samples consumed by all ranks together.
struct LoaderState {
  uint64_t position = 0;
};

class DataLoader {
 public:
  // Expands the pattern, reads and checks every shard (vocab, sizes), and checks that at
  // least one global micro-batch (B * world_size samples) exists.
  static StatusOr<DataLoader> Open(const DataLoaderOptions& options);

  DataLoader(DataLoader&&) = default;
  DataLoader& operator=(DataLoader&&) = default;

  // Fills inputs[B*T] and targets[B*T] (row-major [B, T]) with this rank's slice of the
  // global micro-batch at the current position, then advances the position by
  // B * world_size. Not thread-safe (caches the current epoch's permutation).
  void NextBatch(int32_t* inputs, int32_t* targets);

  LoaderState state() const { return LoaderState{position_}; }
  void Restore(const LoaderState& state) { position_ = state.position; }
  // Back to position 0: for validation passes that must see the same batches every time.
  void Reset() { position_ = 0; }
  uint64_t position() const { return position_; }

  // S: number of windows of T+1 tokens over all shards (one epoch).
  uint64_t num_samples() const { return num_samples_; }
  // B * world_size: samples consumed by one NextBatch on every rank.
  uint64_t global_batch_samples() const;
  const std::vector<std::string>& files() const { return files_; }
  // Tokens in files()[i].
  uint64_t file_tokens(size_t i) const { return shards_[i].size(); }
  // Bytes per token of files()[i]: 2 (uint16 shard) or 4 (uint32 shard).
  int file_token_bytes(size_t i) const { return shards_[i].token_bytes; }
  const DataLoaderOptions& options() const { return options_; }

  // The global sample index (in [0, S)) at stream position p: perm_e[p % S], e = p / S.
  uint64_t SampleAt(uint64_t p) const;
  // Copies sample k's T inputs and T targets.
  void SampleTokens(uint64_t k, int32_t* inputs, int32_t* targets) const;

 private:
  DataLoader() = default;
  const std::vector<uint64_t>& Permutation(uint64_t epoch) const;

  DataLoaderOptions options_;
  std::vector<std::string> files_;
  // One shard's ids at the width of its file (memory as on disk): u16 when token_bytes is 2,
  // else u32.
  struct Shard {
    int token_bytes = 2;
    std::vector<uint16_t> u16;
    std::vector<uint32_t> u32;
    uint64_t size() const { return token_bytes == 2 ? u16.size() : u32.size(); }
  };
  std::vector<Shard> shards_;
  // sample_start_[s] = first global sample index of shard s; sample_start_.back() == S.
  std::vector<uint64_t> sample_start_;
  uint64_t num_samples_ = 0;
  uint64_t position_ = 0;
  // Permutation of the epoch last asked for (shuffle only); recomputed on epoch change.
  mutable uint64_t cached_epoch_ = ~uint64_t{0};
  mutable std::vector<uint64_t> cached_perm_;
};

// The permutation perm_e of [0, S) used for epoch e (identity when !shuffle). Exposed so
// tests and tools can check it against docs/DATA.md.
std::vector<uint64_t> EpochPermutation(uint64_t num_samples, uint64_t seed, uint64_t epoch, bool shuffle);

}  // namespace shardgpt
