// Writes the seed corpora of the fuzz targets: small valid files made by the project's own
// writers (and, for formats it only reads, by the format's definition), one directory per
// target under DIR. Run by CTest before the replay tests and by scripts/fuzz.sh.
//   make_seeds DIR
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/bf16.h"
#include "fuzz_util.h"
#include "ckpt/checkpoint_index.h"
#include "ckpt/checkpoint_shard.h"
#include "io/hf_gpt2.h"
#include "io/hf_llama.h"
#include "io/llmc_model.h"
#include "io/token_shard.h"
#include "json_mutate.h"

using namespace shardgpt;
namespace fs = std::filesystem;

namespace {

std::string Le32(int32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; i++) s[i] = static_cast<char>((static_cast<uint32_t>(v) >> (8 * i)) & 0xff);
  return s;
}

void Check(const Status& st) {
  if (!st.ok()) {
    std::fprintf(stderr, "make_seeds: %s\n", st.message().c_str());
    std::exit(1);
  }
}

void Write(const std::string& path, const std::string& bytes) { fuzz::WriteBytes(path, bytes.data(), bytes.size()); }

void TokenShards(const std::string& d) {
  Check(WriteTokenShard(d + "/empty.bin", {}));
  Check(WriteTokenShard(d + "/ten.bin", {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  std::vector<uint16_t> t(200);
  for (size_t i = 0; i < t.size(); i++) t[i] = static_cast<uint16_t>((i * 7919) & 0xffff);
  Check(WriteTokenShard(d + "/wide.bin", t));
}

void LlmcModels(const std::string& d) {
  for (const GPTConfig& c : {GPTConfig{1, 1, 4, 4, 2}, GPTConfig{2, 2, 4, 3, 129}}) {
    const ParamLayout layout(c);
    std::vector<float> p(layout.total_numel());
    InitParameters(layout, 7, p.data());
    const std::string v3 = d + "/" + c.ToString() + "-v3.bin";
    Check(WriteLlmcModel(v3, layout, p.data()));
    // version 5: the same header with version 5 and the payload as bf16
    std::string bytes = fuzz::ReadFile(v3);
    bytes.replace(4, 4, Le32(5));
    std::vector<uint16_t> bf(p.size());
    std::vector<float> body(p.size());
    std::memcpy(body.data(), bytes.data() + 1024, p.size() * 4);
    FloatToBf16(body.data(), bf.data(), bf.size());
    Write(d + "/" + c.ToString() + "-v5.bin",
          bytes.substr(0, 1024) + std::string(reinterpret_cast<const char*>(bf.data()), bf.size() * 2));
  }
}

void Tokenizers(const std::string& d) {
  const std::vector<std::string> pieces = {"a", "bc", std::string("\0\xff", 2), "hello", ""};
  for (int eot : {4, -1}) {
    std::string s = Le32(20240328) + Le32(2) + Le32(static_cast<int32_t>(pieces.size())) + Le32(eot);
    s.resize(1024, '\0');
    for (const std::string& p : pieces) s += static_cast<char>(p.size()) + p;
    Write(d + "/v2-eot" + std::to_string(eot) + ".bin", s);
  }
}

void CheckpointIndexes(const std::string& d) {
  struct Case {
    GPTConfig config;
    int world, stage;
    const char* dtype;
  };
  int n = 0;
  for (const Case& c : {Case{{1, 1, 4, 4, 2}, 1, 0, "f32"}, Case{{1, 1, 4, 4, 2}, 2, 3, "bf16"},
                        Case{{2, 2, 4, 3, 129}, 3, 1, "f32"}}) {
    const ParamLayout layout(c.config);
    CheckpointIndex idx;
    idx.format_version = kCheckpointFormatVersion;
    idx.checkpoint_id = 0x1234567890abcdefull + n;
    idx.config = c.config;
    idx.tensors = layout.tensors();
    idx.units = layout.units();
    idx.world_size = c.world;
    idx.zero_stage = c.stage;
    idx.dtype = c.dtype;
    idx.state = TrainState{5, 5 * 64, 10, 1337};
    if (n % 2 == 0) {  // half the seeds carry the optional /run record (what a resume checks)
      idx.state.batch_samples = 4, idx.state.seq_len = 16, idx.state.shuffle = 1;
      idx.state.data_files = {{"data/train_000.bin", 1000}, {"data/train_001.bin", 2000}};
    }
    // the last case with the per-param layout (several chunks per unit and file)
    const ShardLayout sl = n == 2 ? ShardLayout::kPerParam : ShardLayout::kFlat;
    idx.shard_layout = ShardLayoutName(sl);
    idx.pieces = PlanSave(layout, c.world, sl);
    idx.chunks = ChunksFromPieces(layout, idx.pieces);
    const std::vector<uint64_t> elems = FileElements(idx.pieces, c.world);
    for (int r = 0; r < c.world; r++) {
      CheckpointFile f{ShardFileName(r), elems[r], 12 * elems[r] + 4096, 0x11111111u * (r + 1), 0x2222u + r,
                       0x3333u + r, {}, {}};
      for (int k = 0; k < 3; k++) f.chunk_offsets[k] = {2048 + k * (elems[r] + 1) * 4}, f.chunk_crcs[k] = {0xc0ffeeu + k};
      idx.files.push_back(f);
    }
    const std::string path = d + "/index" + std::to_string(n++) + ".h5";
    fs::remove(path);
    Check(WriteCheckpointIndex(path, idx));
    Check(ParseCheckpointIndex(fuzz::ReadFile(path), path, d).status());
  }
}

void ShardFiles(const std::string& d) {
  const std::string path = d + "/" + ShardFileName(0);
  fs::remove(path);
  ShardWriteResult res;
  Check(WriteShardFile(path, 0, 1, fuzz::kShardSeedId, 7, fuzz::kShardSeedElems,
                       [](int k, uint64_t at, uint64_t count, float* dst) {
                         for (uint64_t i = 0; i < count; i++) dst[i] = fuzz::ShardSeedValue(k, at + i);
                         return Status::OK();
                       },
                       &res));
}

void PrepareInputs(const std::string& d) {
  // byte 0: val_fraction selector, byte 1: split point, then text
  Write(d + "/one-file.txt", std::string("\x40\x00", 2) + "In the beginning God created the heaven and the earth.\n");
  Write(d + "/two-files.txt", std::string("\x80\x05", 2) + "Hello, world\n\x00\xff\xfe binary too");
  Write(d + "/nan.txt", std::string("\x08\x00", 2) + "text");
}

void CliArgs(const std::string& d) {
  Write(d + "/ints.txt", "--int\n42\n--ll\n-9000000000\n--u64\n18446744073709551615\n--stage\n3");
  Write(d + "/floats.txt", "--dbl\n6e-4\n--flt\n-1.5e3\n--dbl=0.25");
  Write(d + "/mixed.txt", "-i7\n--ids\n50256\n1\n2\n--flag\ntrue\n--int=010");
  Write(d + "/bad.txt", "--u64\n-1\n--int\n0x10\n--dbl\nnan");
}

// A tiny Hugging Face GPT-2 model (the config safetensors_fuzz writes beside its
// input) and two tokenizer.json files (byte symbols, a few merges, an added token).
void HfModels(const std::string& d) {
  const GPTConfig c{1, 2, 8, 4, 10};
  const ParamLayout layout(c);
  std::vector<float> p(layout.total_numel());
  InitParameters(layout, 3, p.data());
  for (const bool bf16 : {false, true}) {
    const std::string dir = d + (bf16 ? "/bf16" : "/fp32");
    Check(WriteHfGpt2(dir, layout, p.data(), bf16));
    fs::rename(dir + "/model.safetensors", d + (bf16 ? "/bf16.safetensors" : "/fp32.safetensors"));
    fs::remove_all(dir);
  }
}

void TokenizerJsons(const std::string& d) {
  nlohmann::json vocab = nlohmann::json::object();
  int id = 0;
  for (int b = 0; b < 256; b++) {  // GPT-2's bytes_to_unicode
    const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    static int extra = 0;
    const uint32_t cp = keep ? b : 256 + extra++;
    std::string sym;
    if (cp < 0x80) sym.push_back(static_cast<char>(cp));
    else sym.push_back(static_cast<char>(0xC0 | (cp >> 6))), sym.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    vocab[sym] = id++;
  }
  const char* merges[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"\u0120", "w"}, {"o", "r"}};
  nlohmann::json m = nlohmann::json::array();
  for (auto& mg : merges) {
    std::string a = mg[0], b = mg[1];
    vocab[a + b] = id++;
    m.push_back(a + " " + b);
  }
  nlohmann::json j = {{"version", "1.0"},
                      {"added_tokens", {{{"id", id}, {"content", "<|endoftext|>"}, {"special", true}}}},
                      {"normalizer", nullptr},
                      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                      {"post_processor", {{"type", "ByteLevel"}}},
                      {"decoder", {{"type", "ByteLevel"}}},
                      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"vocab", vocab}, {"merges", m}}}};
  Write(d + "/bpe.json", j.dump());
  // every value of the first entries of each array and object replaced by another JSON type
  int k = 0;
  for (const std::string& v : fuzz::JsonTypeVariants(j, 8, 400)) Write(d + "/type_" + std::to_string(k++) + ".json", v);
  // crafted files of past reports: a merge listed twice (the last rank counts); added tokens
  // that overlap, special and not, normalized and not
  nlohmann::json x = j;
  x["model"]["merges"].push_back("h e");
  Write(d + "/duplicate_merge.json", x.dump());
  x = j;
  x["added_tokens"].push_back({{"id", id + 1}, {"content", "<|end"}, {"special", false}, {"normalized", true}});
  x["added_tokens"].push_back({{"id", id + 2}, {"content", "endoftext"}, {"special", false}, {"normalized", false}});
  Write(d + "/overlapping_added.json", x.dump());
  x = j;
  x["added_tokens"][0]["normalized"] = "yes";
  Write(d + "/normalized_yes.json", x.dump());
  // Llama 3's kind: Split with its regex, then ByteLevel without regex; ignore_merges; a template
  x = j;
  x["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  x["model"]["ignore_merges"] = true;
  x["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                         {"special_tokens", {{"<|endoftext|>", {{"id", "<|endoftext|>"}, {"ids", {id}}}}}}};
  Write(d + "/llama3_style.json", x.dump());
  j["model"]["type"] = "WordPiece";
  Write(d + "/wordpiece.json", j.dump());
}

// HF GPT-2 config.json files: the one export --hf writes, every value of it replaced by
// another JSON type, and the crafted configs of past reports (options that change the
// computation, fields of the wrong type).
void HfConfigs(const std::string& d) {
  const GPTConfig c{1, 2, 8, 4, 10};
  const ParamLayout layout(c);
  std::vector<float> p(layout.total_numel());
  InitParameters(layout, 3, p.data());
  const std::string dir = d + "/export";
  Check(WriteHfGpt2(dir, layout, p.data(), false));
  const std::string text = fuzz::ReadFile(dir + "/config.json");
  fs::remove_all(dir);
  Write(d + "/export.json", text);
  const nlohmann::json j = nlohmann::json::parse(text);
  int k = 0;
  for (const std::string& v : fuzz::JsonTypeVariants(j, 64, 400)) Write(d + "/type_" + std::to_string(k++) + ".json", v);
  const std::vector<std::pair<std::string, nlohmann::json>> crafted = {
      {"tie_yes", {{"tie_word_embeddings", "yes"}}}, {"act_null", {{"activation_function", nullptr}}},
      {"act_int", {{"activation_function", 1}}}, {"inv_null", {{"scale_attn_by_inverse_layer_idx", nullptr}}},
      {"no_scale", {{"scale_attn_weights", false}}}, {"upcast", {{"reorder_and_upcast_attn", true}}},
      {"cross", {{"add_cross_attention", true}}}, {"untied", {{"tie_word_embeddings", false}}},
      {"pruned", {{"pruned_heads", {{"0", {1}}}}}}, {"inner", {{"n_inner", 16}}},
  };
  for (const auto& [name, edit] : crafted) {
    nlohmann::json x = j;
    x.update(edit);
    Write(d + "/" + name + ".json", x.dump());
  }
  // a LlamaForCausalLM config.json (ParseHfLlamaConfig) and its type variants
  GPTConfig lc = c;
  lc.arch = Arch::kLlama, lc.n_kv_head = 1, lc.ffn_hidden = 24;
  const ParamLayout llayout(lc);
  std::vector<float> lp(llayout.total_numel());
  InitParameters(llayout, 3, lp.data());
  Check(WriteHfLlama(dir, llayout, lp.data(), false));
  const std::string ltext = fuzz::ReadFile(dir + "/config.json");
  fs::remove_all(dir);
  Write(d + "/llama_export.json", ltext);
  k = 0;
  for (const std::string& v : fuzz::JsonTypeVariants(nlohmann::json::parse(ltext), 64, 400))
    Write(d + "/llama_type_" + std::to_string(k++) + ".json", v);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  struct Target {
    const char* name;
    void (*make)(const std::string&);
  };
  for (const Target& t : {Target{"token_shard", TokenShards}, Target{"llmc_model", LlmcModels},
                          Target{"tokenizer", Tokenizers}, Target{"ckpt_index", CheckpointIndexes},
                          Target{"ckpt_shard", ShardFiles}, Target{"prepare", PrepareInputs},
                          Target{"cli_numbers", CliArgs}, Target{"safetensors", HfModels},
                          Target{"tokenizer_json", TokenizerJsons}, Target{"hf_config", HfConfigs}}) {
    const std::string d = dir + "/" + t.name;
    fs::create_directories(d);
    t.make(d);
  }
  std::printf("seed corpora written under %s\n", dir.c_str());
  return 0;
}
