// prepare's inputs (io/text_input.h, io/prepare.h): JSON Lines and gzip'd files give the same
// shards as the equivalent text files, a vocabulary above 65,536 ids gives uint32 shards whose
// ids reach the data loader whole, and each malformed input is one error line naming file:line
// with nothing left in the output directory; without <|endoftext|> each document starts with the
// tokenizer template's prefix.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/bpe_tokenizer.h"
#include "io/data_loader.h"
#include "io/prepare.h"
#include "io/text_input.h"
#include "io/token_shard.h"
#include "tests/unit/io_test_util.h"

namespace shardgpt {
namespace {

using testutil::ReadFile;
using testutil::TestDir;
using testutil::WriteFile;
namespace fs = std::filesystem;

using testutil::ByteSymbol;

// What the tokenizer's added token at eot_id is: <|endoftext|>; <|begin_of_text|> with a
// TemplateProcessing that puts it before a text (Llama 3); <|begin_of_text|> without a template.
enum class Special { kEndOfText, kBeginTemplate, kBeginNoTemplate };

// byte b has id b; the merges (h e) (l l) (he ll) get ids merge_base.. merge_base+2;
// the added token (<|endoftext|> by default) is eot_id.
std::shared_ptr<const BpeTokenizer> Tokenizer(int merge_base, int eot_id, Special special = Special::kEndOfText) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; b++) vocab[ByteSymbol(b)] = b;
  nlohmann::json m = nlohmann::json::array();
  int id = merge_base;
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{{"h", "e"}, {"l", "l"}, {"he", "ll"}})
    vocab[a + b] = id++, m.push_back(a + " " + b);
  // ids are dense: the gaps hold entries no merge reaches
  for (int u = 256; u < eot_id; u++)
    if (u < merge_base || u >= merge_base + 3) vocab["<unused" + std::to_string(u) + ">"] = u;
  const std::string name = special == Special::kEndOfText ? "<|endoftext|>" : "<|begin_of_text|>";
  nlohmann::json j = {{"added_tokens", {{{"id", eot_id}, {"content", name}, {"special", true}}}},
                      {"normalizer", nullptr},
                      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                      {"decoder", {{"type", "ByteLevel"}}},
                      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
  if (special == Special::kBeginTemplate)
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", {{{"SpecialToken", {{"id", name}, {"type_id", 0}}}},
                                       {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                           {"pair", {{{"SpecialToken", {{"id", name}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
                           {"special_tokens", {{name, {{"id", name}, {"ids", {eot_id}}, {"tokens", {name}}}}}}};
  auto t = BpeTokenizer::Parse("tok.json", j.dump());
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.value();
}

void WriteGzip(const std::string& path, const std::string& bytes) {
  gzFile gz = gzopen(path.c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(gz), Z_OK);
}

// Documents, as text files doc<i>.txt and as the records of one JSONL file (with a blank line
// and CRLF line ends in it, both allowed), plain and gzip'd.
const std::vector<std::string> kDocs = {"hello world\nhello again\n", "caf\xC3\xA9 \"quoted\" \\ tab\there",
                                        "one\n\ntwo\n", "hell"};

struct Inputs {
  std::vector<std::string> texts;
  std::string jsonl, jsonl_gz, json_gz, text_gz;
};

Inputs WriteInputs(const std::string& dir, const std::string& field = "text") {
  Inputs in;
  std::string jsonl;
  for (size_t i = 0; i < kDocs.size(); i++) {
    in.texts.push_back(dir + "/doc" + std::to_string(i) + ".txt");
    WriteFile(in.texts.back(), kDocs[i]);
    jsonl += nlohmann::json{{"id", i}, {field, kDocs[i]}}.dump() + (i == 1 ? "\r\n\n" : "\n");
  }
  in.jsonl = dir + "/docs.jsonl";
  WriteFile(in.jsonl, jsonl.substr(0, jsonl.size() - 1));  // the last line without its '\n'
  in.jsonl_gz = dir + "/docs.jsonl.gz";
  WriteGzip(in.jsonl_gz, jsonl);
  in.json_gz = dir + "/docs.json.gz";
  WriteGzip(in.json_gz, jsonl);
  in.text_gz = dir + "/doc0.txt.gz";
  WriteGzip(in.text_gz, kDocs[0]);
  return in;
}

// train.bin and val.bin of `out`, byte for byte.
std::string Shards(const std::string& out) { return ReadFile(out + "/train.bin") + "|" + ReadFile(out + "/val.bin"); }

TEST(PrepareInput, JsonlAndGzipGiveTheSameByteLevelShardsAsText) {
  const std::string dir = TestDir();
  const Inputs in = WriteInputs(dir);
  ASSERT_TRUE(PrepareByteLevel(in.texts, dir + "/text", 0.2).ok());
  const std::string want = Shards(dir + "/text");
  for (const std::string& f : {in.jsonl, in.jsonl_gz, in.json_gz}) {
    Status s = PrepareByteLevel({f}, dir + "/j", 0.2);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(Shards(dir + "/j"), want) << f;
  }
  // a gzip'd text file, and gzip known by its magic whatever the name
  const std::string renamed = dir + "/doc0.data";
  fs::copy_file(in.text_gz, renamed);
  ASSERT_TRUE(PrepareByteLevel({in.texts[0]}, dir + "/t0", 0.2).ok());
  for (const std::string& f : {in.text_gz, renamed}) {
    ASSERT_TRUE(PrepareByteLevel({f}, dir + "/g", 0.2).ok()) << f;
    EXPECT_EQ(Shards(dir + "/g"), Shards(dir + "/t0")) << f;
  }
}

TEST(PrepareInput, JsonlAndGzipGiveTheSameBpeShardsAsText) {
  const std::string dir = TestDir();
  const Inputs in = WriteInputs(dir, "content");
  auto tok = Tokenizer(256, 259);
  BpePrepareOptions o;
  o.val_fraction = 0.1;
  o.threads = 2;
  o.text_field = "content";
  PrepareStats stats;
  ASSERT_TRUE(PrepareBpe(*tok, in.texts, dir + "/text", o, &stats).ok());
  EXPECT_EQ(stats.token_bytes, 2);
  const std::string want = Shards(dir + "/text");
  for (const std::string& f : {in.jsonl, in.jsonl_gz, in.json_gz}) {
    Status s = PrepareBpe(*tok, {f}, dir + "/j", o, &stats);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(Shards(dir + "/j"), want) << f;
  }
  // every document starts with <|endoftext|>: 4 of them
  auto train = ReadTokenShard(dir + "/j/train.bin");
  auto val = ReadTokenShard(dir + "/j/val.bin");
  ASSERT_TRUE(train.ok() && val.ok());
  std::vector<uint32_t> all = train->ids;
  all.insert(all.end(), val->ids.begin(), val->ids.end());
  EXPECT_EQ(std::count(all.begin(), all.end(), 259u), 4);
  EXPECT_EQ(all[0], 259u);
}

// Without <|endoftext|>, each document starts with the template's prefix (<|begin_of_text|>);
// with neither, documents follow one another with nothing between them. The text's own ids are
// those of the <|endoftext|> tokenizer's shards, each separator dropped.
TEST(PrepareInput, DocumentsStartWithTheTemplatePrefixWithoutEndOfText) {
  const std::string dir = TestDir();
  const Inputs in = WriteInputs(dir);
  BpePrepareOptions o;
  o.val_fraction = 0;
  o.threads = 2;
  auto ids = [&](Special sp, const std::string& out) {
    auto tok = Tokenizer(256, 259, sp);
    EXPECT_EQ(tok->text_prefix(), sp == Special::kBeginTemplate ? std::vector<int32_t>{259} : std::vector<int32_t>{});
    Status s = PrepareBpe(*tok, {in.jsonl}, out, o, nullptr);
    EXPECT_TRUE(s.ok()) << s.message();
    auto t = ReadTokenShard(out + "/train.bin");
    EXPECT_TRUE(t.ok());
    return t.ok() ? t->ids : std::vector<uint32_t>{};
  };
  const std::vector<uint32_t> eot = ids(Special::kEndOfText, dir + "/eot"), bos = ids(Special::kBeginTemplate, dir + "/bos"),
                              none = ids(Special::kBeginNoTemplate, dir + "/none");
  EXPECT_EQ(bos, eot);  // the same id in the same places: before each of the 4 documents
  EXPECT_EQ(std::count(bos.begin(), bos.end(), 259u), 4);
  EXPECT_EQ(bos[0], 259u);
  std::vector<uint32_t> text = eot;
  text.erase(std::remove(text.begin(), text.end(), 259u), text.end());
  EXPECT_EQ(none, text);
}

// A vocabulary of 100,001 ids: prepare writes uint32 shards (llm.c's Llama 3 format), and
// the ids above 65535 (the merges at 70000.., the end-of-text at 100000) reach the loader.
TEST(PrepareInput, IdsAbove65535SurvivePrepareAndLoad) {
  const std::string dir = TestDir();
  WriteGzip(dir + "/docs.jsonl.gz", "{\"text\": \"hello hello hello hello\"}\n{\"text\": \"hell he\"}\n");
  auto tok = Tokenizer(70000, 100000);
  ASSERT_EQ(tok->vocab_size(), 100001);
  BpePrepareOptions o;
  o.val_fraction = 0;
  PrepareStats stats;
  Status s = PrepareBpe(*tok, {dir + "/docs.jsonl.gz"}, dir + "/out", o, &stats);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(stats.token_bytes, 4);
  const std::string raw = ReadFile(dir + "/out/train.bin");
  std::string header;
  testutil::PutLE32(&header, 20240801);
  testutil::PutLE32(&header, 7);
  testutil::PutLE32(&header, static_cast<int32_t>(stats.train_tokens));
  EXPECT_EQ(raw.substr(0, 12), header);
  EXPECT_EQ(raw.size(), 1024 + 4 * stats.train_tokens);
  // eot "hello" " " "hello" ... : hello = (he ll) 70002 then o
  const std::vector<uint32_t> want = {100000, 70002, 'o', ' ', 70002, 'o', ' ', 70002, 'o', ' ', 70002, 'o',
                                      100000, 70002, ' ', 70000};
  auto shard = ReadTokenShard(dir + "/out/train.bin");
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ(shard->ids, want);
  DataLoaderOptions lo;
  lo.pattern = dir + "/out/train.bin";
  lo.B = 1;
  lo.T = static_cast<int>(want.size()) - 1;
  lo.shuffle = false;
  lo.vocab_size = tok->vocab_size();
  auto loader = DataLoader::Open(lo);
  ASSERT_TRUE(loader.ok()) << loader.status().message();
  std::vector<int32_t> x(lo.T), y(lo.T);
  loader->NextBatch(x.data(), y.data());
  for (int t = 0; t < lo.T; t++) {
    EXPECT_EQ(x[t], static_cast<int32_t>(want[t]));
    EXPECT_EQ(y[t], static_cast<int32_t>(want[t + 1]));
  }
}

// Each bad input: one line starting with `where` and holding `what`, nothing left behind.
void ExpectPrepareError(const std::string& dir, const std::string& input, const std::string& where,
                        const std::string& what) {
  const std::string out = dir + "/out";
  for (int bpe = 0; bpe < 2; bpe++) {
    Status s;
    if (bpe) {
      BpePrepareOptions o;
      s = PrepareBpe(*Tokenizer(256, 259), {dir + "/good.txt", input}, out, o, nullptr);
    } else {
      s = PrepareByteLevel({dir + "/good.txt", input}, out);
    }
    ASSERT_FALSE(s.ok()) << input;
    EXPECT_EQ(s.message().rfind(where + ": ", 0), 0u) << s.message();
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
    EXPECT_FALSE(fs::exists(out)) << "left " << out << " behind: " << s.message();
  }
}

TEST(PrepareInput, MalformedJsonlNamesFileAndLine) {
  const std::string dir = TestDir();
  WriteFile(dir + "/good.txt", "some text\n");
  const std::string ok = "{\"text\": \"fine\"}\n";
  WriteFile(dir + "/bad_json.jsonl", ok + ok + "{\"text\": \"no end}\n" + ok);
  ExpectPrepareError(dir, dir + "/bad_json.jsonl", dir + "/bad_json.jsonl:3", "not valid JSON (expected a JSON object");
  WriteFile(dir + "/missing.jsonl", ok + "{\"txt\": \"typo\"}\n");
  ExpectPrepareError(dir, dir + "/missing.jsonl", dir + "/missing.jsonl:2", "no field \"text\"");
  WriteFile(dir + "/number.jsonl", ok + "\n" + ok + "{\"text\": 42}\n");
  ExpectPrepareError(dir, dir + "/number.jsonl", dir + "/number.jsonl:4",
                     "field \"text\" is a number (expected a string)");
  WriteFile(dir + "/array.jsonl", "[\"text\"]\n");
  ExpectPrepareError(dir, dir + "/array.jsonl", dir + "/array.jsonl:1", "an array, not an object");
  WriteFile(dir + "/blank.jsonl", "\n  \n");
  ExpectPrepareError(dir, dir + "/blank.jsonl", dir + "/blank.jsonl", "no records");

  // gzip cut short: the error names the line being read where the data ends
  std::string many;
  for (int i = 0; i < 2000; i++) many += "{\"text\": \"record " + std::to_string(i) + " " + std::string(i % 50, 'x') + "\"}\n";
  WriteGzip(dir + "/whole.jsonl.gz", many);
  const std::string gz = ReadFile(dir + "/whole.jsonl.gz");
  WriteFile(dir + "/cut.jsonl.gz", gz.substr(0, gz.size() / 2));
  // the line: one past the complete lines of what the cut file still decompresses to
  std::string part;
  {
    gzFile f = gzopen((dir + "/cut.jsonl.gz").c_str(), "rb");
    char buf[4096];
    for (int n; (n = gzread(f, buf, sizeof(buf))) > 0;) part.append(buf, n);
    gzclose(f);
  }
  ASSERT_LT(part.size(), many.size());
  const size_t line = static_cast<size_t>(std::count(part.begin(), part.end(), '\n')) + 1;
  ExpectPrepareError(dir, dir + "/cut.jsonl.gz", dir + "/cut.jsonl.gz:" + std::to_string(line),
                     "gzip data ends early");
  WriteFile(dir + "/cut.txt.gz", gz.substr(0, gz.size() / 2));
  ExpectPrepareError(dir, dir + "/cut.txt.gz", dir + "/cut.txt.gz", "gzip data ends early");
  std::string corrupt = gz;
  // the trailer's CRC-32: the check fails at the end of the stream; zlib then withholds the
  // text of that read (all of this file: it fits one read), so the error names line 1
  corrupt[gz.size() - 6] ^= 0x55;
  WriteFile(dir + "/corrupt.jsonl.gz", corrupt);
  ExpectPrepareError(dir, dir + "/corrupt.jsonl.gz", dir + "/corrupt.jsonl.gz:1", "gzip data is corrupt (incorrect data check)");
}

TEST(PrepareInput, ReaderHandsOutDocumentsInPieces) {
  const std::string dir = TestDir();
  WriteFile(dir + "/a.jsonl", "{\"text\": \"abcdefg\"}\n{\"text\": \"\"}\n{\"text\": \"xy\"}\n");
  auto r = DocumentReader::Open(dir + "/a.jsonl", "text");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.value()->is_jsonl());
  EXPECT_FALSE(r.value()->is_gzip());
  std::vector<std::string> docs, wheres;
  for (;;) {
    bool more = false;
    ASSERT_TRUE(r.value()->NextDocument(&more).ok());
    if (!more) break;
    wheres.push_back(r.value()->where());
    std::string d;
    for (bool done = false; !done;) ASSERT_TRUE(r.value()->Read(3, &d, &done).ok());
    docs.push_back(d);
  }
  EXPECT_EQ(docs, (std::vector<std::string>{"abcdefg", "", "xy"}));
  EXPECT_EQ(wheres, (std::vector<std::string>{dir + "/a.jsonl:1", dir + "/a.jsonl:2", dir + "/a.jsonl:3"}));
  EXPECT_TRUE(IsJsonLinesPath("x.jsonl"));
  EXPECT_TRUE(IsJsonLinesPath("x.jsonl.gz"));
  EXPECT_TRUE(IsJsonLinesPath("x.json.gz"));
  EXPECT_FALSE(IsJsonLinesPath("x.txt.gz"));
  EXPECT_FALSE(IsJsonLinesPath("x.json"));
}

}  // namespace
}  // namespace shardgpt
