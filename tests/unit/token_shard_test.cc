#include "io/token_shard.h"
#include "tests/unit/io_test_util.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace shardgpt {
namespace {

using testutil::TestDir;
using testutil::PutLE32;
using testutil::WriteFile;
using testutil::ReadFile;

namespace fs = std::filesystem;

// Builds a shard by hand (not with WriteTokenShard) so bad files can be made.
std::string RawShard(int32_t magic, int32_t version, int32_t count, const std::vector<uint16_t>& tokens) {
  std::string s;
  PutLE32(&s, magic);
  PutLE32(&s, version);
  PutLE32(&s, count);
  s.resize(1024, '\0');
  for (uint16_t t : tokens) {
    s.push_back(static_cast<char>(t & 0xff));
    s.push_back(static_cast<char>(t >> 8));
  }
  return s;
}

TEST(TokenShard, RoundTrip) {
  const std::string path = TestDir() + "/a.bin";
  std::vector<uint16_t> tokens = {0, 1, 255, 256, 50256, 65535, 7, 7};
  ASSERT_TRUE(WriteTokenShard(path, tokens).ok());
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(fs::file_size(path), 1024u + 2 * tokens.size());

  // The bytes on disk are exactly the documented format.
  EXPECT_EQ(ReadFile(path), RawShard(20240520, 1, static_cast<int32_t>(tokens.size()), tokens));

  auto read = ReadTokenShard(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read.value(), tokens);

  auto info = ReadTokenShardInfo(path);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->num_tokens, tokens.size());
  EXPECT_EQ(info->file_bytes, 1024u + 2 * tokens.size());
  EXPECT_EQ(MaxTokenId(read.value()), 65535);
  EXPECT_EQ(MaxTokenId({3, 9, 2}), 9);
  EXPECT_EQ(MaxTokenId({}), 0);
}

TEST(TokenShard, EmptyShardRoundTrip) {
  const std::string path = TestDir() + "/empty.bin";
  ASSERT_TRUE(WriteTokenShard(path, {}).ok());
  auto read = ReadTokenShard(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_TRUE(read->empty());
}

TEST(TokenShard, OverwriteReplacesWholeFile) {
  const std::string path = TestDir() + "/a.bin";
  ASSERT_TRUE(WriteTokenShard(path, std::vector<uint16_t>(100, 5)).ok());
  ASSERT_TRUE(WriteTokenShard(path, {1, 2}).ok());
  auto read = ReadTokenShard(path);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read.value(), (std::vector<uint16_t>{1, 2}));
}

TEST(TokenShard, WriteIntoMissingDirectoryFails) {
  const std::string path = TestDir() + "/no/such/dir/a.bin";
  Status s = WriteTokenShard(path, {1});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_FALSE(fs::exists(path));
}

// Checks that reading `path` fails with a one-line message naming the file and `what`.
void ExpectReadError(const std::string& path, const std::string& what) {
  auto read = ReadTokenShard(path);
  ASSERT_FALSE(read.ok());
  const std::string& msg = read.status().message();
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  auto info = ReadTokenShardInfo(path);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().message(), msg);
}

TEST(TokenShard, WrongMagic) {
  const std::string path = TestDir() + "/magic.bin";
  WriteFile(path, RawShard(123, 1, 2, {1, 2}));
  ExpectReadError(path, "bad magic 123 (expected 20240520");
}

TEST(TokenShard, WrongVersion) {
  const std::string path = TestDir() + "/version.bin";
  WriteFile(path, RawShard(20240520, 7, 2, {1, 2}));
  ExpectReadError(path, "unsupported version 7 (expected 1)");
}

TEST(TokenShard, SizeDisagreesWithHeader) {
  const std::string dir = TestDir();
  WriteFile(dir + "/short.bin", RawShard(20240520, 1, 3, {1, 2}));       // one token missing
  ExpectReadError(dir + "/short.bin", "file has 1028 bytes, header says 1030");
  WriteFile(dir + "/long.bin", RawShard(20240520, 1, 1, {1, 2}));        // one token extra
  ExpectReadError(dir + "/long.bin", "file has 1028 bytes, header says 1026");
  WriteFile(dir + "/odd.bin", RawShard(20240520, 1, 2, {1, 2}) + "x");   // half a token
  ExpectReadError(dir + "/odd.bin", "file has 1029 bytes, header says 1028");
  WriteFile(dir + "/neg.bin", RawShard(20240520, 1, -4, {}));
  ExpectReadError(dir + "/neg.bin", "negative token count -4");
}

TEST(TokenShard, TooShort) {
  const std::string dir = TestDir();
  WriteFile(dir + "/tiny.bin", std::string(100, '\0'));
  ExpectReadError(dir + "/tiny.bin", "file has 100 bytes, too short");
  WriteFile(dir + "/zero.bin", "");
  ExpectReadError(dir + "/zero.bin", "file has 0 bytes");
}

TEST(TokenShard, MissingFile) {
  ExpectReadError(TestDir() + "/nope.bin", "cannot open");
}

}  // namespace
}  // namespace shardgpt
