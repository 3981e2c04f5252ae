// llm.c model files: write/read round trip (version 3), reading version 5 (bf16), and the
// errors for files that are not models or disagree with their header.
#include "io/llmc_model.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "base/bf16.h"

namespace shardgpt {
namespace {

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/" + name; }

TEST(LlmcModel, RoundTripVersion3) {
  GPTConfig c{2, 2, 16, 8, 100};
  ParamLayout layout(c);
  std::vector<float> p(layout.total_numel());
  InitParameters(layout, 5, p.data());
  const std::string path = TempPath("m3.bin");
  ASSERT_TRUE(WriteLlmcModel(path, layout, p.data()).ok());
  auto m = ReadLlmcModel(path);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->config.FirstDifference(c), "");
  EXPECT_EQ(m->params, p);
  // llm.c's order groups tensors by kind across layers: the second tensor in the file after
  // wte and wpe is layer 0's ln_1.weight, then layer 1's ln_1.weight
  std::ifstream f(path, std::ios::binary);
  std::vector<float> file(1024 / 4 + layout.total_numel());
  f.read(reinterpret_cast<char*>(file.data()), file.size() * 4);
  const size_t after_embeddings = 256 + 128 * 16 + 8 * 16;
  const TensorInfo& ln1_l1 = layout.tensors()[layout.Find("h.1.ln_1.weight")];
  EXPECT_EQ(file[after_embeddings + 16], p[layout.units()[ln1_l1.unit].offset + ln1_l1.offset]);
}

TEST(LlmcModel, ReadsVersion5Bf16) {
  GPTConfig c{1, 2, 16, 8, 128};
  ParamLayout layout(c);
  std::vector<float> p(layout.total_numel());
  InitParameters(layout, 6, p.data());
  const std::string path3 = TempPath("m5src.bin"), path5 = TempPath("m5.bin");
  ASSERT_TRUE(WriteLlmcModel(path3, layout, p.data()).ok());
  // convert the fp32 file to version 5 by hand: same header with version 5, bf16 payload
  std::ifstream in(path3, std::ios::binary);
  std::vector<int32_t> header(256);
  in.read(reinterpret_cast<char*>(header.data()), 1024);
  std::vector<float> body(layout.total_numel());
  in.read(reinterpret_cast<char*>(body.data()), body.size() * 4);
  header[1] = 5;
  std::vector<uint16_t> bf(body.size());
  FloatToBf16(body.data(), bf.data(), body.size());
  std::ofstream out(path5, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  out.write(reinterpret_cast<const char*>(bf.data()), bf.size() * 2);
  out.close();
  auto m = ReadLlmcModel(path5);
  ASSERT_TRUE(m.ok()) << m.status().message();
  for (size_t i = 0; i < p.size(); i++) ASSERT_EQ(m->params[i], RoundToBf16(p[i])) << i;
}

// The range reader behind --init at ZeRO-3: any range of the flat buffer equals that slice of
// the whole file read at once (fp32 and bf16), reading only that range's bytes.
TEST(LlmcModel, RangesEqualTheWholeFile) {
  GPTConfig c{2, 2, 16, 8, 100};
  ParamLayout layout(c);
  std::vector<float> p(layout.total_numel());
  InitParameters(layout, 5, p.data());
  const std::string path = TempPath("mr.bin");
  ASSERT_TRUE(WriteLlmcModel(path, layout, p.data()).ok());
  auto whole = ReadLlmcModel(path);
  ASSERT_TRUE(whole.ok());
  auto r = LlmcModelReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r.value()->config().FirstDifference(c), "");
  const uint64_t n = p.size();
  uint64_t bytes = 0;
  for (uint64_t begin : {uint64_t{0}, uint64_t{1}, uint64_t{2047}, n / 3, n - 5})
    for (uint64_t len : {uint64_t{1}, uint64_t{17}, uint64_t{3000}, n}) {
      const uint64_t end = std::min(n, begin + len);
      std::vector<float> got(end - begin, -1.0f);
      ASSERT_TRUE(r.value()->ReadRange(begin, end, got.data()).ok());
      ASSERT_EQ(0, std::memcmp(got.data(), whole->params.data() + begin, got.size() * 4)) << begin << "+" << len;
      bytes += got.size() * 4;
      EXPECT_EQ(r.value()->bytes_read(), bytes);
    }
}

TEST(LlmcModel, ErrorsNameTheFile) {
  auto missing = ReadLlmcModel(TempPath("nope.bin"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope.bin"), std::string::npos);
  GPTConfig c{1, 2, 16, 8, 128};
  ParamLayout layout(c);
  std::vector<float> p(layout.total_numel(), 0.5f);
  const std::string path = TempPath("trunc.bin");
  ASSERT_TRUE(WriteLlmcModel(path, layout, p.data()).ok());
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(ftruncate(fileno(f), 1024 + 100), 0);
  std::fclose(f);
  auto trunc = ReadLlmcModel(path);
  ASSERT_FALSE(trunc.ok());
  EXPECT_NE(trunc.status().message().find("trunc.bin"), std::string::npos);
  EXPECT_NE(trunc.status().message().find("header"), std::string::npos);
  std::ofstream(TempPath("magic.bin"), std::ios::binary) << std::string(2048, 'x');
  auto magic = ReadLlmcModel(TempPath("magic.bin"));
  ASSERT_FALSE(magic.ok());
  EXPECT_NE(magic.status().message().find("bad magic"), std::string::npos);
}

}  // namespace
}  // namespace shardgpt
