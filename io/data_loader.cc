#include "io/data_loader.h"

#include <glob.h>

#include <algorithm>
#include <utility>

#include "io/token_shard.h"

namespace shardgpt {
namespace {

// splitmix64 (Steele, Lea, Flood 2014): tiny, fully specified, and trivial to reproduce
// in Python, which is what an outside replay of the data order needs.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    state_ += 0x9E3779B97F4A7C15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

}  // namespace

Status ExpandShardPattern(const std::string& pattern, std::vector<std::string>* files) {
  glob_t g;
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  if (rc == GLOB_NOMATCH) {
    ::globfree(&g);
    return Status::NotFound(pattern + ": no files match this pattern (expected one or more llm.c token shards)");
  }
  if (rc != 0) {
    ::globfree(&g);
    return Status::IOError(pattern + ": glob failed with code " + std::to_string(rc) +
                           " (expected a readable directory)");
  }
  for (size_t i = 0; i < g.gl_pathc; ++i) files->emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  std::sort(files->begin(), files->end());
  return Status::OK();
}


std::vector<uint64_t> EpochPermutation(uint64_t num_samples, uint64_t seed, uint64_t epoch, bool shuffle) {
  std::vector<uint64_t> perm(num_samples);
  for (uint64_t i = 0; i < num_samples; ++i) perm[i] = i;
  if (!shuffle || num_samples < 2) return perm;
  // Each epoch gets its own stream; (e+1) so epoch 0 does not use the bare seed.
  SplitMix64 rng(seed ^ (0x9E3779B97F4A7C15ULL * (epoch + 1)));
  for (uint64_t i = num_samples - 1; i >= 1; --i) {
    const uint64_t j = rng.Next() % (i + 1);
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

StatusOr<DataLoader> DataLoader::Open(const DataLoaderOptions& options) {
  const std::string& pat = options.pattern;
  if (options.B <= 0) return Status::InvalidArgument(pat + ": B=" + std::to_string(options.B) + " (expected B >= 1)");
  if (options.T <= 0) return Status::InvalidArgument(pat + ": T=" + std::to_string(options.T) + " (expected T >= 1)");
  if (options.world_size <= 0) {
    return Status::InvalidArgument(pat + ": world_size=" + std::to_string(options.world_size) +
                                   " (expected world_size >= 1)");
  }
  if (options.rank < 0 || options.rank >= options.world_size) {
    return Status::InvalidArgument(pat + ": rank=" + std::to_string(options.rank) + " (expected 0 <= rank < world_size=" +
                                   std::to_string(options.world_size) + ")");
  }
  if (options.vocab_size <= 0) {
    return Status::InvalidArgument(pat + ": vocab_size=" + std::to_string(options.vocab_size) +
                                   " (expected vocab_size >= 1)");
  }

  DataLoader loader;
  loader.options_ = options;
  SHARDGPT_RETURN_IF_ERROR(ExpandShardPattern(pat, &loader.files_));

  const uint64_t T = static_cast<uint64_t>(options.T);
  uint64_t total_tokens = 0;
  loader.sample_start_.push_back(0);
  for (const std::string& file : loader.files_) {
    auto tokens = ReadTokenShard(file);
    if (!tokens.ok()) return tokens.status();
    const std::vector<uint32_t>& v = tokens->ids;
    if (MaxTokenId(v) >= static_cast<uint32_t>(options.vocab_size)) {
      // Find the first offender so the message points at it.
      for (size_t i = 0; i < v.size(); ++i) {
        if (v[i] >= static_cast<uint32_t>(options.vocab_size)) {
          return Status::InvalidArgument(file + ": token " + std::to_string(v[i]) + " at index " + std::to_string(i) +
                                         " is out of range (expected < vocab_size " +
                                         std::to_string(options.vocab_size) + ")");
        }
      }
    }
    const uint64_t n = v.size();
    const uint64_t windows = n == 0 ? 0 : (n - 1) / T;
    total_tokens += n;
    loader.sample_start_.push_back(loader.sample_start_.back() + windows);
    Shard shard;
    shard.token_bytes = tokens->token_bytes;
    if (shard.token_bytes == 2) {
      shard.u16.assign(v.begin(), v.end());  // every id < 65536: the file held uint16
    } else {
      shard.u32 = std::move(tokens->ids);
    }
    loader.shards_.push_back(std::move(shard));
  }
  loader.num_samples_ = loader.sample_start_.back();

  const uint64_t need = static_cast<uint64_t>(options.B) * static_cast<uint64_t>(options.world_size);
  if (loader.num_samples_ < need) {
    const std::string where = loader.files_.size() == 1
                                  ? loader.files_[0]
                                  : pat + " (" + std::to_string(loader.files_.size()) + " files)";
    return Status::InvalidArgument(where + ": " + std::to_string(total_tokens) + " tokens give " +
                                   std::to_string(loader.num_samples_) + " windows of T+1=" + std::to_string(T + 1) +
                                   ", need at least " + std::to_string(need) + " (B=" + std::to_string(options.B) +
                                   " x world_size=" + std::to_string(options.world_size) +
                                   ") for one global micro-batch");
  }
  return StatusOr<DataLoader>(std::move(loader));
}

uint64_t DataLoader::global_batch_samples() const {
  return static_cast<uint64_t>(options_.B) * static_cast<uint64_t>(options_.world_size);
}

const std::vector<uint64_t>& DataLoader::Permutation(uint64_t epoch) const {
  if (epoch != cached_epoch_) {
    cached_perm_ = EpochPermutation(num_samples_, options_.seed, epoch, true);
    cached_epoch_ = epoch;
  }
  return cached_perm_;
}

uint64_t DataLoader::SampleAt(uint64_t p) const {
  const uint64_t slot = p % num_samples_;
  if (!options_.shuffle) return slot;
  return Permutation(p / num_samples_)[slot];
}

void DataLoader::SampleTokens(uint64_t k, int32_t* inputs, int32_t* targets) const {
  // Shard s holds global samples [sample_start_[s], sample_start_[s+1]); empty shards
  // have equal bounds, and upper_bound skips them.
  const size_t s = static_cast<size_t>(
      std::upper_bound(sample_start_.begin(), sample_start_.end(), k) - sample_start_.begin() - 1);
  const uint64_t T = static_cast<uint64_t>(options_.T);
  const uint64_t first = (k - sample_start_[s]) * T;
  auto copy = [&](const auto* w) {
    for (uint64_t t = 0; t < T; ++t) {
      inputs[t] = static_cast<int32_t>(w[t]);
      targets[t] = static_cast<int32_t>(w[t + 1]);
    }
  };
  if (shards_[s].token_bytes == 2) {
    copy(shards_[s].u16.data() + first);
  } else {
    copy(shards_[s].u32.data() + first);
  }
}

void DataLoader::NextBatch(int32_t* inputs, int32_t* targets) {
  const uint64_t B = static_cast<uint64_t>(options_.B);
  const uint64_t T = static_cast<uint64_t>(options_.T);
  const uint64_t first = position_ + static_cast<uint64_t>(options_.rank) * B;
  for (uint64_t b = 0; b < B; ++b) {
    SampleTokens(SampleAt(first + b), inputs + b * T, targets + b * T);
  }
  position_ += global_batch_samples();
}

}  // namespace shardgpt
