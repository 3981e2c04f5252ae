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

// Builds a shard by hand (not with WriteTokenShard) so bad files can be made; `width`
// bytes per token, little endian.
std::string RawShard(int32_t magic, int32_t version, int32_t count, const std::vector<uint32_t>& tokens,
                     int width = 2) {
  std::string s;
  PutLE32(&s, magic);
  PutLE32(&s, version);
  PutLE32(&s, count);
  s.resize(1024, '\0');
  for (uint32_t t : tokens) {
    for (int b = 0; b < width; b++) s.push_back(static_cast<char>((t >> (8 * b)) & 0xff));
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
  const std::vector<uint32_t> wide(tokens.begin(), tokens.end());
  EXPECT_EQ(ReadFile(path), RawShard(20240520, 1, static_cast<int32_t>(tokens.size()), wide));

  auto read = ReadTokenShard(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->ids, wide);
  EXPECT_EQ(read->token_bytes, 2);

  auto info = ReadTokenShardInfo(path);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->num_tokens, tokens.size());
  EXPECT_EQ(info->file_bytes, 1024u + 2 * tokens.size());
  EXPECT_EQ(info->token_bytes, 2);
  EXPECT_EQ(MaxTokenId(read->ids), 65535u);
  EXPECT_EQ(MaxTokenId({3, 9, 2}), 9u);
  EXPECT_EQ(MaxTokenId({}), 0u);
}

TEST(TokenShard, EmptyShardRoundTrip) {
  const std::string path = TestDir() + "/empty.bin";
  ASSERT_TRUE(WriteTokenShard(path, std::vector<uint16_t>{}).ok());
  auto read = ReadTokenShard(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_TRUE(read->ids.empty());
}

TEST(TokenShard, OverwriteReplacesWholeFile) {
  const std::string path = TestDir() + "/a.bin";
  ASSERT_TRUE(WriteTokenShard(path, std::vector<uint16_t>(100, 5)).ok());
  ASSERT_TRUE(WriteTokenShard(path, std::vector<uint16_t>{1, 2}).ok());
  auto read = ReadTokenShard(path);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->ids, (std::vector<uint32_t>{1, 2}));
}

TEST(TokenShard, WriteIntoMissingDirectoryFails) {
  const std::string path = TestDir() + "/no/such/dir/a.bin";
  Status s = WriteTokenShard(path, std::vector<uint16_t>{1});
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
  ExpectReadError(path, "bad magic 123 version 1 (expected magic 20240520 version 1 (GPT-2, uint16 tokens) or "
                        "20240801 version 7 (Llama 3, uint32 tokens)");
}

TEST(TokenShard, WrongVersion) {
  const std::string path = TestDir() + "/version.bin";
  WriteFile(path, RawShard(20240520, 7, 2, {1, 2}));
  ExpectReadError(path, "magic 20240520 with unsupported version 7 (expected magic 20240520 version 1");
  // each magic with the other's version
  WriteFile(path, RawShard(20240801, 1, 2, {1, 2}, 4));
  ExpectReadError(path, "magic 20240801 with unsupported version 1 (expected magic 20240520 version 1 (GPT-2, uint16 "
                        "tokens) or 20240801 version 7 (Llama 3, uint32 tokens))");
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

TEST(TokenShard, Uint32RoundTrip) {
  const std::string dir = TestDir();
  const std::vector<uint32_t> ids = {0, 1, 65535, 65536, 128255, 1999999, 0x7fffffffu, 0xffffffffu, 7};
  ASSERT_TRUE(WriteTokenShard(dir + "/a.bin", ids, 4).ok());
  EXPECT_FALSE(fs::exists(dir + "/a.bin.tmp"));
  // The bytes on disk are exactly llm.c's Llama 3 format.
  EXPECT_EQ(ReadFile(dir + "/a.bin"), RawShard(20240801, 7, static_cast<int32_t>(ids.size()), ids, 4));
  auto read = ReadTokenShard(dir + "/a.bin");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->token_bytes, 4);
  EXPECT_EQ(read->ids, ids);
  auto info = ReadTokenShardInfo(dir + "/a.bin");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->token_bytes, 4);
  EXPECT_EQ(info->num_tokens, ids.size());
  EXPECT_EQ(info->file_bytes, 1024u + 4 * ids.size());
  EXPECT_EQ(MaxTokenId(read->ids), 0xffffffffu);

  ASSERT_TRUE(WriteTokenShard(dir + "/empty.bin", std::vector<uint32_t>{}, 4).ok());
  auto empty = ReadTokenShard(dir + "/empty.bin");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->token_bytes, 4);
  EXPECT_TRUE(empty->ids.empty());
}

// The uint32 writer at width 2 writes the same bytes as the uint16 writer: the GPT-2 format,
// byte for byte as before the Llama 3 format existed.
TEST(TokenShard, Uint16FilesAreUnchanged) {
  const std::string dir = TestDir();
  const std::vector<uint16_t> t16 = {0, 1, 255, 256, 50256, 65535, 7, 7};
  const std::vector<uint32_t> t32(t16.begin(), t16.end());
  ASSERT_TRUE(WriteTokenShard(dir + "/a.bin", t16).ok());
  ASSERT_TRUE(WriteTokenShard(dir + "/b.bin", t32, 2).ok());
  std::string expect;
  PutLE32(&expect, 20240520);
  PutLE32(&expect, 1);
  PutLE32(&expect, 8);
  expect.resize(1024, '\0');
  const unsigned char body[] = {0, 0, 1, 0, 255, 0, 0, 1, 0x50, 0xc4, 0xff, 0xff, 7, 0, 7, 0};
  expect.append(reinterpret_cast<const char*>(body), sizeof(body));
  EXPECT_EQ(ReadFile(dir + "/a.bin"), expect);
  EXPECT_EQ(ReadFile(dir + "/b.bin"), expect);
  // an id above 65535 does not fit width 2, and no file is left
  Status s = WriteTokenShard(dir + "/c.bin", {1, 65536}, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("token 65536 at index 1 does not fit uint16"), std::string::npos) << s.message();
  EXPECT_FALSE(fs::exists(dir + "/c.bin"));
  EXPECT_FALSE(fs::exists(dir + "/c.bin.tmp"));
  EXPECT_FALSE(WriteTokenShard(dir + "/d.bin", {1}, 3).ok());
  EXPECT_EQ(TokenBytesForVocab(256), 2);
  EXPECT_EQ(TokenBytesForVocab(65536), 2);
  EXPECT_EQ(TokenBytesForVocab(65537), 4);
  EXPECT_EQ(TokenBytesForVocab(128256), 4);
}

TEST(TokenShard, TruncatedUint32ShardNamesTheFile) {
  const std::string dir = TestDir();
  const std::string whole = RawShard(20240801, 7, 3, {70000, 1, 2}, 4);
  WriteFile(dir + "/cut.bin", whole.substr(0, whole.size() - 1));  // the last byte missing
  ExpectReadError(dir + "/cut.bin", "file has 1035 bytes, header says 1036 (1024 + 4 * 3 tokens); truncated");
  // 2-byte tokens in a file whose header says uint32: the size gives it away
  WriteFile(dir + "/narrow.bin", RawShard(20240801, 7, 3, {1, 2, 3}, 2));
  ExpectReadError(dir + "/narrow.bin", "file has 1030 bytes, header says 1036");
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
