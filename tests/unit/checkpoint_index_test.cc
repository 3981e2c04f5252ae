// The checkpoint index (ckpt/checkpoint_index.h) in one process: a round trip; every single
// flipped byte of the file refused by its checksum; a version 1 index refused by name; and
// each inconsistent field refused naming the field (written through the real writer, which
// stores whatever it is given, so each case is a crafted but well-formed, checksummed file).
// Also crafted JSON (wrong types, wrap-around numbers) with a valid checksum.
// Also the `latest` pointer of a checkpoint directory, which must name a step directory.
#include "ckpt/checkpoint_index.h"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "io_test_util.h"
#include "../fuzz/json_mutate.h"

namespace shardgpt {
namespace {

using testutil::ReadFile;
using testutil::TestDir;
using testutil::WriteFile;

const GPTConfig kConfig{2, 2, 8, 4, 130};

CheckpointIndex GoodIndex(int world = 3, const GPTConfig& config = kConfig) {
  const ParamLayout layout(config);
  CheckpointIndex idx;
  idx.format_version = kCheckpointFormatVersion;
  idx.checkpoint_id = 0xabcdef0123456789ull;
  idx.config = config;
  idx.tensors = layout.tensors();
  idx.units = layout.units();
  idx.world_size = world;
  idx.zero_stage = 2;
  idx.dtype = "bf16";
  idx.state = TrainState{12, 12 * 256, 48, 1337};
  idx.state.batch_samples = 4, idx.state.seq_len = 16, idx.state.shuffle = 1;
  idx.state.data_files = {{"d/a.bin", 100}, {"d/b.bin", 200}};
  idx.pieces = PlanSave(layout, world);
  idx.chunks = ChunksFromPieces(layout, idx.pieces);
  const std::vector<uint64_t> elems = FileElements(idx.pieces, world);
  for (int r = 0; r < world; r++) {
    // one chunk per dataset (with its 4-byte checksum), one after the other after the header
    CheckpointFile f{ShardFileName(r), elems[r], 12 * elems[r] + 2048, 1u + r, 2u + r, 3u + r, {}, {}};
    for (int k = 0; k < 3; k++) f.chunk_offsets[k] = {1024 + k * (elems[r] + 1) * 4}, f.chunk_crcs[k] = {7u + k};
    idx.files.push_back(f);
  }
  return idx;
}

// Writes idx as dir/index.h5 (replacing it) and reads it back.
StatusOr<CheckpointIndex> WriteAndRead(const std::string& dir, const CheckpointIndex& idx) {
  std::filesystem::remove(dir + "/index.h5");
  Status st = WriteCheckpointIndex(dir + "/index.h5", idx);
  if (!st.ok()) return st;
  return ReadCheckpointIndex(dir);
}

TEST(CheckpointIndex, RoundTrip) {
  const std::string dir = TestDir();
  const CheckpointIndex idx = GoodIndex();
  auto back = WriteAndRead(dir, idx);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->format_version, kCheckpointFormatVersion);
  EXPECT_EQ(back->checkpoint_id, idx.checkpoint_id);
  EXPECT_EQ(back->config.FirstDifference(kConfig), "");
  EXPECT_EQ(back->world_size, 3);
  EXPECT_EQ(back->zero_stage, 2);
  EXPECT_EQ(back->dtype, "bf16");
  EXPECT_EQ(back->state.step, 12);
  EXPECT_EQ(back->state.tokens, 12 * 256);
  EXPECT_EQ(back->state.loader_position, 48u);
  EXPECT_EQ(back->state.seed, 1337u);
  EXPECT_EQ(back->state.batch_samples, 4);
  EXPECT_EQ(back->state.seq_len, 16);
  EXPECT_EQ(back->state.shuffle, 1);
  ASSERT_EQ(back->state.data_files.size(), 2u);
  EXPECT_EQ(back->state.data_files[1].path, "d/b.bin");
  EXPECT_EQ(back->state.data_files[1].tokens, 200u);
  EXPECT_EQ(back->shard_layout, "flat");
  ASSERT_EQ(back->chunks.size(), idx.chunks.size());
  for (size_t i = 0; i < idx.chunks.size(); i++) {
    EXPECT_EQ(back->chunks[i].tensor, idx.chunks[i].tensor);
    EXPECT_EQ(back->chunks[i].file, idx.chunks[i].file);
    EXPECT_EQ(back->chunks[i].offsets, idx.chunks[i].offsets);
    EXPECT_EQ(back->chunks[i].sizes, idx.chunks[i].sizes);
    EXPECT_EQ(back->chunks[i].file_offset, idx.chunks[i].file_offset);
  }
  // the reader's pieces are the chunks in unit coordinates: together the saved pieces again
  ASSERT_EQ(back->pieces.size(), back->chunks.size());
  uint64_t covered = 0;
  for (const SavedPiece& p : back->pieces) covered += p.end - p.begin;
  EXPECT_EQ(covered, ParamLayout(kConfig).total_numel());
  EXPECT_TRUE(CheckPieces(back->pieces, [] {
                std::vector<uint64_t> n;
                const ParamLayout layout(kConfig);  // not a temporary: the loop reads its units
                for (const UnitInfo& u : layout.units()) n.push_back(u.numel);
                return n;
              }(), 3).ok());
  ASSERT_EQ(back->files.size(), 3u);
  EXPECT_EQ(back->files[2].name, "rank_00002.h5");
  EXPECT_EQ(back->files[2].bytes, idx.files[2].bytes);
  EXPECT_EQ(back->files[2].crc_v, 5u);
  // The header is readable text at the start of the file, and HDF5 still opens the file.
  const std::string bytes = ReadFile(dir + "/index.h5");
  EXPECT_EQ(bytes.rfind("shardgpt checkpoint index\nformat 3\ncrc32c ", 0), 0u);
  hid_t f = H5Fopen((dir + "/index.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(f, 0);
  if (f >= 0) H5Fclose(f);
}

TEST(CheckpointIndex, EveryFlippedByteIsRefused) {
  const std::string dir = TestDir();
  ASSERT_TRUE(WriteCheckpointIndex(dir + "/index.h5", GoodIndex()).ok());
  const std::string good = ReadFile(dir + "/index.h5");
  ASSERT_TRUE(ParseCheckpointIndex(good, "index.h5", dir).ok());
  size_t refused = 0;
  for (size_t i = 0; i < good.size(); i++) {
    for (unsigned char mask : {0x01, 0x80}) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ mask);
      auto r = ParseCheckpointIndex(bad, "x/index.h5", dir);
      if (r.ok()) {
        ADD_FAILURE() << "byte " << i << " ^ " << int(mask) << " accepted";
        continue;
      }
      EXPECT_EQ(r.status().message().rfind("x/index.h5: ", 0), 0u) << r.status().message();
      refused++;
    }
  }
  EXPECT_EQ(refused, 2 * good.size());
  std::printf("%zu flips of %zu bytes: all refused\n", refused, good.size());
  // Truncated or extended: refused too.
  EXPECT_FALSE(ParseCheckpointIndex(good.substr(0, good.size() - 1), "index.h5", dir).ok());
  EXPECT_FALSE(ParseCheckpointIndex(good + "x", "index.h5", dir).ok());
  auto damaged = ParseCheckpointIndex(good.substr(0, 600) + "!" + good.substr(601), "index.h5", dir);
  ASSERT_FALSE(damaged.ok());
  EXPECT_NE(damaged.status().message().find("checksum mismatch"), std::string::npos) << damaged.status().message();
}

TEST(CheckpointIndex, Version1IsRefusedByName) {
  const std::string dir = TestDir();
  // A version 1 index is a plain HDF5 file (no user block).
  hid_t f = H5Fcreate((dir + "/index.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  H5Fclose(f);
  auto r = ReadCheckpointIndex(dir);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("format version 1 (no checksum) is not read by this build"), std::string::npos)
      << r.status().message();
  WriteFile(dir + "/index.h5", std::string(600, 'x'));
  r = ReadCheckpointIndex(dir);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not a shardgpt checkpoint index"), std::string::npos) << r.status().message();
}

// Each crafted index is refused with a message naming the field.
TEST(CheckpointIndex, InconsistentFieldsAreRefusedByName) {
  const std::string dir = TestDir();
  struct Case {
    const char* words;
    std::function<void(CheckpointIndex&)> edit;
  };
  const uint64_t minus_one = ~uint64_t{0};  // written as int64 -1
  const std::vector<Case> cases = {
      {"step -1 (expected 0 to 2^31-1)", [](CheckpointIndex& i) { i.state.step = -1; }},
      {"step 2147483648", [](CheckpointIndex& i) { i.state.step = int64_t{1} << 31; }},
      {"tokens -5", [](CheckpointIndex& i) { i.state.tokens = -5; }},
      {"world_size 0", [](CheckpointIndex& i) { i.world_size = 0; }},
      {"zero_stage 4", [](CheckpointIndex& i) { i.zero_stage = 4; }},
      {"dtype 'f16'", [](CheckpointIndex& i) { i.dtype = "f16"; }},
      {"checkpoint_id 0", [](CheckpointIndex& i) { i.checkpoint_id = 0; }},
      {"/config n_embd 7 (expected a multiple of n_head 2)", [](CheckpointIndex& i) { i.config.n_embd = 7; }},
      {"/config vocab_size 2000001", [](CheckpointIndex& i) { i.config.vocab_size = 2000001; }},
      {"/layout has 28 tensors in 4 units, /config n_layer 100000000 implies 1200000004 in 100000002",
       [](CheckpointIndex& i) { i.config.n_layer = 100000000; }},
      {"describes more than 2^50 parameters", [](CheckpointIndex& i) { i.config.n_embd = 1 << 30; }},
      {"/layout/tensors[3] offset", [](CheckpointIndex& i) { i.tensors[3].offset += 1; }},
      {"/layout/tensors[5] name 'h.0.evil'", [](CheckpointIndex& i) { i.tensors[5].name = "h.0.evil"; }},
      {"/layout/tensors[0] shape", [](CheckpointIndex& i) { i.tensors[0].shape[0] = -256; }},
      {"/layout/tensors[2] numel -1 (expected >= 0)", [&](CheckpointIndex& i) { i.tensors[2].numel = minus_one; }},
      {"/layout/units[1] 'h.0' offset", [](CheckpointIndex& i) { i.units[1].offset += 8; }},
      {"/plan/chunks[0] offsets -1 (expected >= 0)", [&](CheckpointIndex& i) { i.chunks[0].offsets[0] = minus_one; }},
      {"/plan/chunks: unit 0: elements", [](CheckpointIndex& i) { i.chunks.push_back(i.chunks[0]); }},  // twice
      {"/plan/chunks: unit", [](CheckpointIndex& i) { i.chunks.pop_back(); }},                          // missing
      {"/plan/chunks[0] 'wte.weight': file 5 (expected 0 to 2)", [](CheckpointIndex& i) { i.chunks[0].file = 5; }},
      {"/plan/chunks[1] tensor 99 (expected 0 to 27)", [](CheckpointIndex& i) { i.chunks[1].tensor = 99; }},
      {"/plan/chunks[0] 'wte.weight': dimension 0 offset 0 size 1000 (expected a nonempty range inside 0..256)",
       [](CheckpointIndex& i) { i.chunks[0].sizes[0] = 1000; }},
      {"/plan/chunks[0] 'wte.weight': 1 offsets and 2 sizes for a 2-D tensor",
       [](CheckpointIndex& i) { i.chunks[0].offsets.pop_back(); }},
      {"/plan/chunks[0] 'wte.weight': the chunk is not contiguous", [](CheckpointIndex& i) {
         i.chunks[0].offsets = {0, 1};  // rows 0.. from column 1: a strided box
         i.chunks[0].sizes = {2, 7};
       }},
      {"/plan/chunks: file 0: piece of unit", [](CheckpointIndex& i) { i.chunks[0].file_offset += 1; }},
      {"shard_layout 'diagonal' (expected flat or per-param)", [](CheckpointIndex& i) { i.shard_layout = "diagonal"; }},
      {"/plan/files has 2 records for world_size 3", [](CheckpointIndex& i) { i.files.pop_back(); }},
      {"/plan/files[1] name '../rank_00001.h5' (expected rank_00001.h5)",
       [](CheckpointIndex& i) { i.files[1].name = "../rank_00001.h5"; }},
      {"/plan/files[0] rank_00000.h5: elements", [](CheckpointIndex& i) { i.files[0].elements += 1; }},
      {"/plan/files[2] rank_00002.h5: bytes 100, too small", [](CheckpointIndex& i) { i.files[2].bytes = 100; }},
      {"/plan/files[0] bytes -1 (expected >= 0)", [&](CheckpointIndex& i) { i.files[0].bytes = minus_one; }},
      {"/plan/files[1] rank_00001.h5: 0 chunk offsets and 1 chunk CRCs for /m, expected 1",
       [](CheckpointIndex& i) { i.files[1].chunk_offsets[1].clear(); }},
      {"/plan/files[0] rank_00000.h5: chunk of /v at byte", [](CheckpointIndex& i) {
         i.files[0].chunk_offsets[2][0] = i.files[0].bytes - 8;  // runs past the end of the file
       }},
      {"/plan/files[0] rank_00000.h5: chunk of /master at byte 100", [](CheckpointIndex& i) {
         i.files[0].chunk_offsets[0][0] = 100;  // inside the header
       }},
      {"overlap", [](CheckpointIndex& i) { i.files[2].chunk_offsets[1][0] = i.files[2].chunk_offsets[0][0] + 4; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.words);
    CheckpointIndex idx = GoodIndex();
    c.edit(idx);
    auto r = WriteAndRead(dir, idx);
    ASSERT_FALSE(r.ok());
    const std::string& msg = r.status().message();
    EXPECT_EQ(msg.rfind(dir + "/index.h5: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.words), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_TRUE(WriteAndRead(dir, GoodIndex()).ok());
}

// Crafted JSON with a recomputed checksum: types are exact, nothing wraps around.
TEST(CheckpointIndex, CraftedJsonIsRefusedByName) {
  const std::string dir = TestDir();
  ASSERT_TRUE(WriteCheckpointIndex(dir + "/index.h5", GoodIndex()).ok());
  const std::string good = ReadFile(dir + "/index.h5");
  struct Case {
    std::string from, to, words;
  };
  const std::vector<Case> cases = {
      {"\"step\":12", "\"step\":12.5", "step missing or not an integer"},
      {"\"step\":12", "\"step\":-12", "step -12 (expected 0 to 2^31-1)"},
      {"\"tokens\":3072", "\"tokens\":9223372036854775808", "tokens missing or not an integer"},
      {"\"seed\":1337", "\"seed\":-1", "seed missing or not an unsigned integer"},
      {"\"world_size\":3", "\"world_size\":\"3\"", "world_size missing or not an integer"},
      {"\"n_layer\":2", "\"n_layer\":4294967298", "/config n_layer 4294967298 (expected 1 to 2^31-1)"},
      {"\"format\":\"shardgpt-checkpoint\"", "\"format\":\"something-else\"", "not a shardgpt checkpoint index"},
      {"{\"checkpoint_id\"", "[{\"checkpoint_id\"", "JSON content does not parse"},
      {"\"shuffle\":1", "\"shuffle\":2", "/run shuffle missing or not 0 or 1"},
      {"\"seq_len\":16", "\"seq_len\":0", "/run seq_len missing or not an integer in [1, 2^31-1]"},
      {"[\"d/a.bin\",100]", "[\"d/a.bin\",-100]", "/run data_files missing or not [path, tokens] pairs"},
  };
  const size_t json_at = good.find("\njson ") + 6;
  const uint64_t json_bytes = std::stoull(good.substr(json_at, good.find('\n', json_at) - json_at));
  const std::string json = good.substr(kIndexHeaderBytes, json_bytes);
  const std::string rest = good.substr(kIndexHeaderBytes + json_bytes);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.to);
    std::string edited = json;
    const size_t at = edited.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    edited.replace(at, c.from.size(), c.to);
    // a header stating the new JSON length; sealing fills in the rest (size, checksum)
    std::string bad = "shardgpt checkpoint index\nformat 3\njson " + std::to_string(edited.size()) + "\n";
    bad.resize(kIndexHeaderBytes, '\0');
    bad += edited + rest;
    SealCheckpointIndexImage(&bad);
    auto r = ParseCheckpointIndex(bad, "x/index.h5", dir);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(c.words), std::string::npos) << r.status().message();
  }
  // and the unedited JSON, so framed and sealed, is accepted
  std::string same = "shardgpt checkpoint index\nformat 3\njson " + std::to_string(json.size()) + "\n";
  same.resize(kIndexHeaderBytes, '\0');
  same += json + rest;
  SealCheckpointIndexImage(&same);
  EXPECT_TRUE(ParseCheckpointIndex(same, "x/index.h5", dir).ok());
}

// Every value of the index's JSON (the first entries of each array and object) replaced by one
// of each other JSON type, sealed with a valid checksum as a crafted file would be: never a
// thrown type_error; each refusal is one line naming the file; nearly every change is refused
// (a few fields are free-form, e.g. the optimizer's name).
TEST(CheckpointIndex, EveryFieldOfAnotherJsonTypeIsOneLine) {
  const std::string dir = TestDir();
  ASSERT_TRUE(WriteCheckpointIndex(dir + "/index.h5", GoodIndex(2)).ok());
  const std::string good = ReadFile(dir + "/index.h5");
  const size_t json_at = good.find("\njson ") + 6;
  const uint64_t json_bytes = std::stoull(good.substr(json_at, good.find('\n', json_at) - json_at));
  const nlohmann::json doc = nlohmann::json::parse(good.substr(kIndexHeaderBytes, json_bytes));
  const std::string rest = good.substr(kIndexHeaderBytes + json_bytes);
  size_t refused = 0, cases = 0;
  for (const std::string& edited : fuzz::JsonTypeVariants(doc, 16, 400)) {
    std::string bad = "shardgpt checkpoint index\nformat 3\njson " + std::to_string(edited.size()) + "\n";
    bad.resize(kIndexHeaderBytes, '\0');
    bad += edited + rest;
    SealCheckpointIndexImage(&bad);
    cases++;
    StatusOr<CheckpointIndex> r = Status::Internal("not run");
    ASSERT_NO_THROW(r = ParseCheckpointIndex(bad, "x/index.h5", dir)) << edited.substr(0, 200);
    if (r.ok()) continue;
    refused++;
    const std::string& m = r.status().message();
    EXPECT_EQ(m.rfind("x/index.h5: ", 0), 0u) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  EXPECT_GT(cases, 150u) << cases;
  EXPECT_GT(refused, cases * 9 / 10) << refused << " of " << cases;
}

// Format 2 (the plan as pieces of units) is still read: its pieces become per-parameter
// chunks; a format this build does not know is refused naming the format.
TEST(CheckpointIndex, Format2IsReadAndOtherFormatsAreRefusedByName) {
  const std::string dir = TestDir();
  const CheckpointIndex idx = GoodIndex();
  ASSERT_TRUE(WriteCheckpointIndex(dir + "/index.h5", idx).ok());
  const std::string good = ReadFile(dir + "/index.h5");
  const size_t json_at = good.find("\njson ") + 6;
  const uint64_t json_bytes = std::stoull(good.substr(json_at, good.find('\n', json_at) - json_at));
  nlohmann::json j = nlohmann::json::parse(good.substr(kIndexHeaderBytes, json_bytes));
  const std::string rest = good.substr(kIndexHeaderBytes + json_bytes);
  auto frame = [&](int version, const std::string& text) {
    std::string img = "shardgpt checkpoint index\nformat " + std::to_string(version) + "\njson " +
                      std::to_string(text.size()) + "\n";
    img.resize(kIndexHeaderBytes, '\0');
    img += text + rest;
    SealCheckpointIndexImage(&img);
    return img;
  };
  // the format 2 form of the same index, as format 2 writers wrote it
  nlohmann::json v2 = j;
  v2["format_version"] = 2;
  v2.erase("shard_layout");
  nlohmann::json pieces = nlohmann::json::array();
  for (const SavedPiece& p : idx.pieces) pieces.push_back({p.unit, p.file, p.begin, p.end, p.file_offset});
  v2["plan"].erase("chunks");
  v2["plan"]["pieces"] = pieces;
  auto r = ParseCheckpointIndex(frame(2, v2.dump()), "x/index.h5", dir);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->format_version, 2);
  EXPECT_EQ(r->shard_layout, "flat");
  ASSERT_EQ(r->chunks.size(), idx.chunks.size());
  for (size_t i = 0; i < idx.chunks.size(); i++) {
    EXPECT_EQ(r->chunks[i].tensor, idx.chunks[i].tensor);
    EXPECT_EQ(r->chunks[i].offsets, idx.chunks[i].offsets);
    EXPECT_EQ(r->chunks[i].sizes, idx.chunks[i].sizes);
    EXPECT_EQ(r->chunks[i].file_offset, idx.chunks[i].file_offset);
  }
  // a format 2 header over format 3 content, and the reverse: refused naming the field
  r = ParseCheckpointIndex(frame(2, j.dump()), "x/index.h5", dir);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("format_version 3 differs from the header's format 2"), std::string::npos)
      << r.status().message();
  r = ParseCheckpointIndex(frame(3, v2.dump()), "x/index.h5", dir);
  ASSERT_FALSE(r.ok());
  // (the version is checked before the checksum, which Seal would compute for format 3)
  std::string v4 = "shardgpt checkpoint index\nformat 4\njson 2\n";
  v4.resize(kIndexHeaderBytes, '\0');
  r = ParseCheckpointIndex(v4 + "{}", "x/index.h5", dir);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("format version 4, this build reads versions 2 to 3"), std::string::npos)
      << r.status().message();
}

// A llama model's fields survive the index; a gpt2 index carries no arch field (as before llama).
TEST(CheckpointIndex, LlamaConfigRoundTrips) {
  const std::string dir = TestDir();
  GPTConfig llama{2, 4, 16, 8, 130};
  llama.arch = Arch::kLlama, llama.n_kv_head = 2, llama.ffn_hidden = 24, llama.rope_theta = 500000.0f;
  llama.norm_eps = 1e-6f, llama.tie_embeddings = false;
  for (bool tied : {false, true}) {
    llama.tie_embeddings = tied;
    auto back = WriteAndRead(dir, GoodIndex(2, llama));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->config.FirstDifference(llama), "") << tied;
    EXPECT_TRUE(back->config.llama());
    EXPECT_EQ(back->tensors.size(), ParamLayout(llama).tensors().size());
  }
  EXPECT_NE(ReadFile(dir + "/index.h5").find("\"arch\":\"llama\""), std::string::npos);
  ASSERT_TRUE(WriteAndRead(dir, GoodIndex()).ok());
  EXPECT_EQ(ReadFile(dir + "/index.h5").find("\"arch\""), std::string::npos);
}

// A `latest` that cannot be written names the errno (here /dev/full: no space left).
TEST(CheckpointIndex, LatestWriteFailureNamesTheErrno) {
  namespace fs = std::filesystem;
  const std::string dir = TestDir() + "/full";
  fs::create_directories(dir);
  fs::create_symlink("/dev/full", dir + "/.latest.tmp");
  const Status st = PointLatestAt(dir, "step_00000001");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(".latest.tmp: cannot write: No space left on device"), std::string::npos) << st.message();
  EXPECT_FALSE(fs::exists(dir + "/latest"));
  fs::remove_all(dir);
}

TEST(CheckpointIndex, LatestMustNameAStepDirectory) {
  namespace fs = std::filesystem;
  const std::string dir = TestDir();
  fs::create_directories(dir + "/ck/step_00000003");
  ASSERT_TRUE(WriteCheckpointIndex(dir + "/ck/step_00000003/index.h5", GoodIndex()).ok());
  fs::create_directories(dir + "/elsewhere");
  ASSERT_TRUE(WriteCheckpointIndex(dir + "/elsewhere/index.h5", GoodIndex()).ok());
  WriteFile(dir + "/ck/latest", "step_00000003\n");
  auto ok = ResolveCheckpoint("latest", dir + "/ck");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok.value(), dir + "/ck/step_00000003");
  for (const std::string& name : std::vector<std::string>{"../elsewhere", dir + "/elsewhere", "step_3", "step_00000003/.."}) {
    WriteFile(dir + "/ck/latest", name + "\n");
    auto r = ResolveCheckpoint("latest", dir + "/ck");
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_NE(r.status().message().find("expected a step_XXXXXXXX directory name"), std::string::npos)
        << r.status().message();
  }
}

}  // namespace
}  // namespace shardgpt
