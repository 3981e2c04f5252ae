// The Hugging Face readers and writers: the byte-level BPE tokenizer (io/bpe_tokenizer.h) on a
// hand-made tokenizer.json, safetensors (io/safetensors.h) and HF GPT-2 directories
// (io/hf_gpt2.h). The comparison with Hugging Face's own libraries is in tests/e2e/hf_*.sh.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "io/bpe_tokenizer.h"
#include "io/hf_gpt2.h"
#include "io/safetensors.h"

namespace shardgpt {
namespace {

// GPT-2's byte -> code point map, as UTF-8.
std::string ByteSymbol(int b) {
  int extra = 0;
  uint32_t cp = 0;
  for (int x = 0; x <= b; x++) {
    const bool keep = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
    cp = keep ? x : 256 + extra++;
  }
  std::string s;
  if (cp < 0x80) s.push_back(static_cast<char>(cp));
  else s.push_back(static_cast<char>(0xC0 | (cp >> 6))), s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  return s;
}

// byte b has id b; merges (h e) (l l) (he ll) (Ġ w) (o r) get ids 256..260; <|endoftext|> 261.
nlohmann::json TinyTokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; b++) vocab[ByteSymbol(b)] = b;
  const std::string sp = ByteSymbol(' ');
  const std::vector<std::pair<std::string, std::string>> merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {sp, "w"}, {"o", "r"}};
  nlohmann::json m = nlohmann::json::array();
  int id = 256;
  for (const auto& [a, b] : merges) vocab[a + b] = id++, m.push_back(a + " " + b);
  return {{"added_tokens", {{{"id", 261}, {"content", "<|endoftext|>"}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
}

std::vector<int32_t> Encode(const BpeTokenizer& t, const std::string& s) {
  BpeTokenizer::Session session(t);
  std::vector<int32_t> ids;
  Status st = session.Encode("x", s.data(), s.size(), 0, &ids);
  EXPECT_TRUE(st.ok()) << st.message();
  return ids;
}

TEST(BpeTokenizer, MergesByRankAndSplitsAddedTokens) {
  auto t = BpeTokenizer::Parse("tok.json", TinyTokenizer().dump());
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t.value()->vocab_size(), 262);
  EXPECT_EQ(t.value()->eot_token(), 261);
  // "hello" -> he l l o -> he ll o -> hell o; " world" -> Ġw o r l d -> Ġw or l d
  EXPECT_EQ(Encode(*t.value(), "hello world"), (std::vector<int32_t>{258, 'o', 259, 260, 'l', 'd'}));
  EXPECT_EQ(Encode(*t.value(), "a<|endoftext|>b"), (std::vector<int32_t>{'a', 261, 'b'}));
  std::string back;
  for (int32_t id : Encode(*t.value(), "caf\xC3\xA9 \xF0\x9F\x98\x80\n\n  x")) back += t.value()->Decode(id);
  EXPECT_EQ(back, "caf\xC3\xA9 \xF0\x9F\x98\x80\n\n  x");
}

// The property prepare relies on: encoding the pieces between SafeCut points gives the ids of
// the whole text, on random texts dense in newlines, spaces, digits and non-ASCII letters.
TEST(BpeTokenizer, SafeCutsDoNotChangeTheIds) {
  auto t = BpeTokenizer::Parse("tok.json", TinyTokenizer().dump());
  ASSERT_TRUE(t.ok());
  const std::vector<std::string> alphabet = {"\n", " ", "  ", "h", "e", "l", "o", "w", "r", "1", ".", "'s", "\xC3\xA9", "\t",
                                             "<|endoftext|>"};
  std::mt19937 rng(7);
  int cuts = 0;
  for (int trial = 0; trial < 300; trial++) {
    std::string s;
    for (int i = 0; i < 60; i++) s += alphabet[rng() % alphabet.size()];
    const std::vector<int32_t> whole = Encode(*t.value(), s);
    std::vector<int32_t> pieces;
    size_t at = 0;
    while (at < s.size()) {
      const size_t cut = t.value()->SafeCut(s.data(), at, s.size());  // the last cut after `at`...
      const size_t first = cut ? t.value()->SafeCut(s.data(), at, at + 1 + rng() % (cut - at)) : 0;  // ...or an earlier one
      const size_t end = first > at ? first : cut > at ? cut : s.size();
      cuts += end < s.size();
      const std::vector<int32_t> p = Encode(*t.value(), s.substr(at, end - at));
      pieces.insert(pieces.end(), p.begin(), p.end());
      at = end;
    }
    ASSERT_EQ(pieces, whole) << "text: " << s;
  }
  EXPECT_GT(cuts, 100);  // the property was exercised
}

TEST(BpeTokenizer, RefusesWhatItDoesNotImplement) {
  auto refuse = [](nlohmann::json j, const std::string& words) {
    auto t = BpeTokenizer::Parse("tok.json", j.dump());
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find(words), std::string::npos) << t.status().message();
    EXPECT_EQ(t.status().message().find('\n'), std::string::npos);
  };
  nlohmann::json j = TinyTokenizer();
  j["model"]["type"] = "Unigram";
  refuse(j, "unsupported model type \"Unigram\"");
  j = TinyTokenizer();
  j["normalizer"] = {{"type", "NFC"}};
  refuse(j, "normalizer");
  j = TinyTokenizer();
  j["pre_tokenizer"]["add_prefix_space"] = true;
  refuse(j, "add_prefix_space");
  j = TinyTokenizer();
  j["model"]["vocab"].erase(ByteSymbol(0));
  refuse(j, "no symbol for byte 0x00");
  j = TinyTokenizer();
  j["model"]["merges"].push_back("q z");
  refuse(j, "not in the vocabulary");
  refuse(nlohmann::json::array(), "not a JSON object");
  j = TinyTokenizer();
  j["added_tokens"].push_back({{"id", 16000000}, {"content", "<|far|>"}});
  refuse(j, "lies beyond the");
  // optional fields of the wrong JSON type: one error naming the field, never a thrown type_error
  // (tests/fuzz/regressions/tokenizer_json/)
  j = TinyTokenizer();
  j["pre_tokenizer"]["add_prefix_space"] = "n l";
  refuse(j, "pre_tokenizer.add_prefix_space is \"n l\" (expected true or false)");
  j = TinyTokenizer();
  j["model"]["ignore_merges"] = 1;
  refuse(j, "model.ignore_merges is 1 (expected true or false)");
  j = TinyTokenizer();
  j["model"]["type"] = 7;
  refuse(j, "model.type 7 is not a string");
  j = TinyTokenizer();
  j["pre_tokenizer"]["type"] = nullptr;
  refuse(j, "pre_tokenizer");
  j = TinyTokenizer();
  j["decoder"] = {{"type", 3}};
  refuse(j, "decoder");

  auto t = BpeTokenizer::Parse("tok.json", TinyTokenizer().dump());
  ASSERT_TRUE(t.ok());
  BpeTokenizer::Session session(*t.value());
  std::vector<int32_t> ids;
  const std::string bad = "ok \xC3(";  // a lead byte without its continuation at offset 3
  Status st = session.Encode("in.txt", bad.data(), bad.size(), 100, &ids);
  EXPECT_EQ(st.message(), "in.txt: invalid UTF-8 at byte 103 (expected UTF-8 text)");
}

TEST(Safetensors, RoundTripsAndRefusesLyingHeaders) {
  const std::string dir = testing::TempDir() + "/st_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/a.safetensors";
  std::vector<SafetensorsTensor> ts = {{"x", {2, 3}, {1, 2, 3, 4, 5, 6}}, {"y", {1}, {-0.5f}}};
  for (const bool bf16 : {false, true}) {
    ASSERT_TRUE(WriteSafetensors(path, ts, bf16, {{"format", "pt"}}).ok());
    auto r = SafetensorsReader::Open(path);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r.value()->metadata().at("format"), "pt");
    const SafetensorsEntry* x = r.value()->Find("x");
    ASSERT_NE(x, nullptr);
    EXPECT_EQ(x->dtype, bf16 ? "BF16" : "F32");
    EXPECT_EQ(x->shape, (std::vector<int64_t>{2, 3}));
    std::vector<float> v(4);
    ASSERT_TRUE(r.value()->ReadFloats(*x, 2, 4, v.data()).ok());
    EXPECT_EQ(v, (std::vector<float>{3, 4, 5, 6}));  // small integers are exact in bf16
  }
  std::filesystem::remove_all(dir);
  auto parse = [](const std::string& json, uint64_t data) { return ParseSafetensorsHeader("f", json, data, nullptr); };
  EXPECT_TRUE(parse(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8).ok());
  EXPECT_NE(parse(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}})", 12).status().message().find("needs 8"),
            std::string::npos);
  EXPECT_NE(parse(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)
                .status().message().find("overlaps"), std::string::npos);
  EXPECT_NE(parse(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8).status().message().find("no tensor"),
            std::string::npos);
  EXPECT_NE(parse(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4).status().message().find("outside"),
            std::string::npos);
  EXPECT_NE(parse(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8).status().message().find("unknown dtype"),
            std::string::npos);
  EXPECT_FALSE(parse("[1,2]", 0).ok());
  // A name or dtype with control characters (JSON's "\n" escape in a key, found by the fuzzer)
  // is quoted with them escaped: the error stays one line.
  for (const char* json : {R"({"a\nb\"c":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                           R"({"ab":{"dtype":"F\n32","shape":[2],"data_offsets":[0,8]}})"}) {
    const std::string m = parse(json, 4).status().message();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_TRUE(m.find(R"("a\nb\"c")") != std::string::npos || m.find(R"(unknown dtype "F\n32")") != std::string::npos)
        << m;
  }
}

// export --hf then --init: every element of the flat buffer back, read in whole and in odd
// ranges (the Conv1D transposes and the padded wte rows included).
TEST(HfGpt2, WriteThenReadRangesGivesTheParameters) {
  const GPTConfig c{2, 2, 16, 8, 300};
  const ParamLayout layout(c);
  std::vector<float> p(layout.total_numel());
  InitParameters(layout, 11, p.data());
  const std::string dir = testing::TempDir() + "/hf_" + std::to_string(::getpid());
  ASSERT_TRUE(WriteHfGpt2(dir, layout, p.data(), false).ok());
  EXPECT_TRUE(IsHfGpt2Path(dir));
  auto r = HfGpt2Reader::Open(dir + "/model.safetensors");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r.value()->config().FirstDifference(c), "");
  std::vector<float> all(p.size(), -1.0f);
  ASSERT_TRUE(r.value()->ReadRange(0, all.size(), all.data()).ok());
  EXPECT_EQ(all, p);
  std::mt19937 rng(3);
  for (int i = 0; i < 50; i++) {
    const uint64_t a = rng() % p.size(), b = a + rng() % (p.size() - a + 1);
    std::vector<float> part(b - a);
    ASSERT_TRUE(r.value()->ReadRange(a, b, part.data()).ok());
    ASSERT_TRUE(std::equal(part.begin(), part.end(), p.begin() + a)) << a << " " << b;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardgpt
