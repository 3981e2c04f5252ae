// The Hugging Face readers and writers: the byte-level BPE tokenizer (io/bpe_tokenizer.h) on a
// hand-made tokenizer.json, safetensors (io/safetensors.h) and HF GPT-2 directories
// (io/hf_gpt2.h). The comparison with Hugging Face's own libraries is in tests/e2e/hf_*.sh.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>
#include <tuple>
#include <nlohmann/json.hpp>
#include <random>

#include "io/bpe_tokenizer.h"
#include "io/hf_gpt2.h"
#include "io/safetensors.h"
#include "io_test_util.h"

namespace shardgpt {
namespace {

using testutil::ByteSymbol;

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

// The symbols of a byte string: ByteSymbol of each byte.
std::string Symbols(const std::string& bytes) {
  std::string s;
  for (unsigned char b : bytes) s += ByteSymbol(b);
  return s;
}

// Llama 3's Split pattern, as its tokenizer.json holds it.
const char kLlama3Regex[] =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

// TinyTokenizer's vocabulary and merges (without <|endoftext|>) as Llama 3's tokenizer.json has
// them: pre_tokenizer Sequence[Split(kLlama3Regex, Isolated), ByteLevel(use_regex false)],
// ignore_merges, whole words (ids 261..290) that no merge builds, which show the pre-tokens'
// boundaries, <|begin_of_text|> 291 and a template putting it before the text.
nlohmann::json LlamaStyleTokenizer() {
  nlohmann::json j = TinyTokenizer();
  int id = 261;
  for (const char* w : {" world", " I", "'LL", "123", "45", " don", "'t", "\r\n", "\tx", "  \n", "  \t\n\n", " 7", "'S",
                        "wORLD", "'s", "  ", " {", " \n", "}\n", " 1", "12", "345", "'L", "LL", "\xC2\x85x", "\xC2\xA0",
                        "'\xC5\xBF", "'\xC5\xBFx", "1\xD9\xA1\xD9\xA2", "\xD9\xA3\xD9\xA4"})
    j["model"]["vocab"][Symbols(w)] = id++;
  j["model"]["ignore_merges"] = true;
  j["added_tokens"] = {{{"id", 291}, {"content", "<|begin_of_text|>"}, {"special", true}, {"normalized", false}}};
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Regex}}}, {"behavior", "Isolated"}, {"invert", false}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  const nlohmann::json bos = {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}};
  const nlohmann::json a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, b = {{"Sequence", {{"id", "B"}, {"type_id", 1}}}};
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
        {{"type", "TemplateProcessing"},
         {"single", {bos, a}},
         {"pair", {bos, a, bos, b}},
         {"special_tokens",
          {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {291}}, {"tokens", {"<|begin_of_text|>"}}}}}}}}}};
  return j;
}

// The property prepare relies on: encoding the pieces between SafeCut points gives the ids of
// the whole text, on random texts dense in newlines, spaces, digits and non-ASCII letters, for
// GPT-2's pre-tokenizer and Llama 3's.
TEST(BpeTokenizer, SafeCutsDoNotChangeTheIds) {
  const std::vector<std::string> alphabet = {"\n", " ", "  ", "h", "e", "l", "o", "w", "r", "1", ".", "'s", "\xC3\xA9", "\t",
                                             "<|endoftext|>", "\r", "{", "}", "'LL", "123", "4", "I", "\xC2\xA0"};
  for (const nlohmann::json& j : {TinyTokenizer(), LlamaStyleTokenizer()}) {
    SCOPED_TRACE(j["pre_tokenizer"].dump());
    auto t = BpeTokenizer::Parse("tok.json", j.dump());
    ASSERT_TRUE(t.ok()) << t.status().message();
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

// A tokenizer over the letters a-d (byte symbols for every byte) with the given merges, in
// order, and added tokens {content, special, normalized}, ids after the vocabulary's.
nlohmann::json LetterTokenizer(const std::vector<std::pair<std::string, std::string>>& merges,
                               const std::vector<std::tuple<std::string, bool, bool>>& added = {}) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; b++) vocab[ByteSymbol(b)] = b;
  int id = 256;
  nlohmann::json m = nlohmann::json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = id++;
    m.push_back(a + " " + b);
  }
  nlohmann::json at = nlohmann::json::array();
  for (const auto& [content, special, normalized] : added)
    at.push_back({{"id", id++}, {"content", content}, {"special", special}, {"normalized", normalized},
                  {"single_word", false}, {"lstrip", false}, {"rstrip", false}});
  return {{"added_tokens", at},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
}

// The ids as strings: the vocabulary's (byte symbols) and the added tokens' contents.
std::vector<std::string> Pieces(const nlohmann::json& tok, const std::vector<int32_t>& ids) {
  std::map<int64_t, std::string> names;
  for (auto it = tok["model"]["vocab"].begin(); it != tok["model"]["vocab"].end(); ++it) names[it.value()] = it.key();
  for (const auto& a : tok["added_tokens"]) names[a["id"]] = "<" + a["content"].get<std::string>() + ">";
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(names.at(id));
  return out;
}

using Strings = std::vector<std::string>;

// Expected ids from Hugging Face tokenizers 0.15.2 on the same tokenizer.json (run by hand:
// Tokenizer.from_file(...).encode(text)).
TEST(BpeTokenizer, DuplicateMergesTakeTheRankOfTheirLastOccurrence) {
  const nlohmann::json j = LetterTokenizer({{"a", "b"}, {"b", "c"}, {"a", "b"}});
  auto t = BpeTokenizer::Parse("tok.json", j.dump());
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(Pieces(j, Encode(*t.value(), "abc")), (Strings{"a", "bc"}));  // first occurrence would give ab c
  EXPECT_EQ(Pieces(j, Encode(*t.value(), "ab")), (Strings{"ab"}));
}

// Added tokens "normalized": false are matched first, over the whole text, then the
// normalized ones between them; special or not does not decide (tokenizers 0.15.2's ids).
TEST(BpeTokenizer, AddedTokensNotNormalizedAreMatchedFirst) {
  struct Case {
    std::vector<std::tuple<std::string, bool, bool>> added;
    std::string text;
    Strings want;
  };
  const std::vector<Case> cases = {
      {{{"ab", true, false}, {"abc", false, true}}, "xabcdx", {"x", "<ab>", "c", "d", "x"}},
      {{{"abc", true, false}, {"ab", false, true}}, "xabcdx", {"x", "<abc>", "d", "x"}},
      {{{"bc", true, false}, {"abc", false, true}}, "xabcdx", {"x", "a", "<bc>", "d", "x"}},
      {{{"abc", true, true}, {"bcd", false, false}}, "xabcdx", {"x", "a", "<bcd>", "x"}},
      {{{"ab", true, true}, {"abc", false, true}}, "xabcdx", {"x", "<abc>", "d", "x"}},
      {{{"ab", false, false}, {"abc", false, true}}, "xabcdx", {"x", "<ab>", "c", "d", "x"}},
      {{{"ab", false, true}, {"b", false, true}}, "abab bab", {"<ab>", "<ab>", ByteSymbol(' '), "<b>", "<ab>"}},
      {{{"aa", false, false}}, "aaaaa", {"<aa>", "<aa>", "a"}},
  };
  for (const Case& c : cases) {
    const nlohmann::json j = LetterTokenizer({}, c.added);
    SCOPED_TRACE(j["added_tokens"].dump());
    auto t = BpeTokenizer::Parse("tok.json", j.dump());
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(Pieces(j, Encode(*t.value(), c.text)), c.want);
  }
  // without "normalized", tokenizers' AddedToken default: not normalized when special
  nlohmann::json j = LetterTokenizer({}, {{"bc", true, false}, {"abc", false, true}});
  j["added_tokens"][0].erase("normalized");
  j["added_tokens"][1].erase("normalized");
  auto t = BpeTokenizer::Parse("tok.json", j.dump());
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(Pieces(j, Encode(*t.value(), "xabcdx")), (Strings{"x", "a", "<bc>", "d", "x"}));
}

// The heap merge against the definition: rescan for the pair of lowest rank (leftmost among
// equals; a pair listed twice has its last rank), merge it, repeat. Random merge lists (with
// repeats) over a-d, random words of up to 600 letters.
TEST(BpeTokenizer, HeapMergeMatchesTheRescanOnRandomWords) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; trial++) {
    std::vector<std::string> symbols = {"a", "b", "c", "d"};
    std::vector<std::pair<std::string, std::string>> merges;
    const int count = 5 + static_cast<int>(rng() % 80);
    for (int i = 0; i < count; i++) {
      if (!merges.empty() && rng() % 8 == 0) {
        merges.push_back(merges[rng() % merges.size()]);
        continue;
      }
      const std::string a = symbols[rng() % symbols.size()], b = symbols[rng() % symbols.size()];
      merges.emplace_back(a, b);
      if (std::find(symbols.begin(), symbols.end(), a + b) == symbols.end()) symbols.push_back(a + b);
    }
    std::map<std::pair<std::string, std::string>, size_t> rank;
    for (size_t i = 0; i < merges.size(); i++) rank[merges[i]] = i;
    const nlohmann::json j = LetterTokenizer(merges);
    auto t = BpeTokenizer::Parse("tok.json", j.dump());
    ASSERT_TRUE(t.ok()) << t.status().message();
    for (int w = 0; w < 30; w++) {
      std::string word;
      const size_t len = 1 + rng() % (w < 25 ? 40 : 600);
      for (size_t i = 0; i < len; i++) word.push_back("abcd"[rng() % (1 + rng() % 4)]);  // skewed: long runs merge deep
      Strings want;
      for (char ch : word) want.emplace_back(1, ch);
      for (;;) {
        size_t best = SIZE_MAX, at = 0;
        for (size_t i = 0; i + 1 < want.size(); i++) {
          auto it = rank.find({want[i], want[i + 1]});
          if (it != rank.end() && it->second < best) best = it->second, at = i;
        }
        if (best == SIZE_MAX) break;
        want[at] += want[at + 1];
        want.erase(want.begin() + static_cast<ptrdiff_t>(at) + 1);
      }
      ASSERT_EQ(Pieces(j, Encode(*t.value(), word)), want) << "word " << word;
    }
  }
}

// Llama 3's pre-tokenizer and ignore_merges: the ids of tokenizers 0.21.4 on the same
// tokenizer.json (run by hand: Tokenizer.from_str(...).encode(text, add_special_tokens=False)).
// The whole words of LlamaStyleTokenizer show the pre-tokens: digits in groups of up to 3,
// case-insensitive contractions ('\u017f is a case of 's), whitespace runs, CRLF.
TEST(BpeTokenizer, Llama3PreTokenizerAndIgnoreMergesMatchTokenizers) {
  const nlohmann::json j = LlamaStyleTokenizer();
  auto t = BpeTokenizer::Parse("tok.json", j.dump());
  ASSERT_TRUE(t.ok()) << t.status().message();
  const std::string sp = ByteSymbol(' ');
  const std::vector<std::pair<std::string, Strings>> cases = {
      {"hello world I'LL 12345 don't\r\n\tx  \n",
       {"hell", "o", Symbols(" world"), Symbols(" I"), "'LL", sp, "123", "45", Symbols(" don"), "'t", Symbols("\r\n"),
        Symbols("\tx"), Symbols("  \n")}},
      {"  \t\n\n  hello<|begin_of_text|>wORLD's 7'S\xC2\xA0\xC2\x85x",
       {Symbols("  \t\n\n"), sp, sp, "hell", "o", "<<|begin_of_text|>>", "wORLD", "'s", sp, "7", "'S", Symbols("\xC2\xA0"),
        Symbols("\xC2\x85x")}},
      {"x'\xC5\xBFx a\xC5\xBF'\xC5\xBF 1\xD9\xA1\xD9\xA2\xD9\xA3\xD9\xA4 { \n}\n",
       {"x", Symbols("'\xC5\xBF"), "x", sp, "a", Symbols("\xC5"), Symbols("\xBF"), Symbols("'\xC5\xBF"), sp,
        Symbols("1\xD9\xA1\xD9\xA2"), Symbols("\xD9\xA3\xD9\xA4"), Symbols(" {"), Symbols(" \n"), Symbols("}\n")}},
  };
  for (const auto& [text, want] : cases) EXPECT_EQ(Pieces(j, Encode(*t.value(), text)), want) << "text: " << text;
  // the template's "single": <|begin_of_text|> before the text, nothing after
  EXPECT_EQ(t.value()->text_prefix(), (std::vector<int32_t>{291}));
  EXPECT_TRUE(t.value()->text_suffix().empty());
}

// Split with a String pattern (tokenizers 0.21.4's ids, as above): the spaces are pieces of their
// own, the rest goes on to ByteLevel's GPT-2 regex.
TEST(BpeTokenizer, SplitWithAStringPattern) {
  nlohmann::json j = LlamaStyleTokenizer();
  j["pre_tokenizer"]["pretokenizers"] = {
      {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Isolated"}, {"invert", false}},
      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}};
  auto t = BpeTokenizer::Parse("tok.json", j.dump());
  ASSERT_TRUE(t.ok()) << t.status().message();
  const std::string sp = ByteSymbol(' ');
  EXPECT_EQ(Pieces(j, Encode(*t.value(), "hello  world's x")), (Strings{"hell", "o", sp, sp, "w", "or", "l", "d", "'s", sp, "x"}));
  EXPECT_EQ(Pieces(j, Encode(*t.value(), " hello")), (Strings{sp, "hell", "o"}));
  EXPECT_EQ(t.value()->SafeCut("ab\ncd", 0, 5), 0u);  // not a pattern SafeCut's rule is known for
}

// Pre-tokenizers, Split options, regex constructs and post-processors that are not implemented:
// one line naming the field and its value.
TEST(BpeTokenizer, RefusesUnsupportedPreTokenizersAndTemplatesWithOneLine) {
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string words;
  };
  auto split = [](nlohmann::json& j) -> nlohmann::json& { return j["pre_tokenizer"]["pretokenizers"][0]; };
  const std::vector<Case> cases = {
      {[&](nlohmann::json& j) { j["truncation"] = {{"max_length", 512}}; }, "truncation an object of 1 is not supported"},
      {[&](nlohmann::json& j) { j["padding"] = {{"strategy", "BatchLongest"}}; }, "padding an object of 1 is not supported"},
      {[&](nlohmann::json& j) { split(j)["behavior"] = "MergedWithPrevious"; },
       "pre_tokenizer.pretokenizers[0].behavior \"MergedWithPrevious\" is not supported"},
      {[&](nlohmann::json& j) { split(j)["behavior"] = "Removed"; }, "behavior \"Removed\" is not supported"},
      {[&](nlohmann::json& j) { split(j)["invert"] = true; }, "pre_tokenizer.pretokenizers[0].invert true is not supported"},
      {[&](nlohmann::json& j) { split(j) = {{"type", "Digits"}, {"individual_digits", true}}; },
       "pre_tokenizer.pretokenizers[0] type \"Digits\" is not supported"},
      {[&](nlohmann::json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "pre_tokenizer type \"Whitespace\" is not supported"},
      {[&](nlohmann::json& j) { split(j)["pattern"] = {{"Regex", "\\w+"}}; }, "the escape \\w is not supported"},
      {[&](nlohmann::json& j) { split(j)["pattern"] = {{"Regex", "^ab"}}; }, "the anchor ^ is not supported"},
      {[&](nlohmann::json& j) { split(j)["pattern"] = {{"Regex", "[[:alpha:]]+"}}; }, "a nested character class"},
      {[&](nlohmann::json& j) { split(j)["pattern"] = {{"Regex", "(?m:a.b)"}}; }, "the group (?m"},
      {[&](nlohmann::json& j) { split(j)["pattern"] = {{"Regex", "[^\\S]"}}; }, "\\S inside a character class"},
      {[&](nlohmann::json& j) { split(j)["pattern"] = {{"Regex", "a*"}}; }, "may match the empty string"},
      {[&](nlohmann::json& j) { split(j)["pattern"] = {{"Regex", "(a"}}; }, "does not compile"},
      {[&](nlohmann::json& j) { split(j)["pattern"] = {{"Glob", "a"}}; }, "pattern is an object of 1"},
      {[&](nlohmann::json& j) { split(j)["pattern"] = {{"String", ""}}; }, "may match the empty string"},
      {[&](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"].erase(1); }, "pre_tokenizer with 0 ByteLevel"},
      {[&](nlohmann::json& j) { std::swap(j["pre_tokenizer"]["pretokenizers"][0], j["pre_tokenizer"]["pretokenizers"][1]); },
       "pre_tokenizer with 1 ByteLevel and pre-tokenizers after it"},
      {[&](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"] = "x"; }, "pre_tokenizer.pretokenizers is \"x\""},
      {[&](nlohmann::json& j) { j["post_processor"]["processors"][1]["type"] = "BertProcessing"; },
       "post_processor.processors[1] type \"BertProcessing\" is not supported"},
      {[&](nlohmann::json& j) { j["post_processor"]["processors"][1]["single"][1]["Sequence"]["id"] = "B"; },
       "post_processor.processors[1].single[1]"},
      {[&](nlohmann::json& j) { j["post_processor"]["processors"][1]["special_tokens"] = nlohmann::json::object(); },
       "special_tokens has no ids for \"<|begin_of_text|>\""},
      {[&](nlohmann::json& j) { j["post_processor"]["processors"][1]["special_tokens"]["<|begin_of_text|>"]["ids"] = {70000}; },
       "special_tokens \"<|begin_of_text|>\" has id 70000"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = LlamaStyleTokenizer();
    c.edit(j);
    SCOPED_TRACE(c.words);
    auto t = BpeTokenizer::Parse("tok.json", j.dump());
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find(c.words), std::string::npos) << t.status().message();
    EXPECT_EQ(t.status().message().rfind("tok.json: ", 0), 0u) << t.status().message();
    EXPECT_EQ(t.status().message().find('\n'), std::string::npos) << t.status().message();
  }
}

// Fields of the wrong JSON type anywhere in a tokenizer.json: one line naming the field.
TEST(BpeTokenizer, WrongJsonTypesAreRefusedNamingTheField) {
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string words;
  };
  const std::vector<Case> cases = {
      {[](nlohmann::json& j) { j["added_tokens"][0]["normalized"] = "yes"; }, "added_tokens[0] \"<|endoftext|>\" normalized is \"yes\" (expected true or false)"},
      {[](nlohmann::json& j) { j["added_tokens"][0]["special"] = nullptr; }, "special is null (expected true or false)"},
      {[](nlohmann::json& j) { j["added_tokens"][0]["id"] = "261"; }, "added_tokens[0].id is \"261\""},
      {[](nlohmann::json& j) { j["added_tokens"][0]["content"] = 5; }, "added_tokens[0].content is 5"},
      {[](nlohmann::json& j) { j["added_tokens"][0] = nlohmann::json::array(); }, "added_tokens[0] is an array of 0"},
      {[](nlohmann::json& j) { j["added_tokens"] = "x"; }, "added_tokens is not an array"},
      {[](nlohmann::json& j) { j["model"]["vocab"]["h"] = 1.5; }, "vocab entry \"h\" has id 1.5"},
      {[](nlohmann::json& j) { j["model"]["merges"][0] = 1; }, "merge 0 is 1"},
      {[](nlohmann::json& j) { j["model"]["merges"] = nullptr; }, "model.merges is not an array"},
      {[](nlohmann::json& j) { j["model"]["dropout"] = "0.1"; }, "model.dropout \"0.1\""},
      {[](nlohmann::json& j) { j["model"]["byte_fallback"] = nullptr; }, "model.byte_fallback is null"},
      {[](nlohmann::json& j) { j["pre_tokenizer"]["use_regex"] = 1; }, "pre_tokenizer.use_regex is 1"},
      {[](nlohmann::json& j) { j["pre_tokenizer"] = "ByteLevel"; }, "pre_tokenizer"},
      {[](nlohmann::json& j) { j["post_processor"] = 3; }, "post_processor 3"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = TinyTokenizer();
    c.edit(j);
    SCOPED_TRACE(c.words);
    auto t = BpeTokenizer::Parse("tok.json", j.dump());
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find(c.words), std::string::npos) << t.status().message();
    EXPECT_EQ(t.status().message().rfind("tok.json: ", 0), 0u) << t.status().message();
    EXPECT_EQ(t.status().message().find('\n'), std::string::npos);
  }
  // a value nested a million deep is shown by its type, not printed (recursively)
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  nlohmann::json j = TinyTokenizer();
  std::string text = j.dump();
  text.insert(text.find("\"model\":{") + 9, "\"byte_fallback\":" + deep + ",");
  auto t = BpeTokenizer::Parse("tok.json", text);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("model.byte_fallback is an array of 1"), std::string::npos) << t.status().message();
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
  // fields of the wrong JSON type: one line naming the tensor and the field
  for (const auto& [json, words] : std::vector<std::pair<std::string, std::string>>{
           {R"({"a":{"dtype":5,"shape":[2],"data_offsets":[0,8]}})", "tensor \"a\": dtype is not a string"},
           {R"({"a":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", "tensor \"a\": shape is not an array"},
           {R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", "tensor \"a\": shape [2.0]"},
           {R"({"a":{"dtype":"F32","shape":[null],"data_offsets":[0,8]}})", "tensor \"a\": shape [null]"},
           {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":null}})", "tensor \"a\": data_offsets null"},
           {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,"8"]}})", "tensor \"a\": data_offsets [0,\"8\"]"},
           {R"({"a":[1]})", "tensor \"a\": expected an object"},
           {R"({"__metadata__":{"format":1}})", "__metadata__ value of \"format\" is not a string"}}) {
    const std::string m = parse(json, 8).status().message();
    EXPECT_NE(m.find("f: " + words), std::string::npos) << m;
  }
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

// config.json: each option that changes the computation at another value, and each field of
// another JSON type, is refused with one line naming the file and the field.
TEST(HfGpt2, ConfigOptionsAndTypesAreRefusedByName) {
  const nlohmann::json good = {{"model_type", "gpt2"}, {"n_layer", 2}, {"n_head", 2}, {"n_embd", 16},
                               {"n_positions", 8}, {"vocab_size", 300}, {"n_inner", nullptr},
                               {"activation_function", "gelu_new"}, {"layer_norm_epsilon", 1e-5},
                               {"scale_attn_weights", true}, {"tie_word_embeddings", true}, {"resid_pdrop", 0.1}};
  auto parsed = ParseHfGpt2Config("d/config.json", good.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed.value().FirstDifference(GPTConfig{2, 2, 16, 8, 300}), "");
  const std::vector<std::pair<nlohmann::json, std::string>> cases = {
      {{{"scale_attn_weights", false}}, "scale_attn_weights false is not supported"},
      {{{"reorder_and_upcast_attn", true}}, "reorder_and_upcast_attn true is not supported"},
      {{{"add_cross_attention", true}}, "add_cross_attention true is not supported"},
      {{{"scale_attn_by_inverse_layer_idx", true}}, "scale_attn_by_inverse_layer_idx true is not supported"},
      {{{"tie_word_embeddings", false}}, "tie_word_embeddings false is not supported"},
      {{{"is_encoder_decoder", true}}, "is_encoder_decoder true is not supported"},
      {{{"pruned_heads", {{"0", {1}}}}}, "pruned_heads an object of 1 is not supported"},
      {{{"activation_function", "gelu"}}, "activation_function \"gelu\" is not supported"},
      {{{"layer_norm_epsilon", 1e-6}}, "layer_norm_epsilon 1e-06 is not supported"},
      {{{"n_inner", 32}}, "n_inner 32 is not supported (expected null or 4 x n_embd = 64)"},
      // wrong JSON types
      {{{"tie_word_embeddings", "yes"}}, "tie_word_embeddings is \"yes\" (expected true)"},
      {{{"activation_function", nullptr}}, "activation_function null is not supported"},
      {{{"activation_function", 1}}, "activation_function 1 is not supported"},
      {{{"scale_attn_by_inverse_layer_idx", nullptr}}, "scale_attn_by_inverse_layer_idx is null (expected false)"},
      {{{"scale_attn_weights", 1}}, "scale_attn_weights is 1 (expected true)"},
      {{{"reorder_and_upcast_attn", "false"}}, "reorder_and_upcast_attn is \"false\" (expected false)"},
      {{{"layer_norm_epsilon", "1e-5"}}, "layer_norm_epsilon \"1e-5\" is not supported"},
      {{{"n_inner", "64"}}, "n_inner \"64\" is not supported"},
      {{{"n_embd", 16.0}}, "n_embd is 16.0 (expected a positive integer)"},
      {{{"n_layer", nullptr}}, "n_layer is null (expected a positive integer)"},
      {{{"vocab_size", {300}}}, "vocab_size is an array of 1 (expected a positive integer)"},
      {{{"model_type", 2}}, "model_type is 2 (expected \"gpt2\")"},
      {{{"resid_pdrop", "0.1"}}, "resid_pdrop is \"0.1\" (expected a probability in [0, 1))"},
      {{{"pruned_heads", 0}}, "pruned_heads 0 is not supported"},
  };
  for (const auto& [edit, words] : cases) {
    nlohmann::json j = good;
    j.update(edit);
    SCOPED_TRACE(j.dump());
    auto r = ParseHfGpt2Config("d/config.json", j.dump());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("d/config.json: " + words), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
  }
  nlohmann::json j = good;
  j.erase("n_head");
  EXPECT_NE(ParseHfGpt2Config("d/config.json", j.dump()).status().message().find("missing \"n_head\""), std::string::npos);
  EXPECT_NE(ParseHfGpt2Config("d/config.json", "[1]").status().message().find("not a JSON object"), std::string::npos);
  // a value nested a million deep is named by its type, not printed (recursively)
  j = good;
  j.erase("tie_word_embeddings");
  std::string deep = j.dump();
  deep.insert(1, "\"tie_word_embeddings\": " + std::string(1000000, '[') + std::string(1000000, ']') + ", ");
  EXPECT_NE(ParseHfGpt2Config("d/config.json", deep).status().message().find("tie_word_embeddings is an array of 1"),
            std::string::npos);
}

// A stored lm_head.weight equal to wte (a tied head saved anyway) is read; one that differs (an
// untied head, which shardgpt has no place for) is refused naming the tensor.
TEST(HfGpt2, AnUntiedLmHeadIsRefusedByName) {
  const GPTConfig c{1, 2, 16, 8, 300};
  const ParamLayout layout(c);
  std::vector<float> p(layout.total_numel());
  InitParameters(layout, 5, p.data());
  const std::string dir = testing::TempDir() + "/hfhead_" + std::to_string(::getpid());
  ASSERT_TRUE(WriteHfGpt2(dir, layout, p.data(), false).ok());
  std::vector<SafetensorsTensor> tensors;
  {
    auto st = SafetensorsReader::Open(dir + "/model.safetensors");
    ASSERT_TRUE(st.ok());
    for (const SafetensorsEntry& e : st.value()->entries()) {
      SafetensorsTensor t{e.name, e.shape, std::vector<float>(e.numel())};
      ASSERT_TRUE(st.value()->ReadFloats(e, 0, e.numel(), t.values.data()).ok());
      tensors.push_back(std::move(t));
    }
  }
  const SafetensorsTensor* wte = nullptr;
  for (const SafetensorsTensor& t : tensors)
    if (t.name == "transformer.wte.weight") wte = &t;
  ASSERT_NE(wte, nullptr);
  SafetensorsTensor head{"lm_head.weight", wte->shape, wte->values};
  tensors.push_back(head);
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors, false, {{"format", "pt"}}).ok());
  auto tied = HfGpt2Reader::Open(dir);
  EXPECT_TRUE(tied.ok()) << tied.status().message();
  tensors.back().values[1234] += 0.5f;
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors, false, {{"format", "pt"}}).ok());
  auto untied = HfGpt2Reader::Open(dir);
  ASSERT_FALSE(untied.ok());
  EXPECT_NE(untied.status().message().find("tensor \"lm_head.weight\" differs from \"transformer.wte.weight\" at element 1234"),
            std::string::npos)
      << untied.status().message();
  tensors.back().shape = {c.n_embd, c.vocab_size};
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors, false, {{"format", "pt"}}).ok());
  auto shaped = HfGpt2Reader::Open(dir);
  ASSERT_FALSE(shaped.ok());
  EXPECT_NE(shaped.status().message().find("tensor \"lm_head.weight\" has shape [16, 300]"), std::string::npos)
      << shaped.status().message();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardgpt
