#include "io/data_loader.h"
#include "tests/unit/io_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "io/token_shard.h"

namespace shardgpt {
namespace {

using testutil::TestDir;
namespace fs = std::filesystem;

using Window = std::vector<int32_t>;  // T inputs followed by the last target: T+1 tokens

// Random tokens in [0, vocab): with T >= 4 every window is distinct with overwhelming
// probability, so a window's content identifies which sample it is.
std::vector<uint16_t> RandomTokens(size_t n, uint32_t salt, int vocab = 50257) {
  std::mt19937 rng(salt);
  std::vector<uint16_t> v(n);
  for (auto& t : v) t = static_cast<uint16_t>(rng() % static_cast<uint32_t>(vocab));
  return v;
}

std::vector<uint16_t> MakeShard(const std::string& path, size_t n, uint32_t salt) {
  std::vector<uint16_t> v = RandomTokens(n, salt);
  EXPECT_TRUE(WriteTokenShard(path, v).ok());
  return v;
}

// The documented windows of a list of shards, in global sample order: sample j of a
// shard with n tokens covers tokens [j*T, j*T+T], for j < floor((n-1)/T).
std::vector<Window> ExpectedWindows(const std::vector<std::vector<uint16_t>>& shards, int T) {
  std::vector<Window> out;
  for (const auto& s : shards) {
    const size_t count = s.empty() ? 0 : (s.size() - 1) / T;
    for (size_t j = 0; j < count; ++j) out.emplace_back(s.begin() + j * T, s.begin() + j * T + T + 1);
  }
  return out;
}

// One NextBatch, split into B windows; also checks targets are inputs shifted by one.
std::vector<Window> Next(DataLoader* loader) {
  const int B = loader->options().B, T = loader->options().T;
  std::vector<int32_t> in(B * T, -1), tg(B * T, -1);
  loader->NextBatch(in.data(), tg.data());
  std::vector<Window> out;
  for (int b = 0; b < B; ++b) {
    Window w(in.begin() + b * T, in.begin() + b * T + T);
    w.push_back(tg[b * T + T - 1]);
    for (int t = 0; t + 1 < T; ++t) EXPECT_EQ(tg[b * T + t], in[b * T + t + 1]);
    out.push_back(std::move(w));
  }
  return out;
}

DataLoaderOptions Opts(const std::string& pattern, int B, int T, bool shuffle, uint64_t seed = 1, int rank = 0,
                       int world = 1) {
  DataLoaderOptions o;
  o.pattern = pattern;
  o.B = B;
  o.T = T;
  o.seed = seed;
  o.shuffle = shuffle;
  o.rank = rank;
  o.world_size = world;
  o.vocab_size = 50257;
  return o;
}

DataLoader MustOpen(const DataLoaderOptions& o) {
  auto r = DataLoader::Open(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

// Independent re-implementation of the order in docs/DATA.md (splitmix64 + Fisher-Yates).
std::vector<uint64_t> DocPermutation(uint64_t S, uint64_t seed, uint64_t e) {
  std::vector<uint64_t> perm(S);
  for (uint64_t i = 0; i < S; ++i) perm[i] = i;
  uint64_t state = seed ^ (0x9E3779B97F4A7C15ULL * (e + 1));
  auto next = [&state]() {
    state += 0x9E3779B97F4A7C15ULL;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  for (uint64_t i = S - 1; i >= 1; --i) std::swap(perm[i], perm[next() % (i + 1)]);
  return perm;
}

TEST(DataLoader, SequentialWindowsWhenShuffleOff) {
  const std::string dir = TestDir();
  const auto raw = MakeShard(dir + "/train.bin", 100, 1);  // floor(99/8) = 12 windows
  DataLoader loader = MustOpen(Opts(dir + "/train.bin", 2, 8, false));
  ASSERT_EQ(loader.num_samples(), 12u);
  const int T = 8;
  for (int step = 0; step < 9; ++step) {  // 18 samples: wraps into epoch 1
    const int B = 2;
    std::vector<int32_t> in(B * T), tg(B * T);
    loader.NextBatch(in.data(), tg.data());
    for (int b = 0; b < B; ++b) {
      const int j = (step * B + b) % 12;
      for (int t = 0; t < T; ++t) {
        ASSERT_EQ(in[b * T + t], raw[j * T + t]) << "step " << step << " row " << b;
        ASSERT_EQ(tg[b * T + t], raw[j * T + t + 1]) << "step " << step << " row " << b;
      }
    }
    EXPECT_EQ(loader.position(), static_cast<uint64_t>((step + 1) * B));
  }
}

TEST(DataLoader, SameSeedSameBatchesDifferentSeedDifferentOrder) {
  const std::string dir = TestDir();
  MakeShard(dir + "/train.bin", 1000, 2);
  DataLoader a = MustOpen(Opts(dir + "/train.bin", 4, 8, true, 42));
  DataLoader b = MustOpen(Opts(dir + "/train.bin", 4, 8, true, 42));
  DataLoader c = MustOpen(Opts(dir + "/train.bin", 4, 8, true, 43));
  bool any_diff = false;
  for (int step = 0; step < 60; ++step) {  // 240 samples > S = 124: crosses an epoch
    const auto wa = Next(&a), wb = Next(&b), wc = Next(&c);
    ASSERT_EQ(wa, wb) << "step " << step;
    any_diff |= (wa != wc);
  }
  EXPECT_TRUE(any_diff);
  // Shuffled order is not the identity either.
  DataLoader d = MustOpen(Opts(dir + "/train.bin", 4, 8, true, 42));
  bool not_identity = false;
  for (uint64_t p = 0; p < d.num_samples(); ++p) not_identity |= d.SampleAt(p) != p;
  EXPECT_TRUE(not_identity);
}

TEST(DataLoader, ShuffleFollowsDocumentedAlgorithm) {
  const std::string dir = TestDir();
  const auto raw = MakeShard(dir + "/train.bin", 1 + 37 * 5, 3);  // S = 37
  const auto windows = ExpectedWindows({raw}, 5);
  const uint64_t seed = 0xDEADBEEFCAFEULL;
  DataLoader loader = MustOpen(Opts(dir + "/train.bin", 1, 5, true, seed));
  ASSERT_EQ(loader.num_samples(), 37u);
  for (uint64_t e = 0; e < 3; ++e) {
    const auto perm = DocPermutation(37, seed, e);
    EXPECT_EQ(EpochPermutation(37, seed, e, true), perm);
    for (uint64_t i = 0; i < 37; ++i) {
      ASSERT_EQ(Next(&loader)[0], windows[perm[i]]) << "epoch " << e << " slot " << i;
    }
  }
  // Golden values from the Python snippet in docs/DATA.md (S=10, seed=1234, epoch 0 and 1).
  EXPECT_EQ(EpochPermutation(10, 1234, 0, true), (std::vector<uint64_t>{4, 6, 5, 2, 7, 0, 1, 8, 9, 3}));
  EXPECT_EQ(EpochPermutation(10, 1234, 1, true), (std::vector<uint64_t>{4, 5, 6, 9, 2, 0, 7, 8, 1, 3}));
  EXPECT_EQ(EpochPermutation(5, 1234, 0, false), (std::vector<uint64_t>{0, 1, 2, 3, 4}));
}

TEST(DataLoader, EpochWrapCoversEverySampleOncePerEpoch) {
  const std::string dir = TestDir();
  const auto raw = MakeShard(dir + "/train.bin", 1 + 50 * 6, 4);  // S = 50
  const auto windows = ExpectedWindows({raw}, 6);
  std::map<Window, size_t> index;
  for (size_t i = 0; i < windows.size(); ++i) index[windows[i]] = i;
  ASSERT_EQ(index.size(), 50u);  // windows are distinct, so content identifies the sample

  DataLoader loader = MustOpen(Opts(dir + "/train.bin", 1, 6, true, 7));
  std::vector<std::vector<size_t>> orders(3);
  for (auto& order : orders) {
    for (int i = 0; i < 50; ++i) {
      auto it = index.find(Next(&loader)[0]);
      ASSERT_NE(it, index.end()) << "loader produced a window that is not a documented sample";
      order.push_back(it->second);
    }
    std::vector<size_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < 50; ++i) ASSERT_EQ(sorted[i], i) << "an epoch must cover every sample exactly once";
  }
  EXPECT_NE(orders[0], orders[1]);
  EXPECT_NE(orders[1], orders[2]);
}

TEST(DataLoader, RanksSplitTheGlobalMicroBatch) {
  const std::string dir = TestDir();
  MakeShard(dir + "/train.bin", 1 + 40 * 8, 5);  // S = 40, not a multiple of 6: batches straddle epochs
  const int B = 2, world = 3;
  std::vector<DataLoader> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(MustOpen(Opts(dir + "/train.bin", B, 8, true, 9, r, world)));
  DataLoader single = MustOpen(Opts(dir + "/train.bin", B * world, 8, true, 9, 0, 1));
  for (int step = 0; step < 20; ++step) {
    std::vector<Window> concat;
    std::set<Window> uni;
    for (auto& loader : ranks) {
      for (auto& w : Next(&loader)) {
        concat.push_back(w);
        uni.insert(w);
      }
    }
    const auto expect = Next(&single);
    ASSERT_EQ(concat, expect) << "step " << step;  // identical, in rank order
    ASSERT_EQ(uni, std::set<Window>(expect.begin(), expect.end()));
    // Within one epoch the ranks' slices are disjoint.
    const uint64_t p0 = static_cast<uint64_t>(step) * B * world;
    if (p0 / 40 == (p0 + B * world - 1) / 40) {
      EXPECT_EQ(uni.size(), static_cast<size_t>(B * world));
    }
    for (auto& loader : ranks) EXPECT_EQ(loader.position(), p0 + B * world);
  }
}

TEST(DataLoader, SaveAndRestoreContinuesIdentically) {
  const std::string dir = TestDir();
  MakeShard(dir + "/train.bin", 2000, 6);
  DataLoader a = MustOpen(Opts(dir + "/train.bin", 3, 16, true, 11, 1, 2));
  std::vector<Window> first = Next(&a);
  for (int i = 0; i < 40; ++i) Next(&a);  // past the first epoch (S = 124)
  const LoaderState saved = a.state();
  EXPECT_EQ(saved.position, 41u * 6);
  std::vector<std::vector<Window>> after;
  for (int i = 0; i < 10; ++i) after.push_back(Next(&a));

  DataLoader b = MustOpen(Opts(dir + "/train.bin", 3, 16, true, 11, 1, 2));
  b.Restore(saved);
  for (int i = 0; i < 10; ++i) ASSERT_EQ(Next(&b), after[i]) << "batch " << i;
  b.Reset();
  EXPECT_EQ(b.position(), 0u);
  EXPECT_EQ(Next(&b), first);
}

TEST(DataLoader, ResumeOnDifferentWorldSizeSeesSameSamples) {
  const std::string dir = TestDir();
  MakeShard(dir + "/train.bin", 1 + 100 * 8, 7);  // S = 100
  // Run on 2 ranks with B=3 (6 samples per micro-batch) for 5 micro-batches.
  std::vector<DataLoader> two;
  for (int r = 0; r < 2; ++r) two.push_back(MustOpen(Opts(dir + "/train.bin", 3, 8, true, 5, r, 2)));
  for (int i = 0; i < 5; ++i)
    for (auto& l : two) Next(&l);
  const LoaderState saved = two[0].state();
  ASSERT_EQ(saved.position, 30u);
  ASSERT_EQ(two[1].state().position, 30u);

  // Continue 4 more micro-batches on 2 ranks: 24 samples.
  std::multiset<Window> cont2;
  for (int i = 0; i < 4; ++i)
    for (auto& l : two)
      for (auto& w : Next(&l)) cont2.insert(w);

  // Resume the same position on 3 ranks with B=2 (6 per micro-batch): 4 micro-batches.
  std::multiset<Window> cont3;
  for (int r = 0; r < 3; ++r) {
    DataLoader l = MustOpen(Opts(dir + "/train.bin", 2, 8, true, 5, r, 3));
    l.Restore(saved);
    for (int i = 0; i < 4; ++i)
      for (auto& w : Next(&l)) cont3.insert(w);
  }
  EXPECT_EQ(cont2, cont3);

  // Resume on 1 rank with B=4 (4 per micro-batch): 6 micro-batches cover the same 24.
  std::multiset<Window> cont1;
  DataLoader one = MustOpen(Opts(dir + "/train.bin", 4, 8, true, 5, 0, 1));
  one.Restore(saved);
  for (int i = 0; i < 6; ++i)
    for (auto& w : Next(&one)) cont1.insert(w);
  EXPECT_EQ(cont2, cont1);
  EXPECT_EQ(one.position(), 54u);
}

TEST(DataLoader, MultiShardGlobIsSortedAndWindowsStayInsideShards) {
  const std::string dir = TestDir();
  const int T = 4;
  // Written out of order; train_001 is too short for one window; val.bin must not match.
  const auto s2 = MakeShard(dir + "/train_002.bin", 1 + 5 * T + 2, 12);  // 5 windows, 2 leftover tokens
  const auto s0 = MakeShard(dir + "/train_000.bin", 1 + 3 * T, 10);      // 3 windows
  const auto s1 = MakeShard(dir + "/train_001.bin", T, 11);              // 0 windows
  MakeShard(dir + "/val.bin", 100, 13);
  DataLoader loader = MustOpen(Opts(dir + "/train_*.bin", 1, T, false));
  ASSERT_EQ(loader.files().size(), 3u);
  EXPECT_EQ(loader.files()[0], dir + "/train_000.bin");
  EXPECT_EQ(loader.files()[1], dir + "/train_001.bin");
  EXPECT_EQ(loader.files()[2], dir + "/train_002.bin");
  ASSERT_EQ(loader.num_samples(), 8u);
  const auto windows = ExpectedWindows({s0, s1, s2}, T);
  ASSERT_EQ(windows.size(), 8u);
  for (int i = 0; i < 8; ++i) ASSERT_EQ(Next(&loader)[0], windows[i]) << "sample " << i;
  // Sample 3 is the first window of train_002, not a window crossing from train_000.
  EXPECT_EQ(windows[3], Window(s2.begin(), s2.begin() + T + 1));
}

TEST(DataLoader, NoMatchNamesThePattern) {
  const std::string pattern = TestDir() + "/train_*.bin";
  auto r = DataLoader::Open(Opts(pattern, 1, 4, false));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind(pattern + ": no files match", 0), 0u) << r.status().message();
}

TEST(DataLoader, TooFewTokensForOneGlobalMicroBatch) {
  const std::string dir = TestDir();
  MakeShard(dir + "/train.bin", 1 + 5 * 8, 14);  // S = 5
  auto ok = DataLoader::Open(Opts(dir + "/train.bin", 5, 8, false));
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
  auto r = DataLoader::Open(Opts(dir + "/train.bin", 2, 8, false, 1, 0, 3));  // needs 6
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            dir + "/train.bin: 41 tokens give 5 windows of T+1=9, need at least 6 (B=2 x world_size=3) "
                  "for one global micro-batch");
}

TEST(DataLoader, TokenOutsideVocabIsAnError) {
  const std::string dir = TestDir();
  std::vector<uint16_t> v(200, 3);
  v[123] = 300;
  ASSERT_TRUE(WriteTokenShard(dir + "/train.bin", v).ok());
  auto o = Opts(dir + "/train.bin", 1, 8, false);
  o.vocab_size = 256;
  auto r = DataLoader::Open(o);
  ASSERT_FALSE(r.ok());
  const std::string& msg = r.status().message();
  EXPECT_EQ(msg.rfind(dir + "/train.bin: token 300 at index 123", 0), 0u) << msg;
  EXPECT_NE(msg.find("vocab_size 256"), std::string::npos) << msg;
  o.vocab_size = 301;
  EXPECT_TRUE(DataLoader::Open(o).ok());
}

// The same ids in uint32 shards and in uint16 shards give the same windows in the same order
// (shuffled, 2 ranks, across an epoch), also with the two formats mixed in one pattern.
TEST(DataLoader, Uint32ShardsGiveTheSameWindowsAsUint16) {
  const std::string dir = TestDir();
  std::vector<std::vector<uint16_t>> raw;
  for (int s = 0; s < 3; ++s) {
    raw.push_back(RandomTokens(150 + 37 * s, 20 + s));
    const std::vector<uint32_t> wide(raw.back().begin(), raw.back().end());
    const std::string name = "/train_" + std::to_string(s) + ".bin";
    fs::create_directories(dir + "/a");
    fs::create_directories(dir + "/b");
    fs::create_directories(dir + "/mixed");
    ASSERT_TRUE(WriteTokenShard(dir + "/a" + name, raw.back()).ok());
    ASSERT_TRUE(WriteTokenShard(dir + "/b" + name, wide, 4).ok());
    ASSERT_TRUE(WriteTokenShard(dir + "/mixed" + name, wide, s == 1 ? 2 : 4).ok());
  }
  for (const char* other : {"/b", "/mixed"}) {
    for (int rank = 0; rank < 2; ++rank) {
      DataLoader a = MustOpen(Opts(dir + "/a/train_*.bin", 3, 8, true, 7, rank, 2));
      DataLoader b = MustOpen(Opts(dir + other + "/train_*.bin", 3, 8, true, 7, rank, 2));
      ASSERT_EQ(a.num_samples(), b.num_samples());
      EXPECT_EQ(b.file_token_bytes(0), 4);
      EXPECT_EQ(b.file_token_bytes(1), other == std::string("/b") ? 4 : 2);
      for (int step = 0; step < 20; ++step) ASSERT_EQ(Next(&a), Next(&b)) << other << " rank " << rank << " step " << step;
    }
  }
}

// Ids above 65535 (a Llama 3-sized vocabulary) reach the batches whole, and the vocabulary
// check sees them.
TEST(DataLoader, IdsAbove65535) {
  const std::string dir = TestDir();
  std::vector<uint32_t> ids(100);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 65530 + static_cast<uint32_t>(i) * 631;
  ASSERT_TRUE(WriteTokenShard(dir + "/train.bin", ids, 4).ok());
  auto o = Opts(dir + "/train.bin", 2, 8, false);
  o.vocab_size = 128256;
  DataLoader loader = MustOpen(o);
  const auto w = Next(&loader);
  ASSERT_EQ(w.size(), 2u);
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t <= 8; ++t) EXPECT_EQ(w[b][t], static_cast<int32_t>(ids[b * 8 + t]));
  o.vocab_size = 100000;
  auto r = DataLoader::Open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind(dir + "/train.bin: token 100235 at index 55", 0), 0u) << r.status().message();
}

TEST(DataLoader, BadShardOrOptionsAreErrors) {
  const std::string dir = TestDir();
  MakeShard(dir + "/train_0.bin", 500, 15);
  {
    std::ofstream bad(dir + "/train_1.bin", std::ios::binary);
    bad << "not a shard";
  }
  auto r = DataLoader::Open(Opts(dir + "/train_*.bin", 1, 8, false));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind(dir + "/train_1.bin: ", 0), 0u) << r.status().message();

  auto bad_rank = DataLoader::Open(Opts(dir + "/train_0.bin", 1, 8, false, 1, 3, 3));
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_NE(bad_rank.status().message().find("rank=3"), std::string::npos);
  EXPECT_FALSE(DataLoader::Open(Opts(dir + "/train_0.bin", 0, 8, false)).ok());
  EXPECT_FALSE(DataLoader::Open(Opts(dir + "/train_0.bin", 1, 0, false)).ok());
}

}  // namespace
}  // namespace shardgpt
