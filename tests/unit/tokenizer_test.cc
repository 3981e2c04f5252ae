#include "io/tokenizer.h"
#include "tests/unit/io_test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/prepare.h"
#include "io/token_shard.h"

namespace shardgpt {
namespace {

using testutil::TestDir;
using testutil::PutLE32;
using testutil::WriteFile;
using testutil::ReadFile;

namespace fs = std::filesystem;

// An llm.c tokenizer file, written by hand from the format in docs/DATA.md.
std::string LlmcTokenizerFile(int32_t magic, int32_t version, const std::vector<std::string>& pieces,
                              int32_t eot) {
  std::string s;
  PutLE32(&s, magic);
  PutLE32(&s, version);
  PutLE32(&s, static_cast<int32_t>(pieces.size()));
  PutLE32(&s, eot);
  s.resize(1024, '\0');
  for (const auto& p : pieces) {
    s.push_back(static_cast<char>(static_cast<unsigned char>(p.size())));
    s += p;
  }
  return s;
}

TEST(Tokenizer, ByteLevelRoundTrip) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  const std::string text = "Hello, world!\n" + all + "\xc3\xa9t\xc3\xa9";
  const std::vector<uint16_t> ids = ByteLevelTokenizer::Encode(text);
  ASSERT_EQ(ids.size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(ids[i], static_cast<unsigned char>(text[i]));
  EXPECT_EQ(ids[0], 'H');
  EXPECT_EQ(ids[14 + 255], 255);
  std::string back;
  for (uint16_t id : ids) back += ByteLevelTokenizer::Decode(id);
  EXPECT_EQ(back, text);

  Tokenizer t = Tokenizer::ByteLevel();
  EXPECT_EQ(t.vocab_size(), 256);
  EXPECT_EQ(t.eot_token(), -1);
  EXPECT_EQ(t.DecodeAll(std::vector<int>(ids.begin(), ids.end())), text);
  EXPECT_EQ(t.Decode(256), "<?>");
  EXPECT_EQ(t.Decode(-1), "<?>");
  EXPECT_EQ(ByteLevelTokenizer::Decode(1000), "<?>");
}

TEST(Tokenizer, ReadsLlmcTokenizerFileVersion2) {
  const std::string path = TestDir() + "/tok.bin";
  const std::vector<std::string> pieces = {"a", " the", std::string("\x00\xff", 2), "", "<|endoftext|>"};
  WriteFile(path, LlmcTokenizerFile(20240328, 2, pieces, 4));
  auto t = LoadLlmcTokenizer(path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->vocab_size(), 5);
  EXPECT_EQ(t->eot_token(), 4);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(t->Decode(i), pieces[i]);
  EXPECT_EQ(t->Decode(5), "<?>");
  EXPECT_EQ(t->DecodeAll({1, 0, 4}), " thea<|endoftext|>");
}

TEST(Tokenizer, VersionOneImpliesGpt2EndOfText) {
  const std::string path = TestDir() + "/gpt2.bin";
  std::vector<std::string> pieces(50257, "x");
  pieces[50256] = "<|endoftext|>";
  WriteFile(path, LlmcTokenizerFile(20240328, 1, pieces, 0 /* ignored in version 1 */));
  auto t = LoadLlmcTokenizer(path);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->vocab_size(), 50257);
  EXPECT_EQ(t->eot_token(), 50256);
  EXPECT_EQ(t->Decode(50256), "<|endoftext|>");
}

void ExpectLoadError(const std::string& path, const std::string& what) {
  auto t = LoadLlmcTokenizer(path);
  ASSERT_FALSE(t.ok());
  const std::string& msg = t.status().message();
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

TEST(Tokenizer, BadLlmcTokenizerFiles) {
  const std::string dir = TestDir();
  const std::vector<std::string> pieces = {"ab", "c"};
  WriteFile(dir + "/magic.bin", LlmcTokenizerFile(20240520, 2, pieces, 1));
  ExpectLoadError(dir + "/magic.bin", "bad magic 20240520 (expected 20240328");
  WriteFile(dir + "/version.bin", LlmcTokenizerFile(20240328, 3, pieces, 1));
  ExpectLoadError(dir + "/version.bin", "unsupported version 3 (expected 1 or 2)");
  std::string whole = LlmcTokenizerFile(20240328, 2, pieces, 1);
  WriteFile(dir + "/trunc1.bin", whole.substr(0, whole.size() - 1));  // inside the last token
  ExpectLoadError(dir + "/trunc1.bin", "truncated");
  WriteFile(dir + "/trunc2.bin", whole.substr(0, 1024 + 3));  // before the last length byte
  ExpectLoadError(dir + "/trunc2.bin", "truncated at token 1");
  WriteFile(dir + "/header.bin", whole.substr(0, 500));
  ExpectLoadError(dir + "/header.bin", "file has 500 bytes, too short");
  WriteFile(dir + "/extra.bin", whole + "zz");
  ExpectLoadError(dir + "/extra.bin", "extra bytes");
  WriteFile(dir + "/eot.bin", LlmcTokenizerFile(20240328, 2, pieces, 2));
  ExpectLoadError(dir + "/eot.bin", "eot token 2");
  ExpectLoadError(dir + "/missing.bin", "cannot open");
}

TEST(Prepare, SplitsTrainAndValWithReadableHeaders) {
  const std::string dir = TestDir();
  std::string a(600, 'a'), b;
  for (int i = 0; i < 400; ++i) b.push_back(static_cast<char>(i % 256));
  WriteFile(dir + "/a.txt", a);
  WriteFile(dir + "/b.txt", b);
  PrepareStats stats;
  const std::string out = dir + "/out/nested";  // created on demand
  Status s = PrepareByteLevel({dir + "/a.txt", dir + "/b.txt"}, out, 0.05, &stats);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(stats.total_tokens, 1000u);
  EXPECT_EQ(stats.val_tokens, 50u);
  EXPECT_EQ(stats.train_tokens, 950u);
  EXPECT_EQ(stats.train_path, out + "/train.bin");
  EXPECT_EQ(stats.val_path, out + "/val.bin");

  auto train = ReadTokenShard(out + "/train.bin");
  auto val = ReadTokenShard(out + "/val.bin");
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  ASSERT_TRUE(val.ok()) << val.status().ToString();
  const std::string all = a + b;  // concatenated in argument order, nothing in between
  std::vector<uint32_t> expect_train, expect_val;
  for (size_t i = 0; i < all.size(); ++i) {
    (i < 950 ? expect_train : expect_val).push_back(static_cast<unsigned char>(all[i]));
  }
  EXPECT_EQ(train->ids, expect_train);
  EXPECT_EQ(val->ids, expect_val);
  EXPECT_EQ(train->token_bytes, 2);
  // Raw header check: magic, version, count as little-endian int32.
  const std::string raw = ReadFile(out + "/val.bin");
  ASSERT_EQ(raw.size(), 1024u + 100u);
  std::string header;
  PutLE32(&header, 20240520);
  PutLE32(&header, 1);
  PutLE32(&header, 50);
  EXPECT_EQ(raw.substr(0, 12), header);
}

TEST(Prepare, ValFractionRoundsDown) {
  const std::string dir = TestDir();
  WriteFile(dir + "/a.txt", std::string(99, 'z'));
  PrepareStats stats;
  ASSERT_TRUE(PrepareByteLevel({dir + "/a.txt"}, dir, 0.1, &stats).ok());
  EXPECT_EQ(stats.val_tokens, 9u);  // floor(9.9)
  EXPECT_EQ(stats.train_tokens, 90u);
  ASSERT_TRUE(PrepareByteLevel({dir + "/a.txt"}, dir, 0.0, &stats).ok());
  EXPECT_EQ(stats.val_tokens, 0u);
  auto val = ReadTokenShard(dir + "/val.bin");
  ASSERT_TRUE(val.ok());
  EXPECT_TRUE(val->ids.empty());
}

TEST(Prepare, BadInputsNameTheFile) {
  const std::string dir = TestDir();
  WriteFile(dir + "/ok.txt", "hello");
  WriteFile(dir + "/empty.txt", "");
  Status missing = PrepareByteLevel({dir + "/ok.txt", dir + "/nope.txt"}, dir + "/out");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.message().rfind(dir + "/nope.txt: cannot open", 0), 0u) << missing.message();
  Status empty = PrepareByteLevel({dir + "/empty.txt"}, dir + "/out");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.message().rfind(dir + "/empty.txt: file is empty", 0), 0u) << empty.message();
  Status isdir = PrepareByteLevel({dir}, dir + "/out");
  ASSERT_FALSE(isdir.ok());
  EXPECT_EQ(isdir.message().rfind(dir + ": ", 0), 0u) << isdir.message();
  EXPECT_FALSE(PrepareByteLevel({dir + "/ok.txt"}, dir + "/out", 1.0).ok());
  EXPECT_FALSE(PrepareByteLevel({}, dir + "/out").ok());
  EXPECT_FALSE(fs::exists(dir + "/out/train.bin"));  // nothing written on error
}

}  // namespace
}  // namespace shardgpt
