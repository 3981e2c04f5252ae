// io/hf_llama.h: LlamaForCausalLM directories written and read back (whole and sharded, tied
// and untied), and config.json's options and types refused by name.
#include "io/hf_llama.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

namespace shardgpt {
namespace {

GPTConfig TinyLlama(bool tied) {
  GPTConfig c{2, 4, 16, 8, 300};
  c.arch = Arch::kLlama;
  c.n_kv_head = 2;
  c.ffn_hidden = 40;
  c.rope_theta = 500000.0f;
  c.tie_embeddings = tied;
  return c;
}

// export --hf then --init: every element of the flat buffer back (the padded vocabulary rows
// zero), read whole and in odd ranges, from one file and from shards with an index.
TEST(HfLlama, WriteThenReadRangesGivesTheParameters) {
  for (bool tied : {false, true})
    for (uint64_t shard : {kHfDefaultMaxShardBytes, uint64_t{3000}}) {
      const GPTConfig c = TinyLlama(tied);
      const ParamLayout layout(c);
      std::vector<float> p(layout.total_numel());
      InitParameters(layout, 11, p.data());
      const std::string dir = testing::TempDir() + "/hfl_" + std::to_string(::getpid());
      std::filesystem::remove_all(dir);
      ASSERT_TRUE(WriteHfLlama(dir, layout, p.data(), false, shard).ok());
      const bool sharded = shard != kHfDefaultMaxShardBytes;
      EXPECT_EQ(std::filesystem::exists(dir + "/model.safetensors.index.json"), sharded);
      EXPECT_EQ(std::filesystem::exists(dir + "/model.safetensors"), !sharded);
      EXPECT_TRUE(IsHfLlamaPath(dir));
      auto r = HfLlamaReader::Open(dir);
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
}

// tie_word_embeddings true with an lm_head.weight stored anyway: equal to embed_tokens is read,
// different is refused naming the element; untied without one is a missing tensor.
TEST(HfLlama, AStoredHeadOfATiedModelMustEqualTheEmbedding) {
  const GPTConfig c = TinyLlama(true);
  const ParamLayout layout(c);
  std::vector<float> p(layout.total_numel());
  InitParameters(layout, 5, p.data());
  const std::string dir = testing::TempDir() + "/hflt_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(WriteHfLlama(dir, layout, p.data(), false).ok());
  std::vector<SafetensorsTensor> all;
  {
    auto st = SafetensorsReader::Open(dir + "/model.safetensors");
    ASSERT_TRUE(st.ok());
    for (const SafetensorsEntry& e : st.value()->entries()) {
      SafetensorsTensor t{e.name, e.shape, std::vector<float>(e.numel())};
      ASSERT_TRUE(st.value()->ReadFloats(e, 0, e.numel(), t.values.data()).ok());
      all.push_back(std::move(t));
    }
  }
  SafetensorsTensor head = *std::find_if(all.begin(), all.end(), [](const SafetensorsTensor& t) {
    return t.name == "model.embed_tokens.weight";
  });
  head.name = "lm_head.weight";
  all.push_back(head);
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", all, false, {}).ok());
  EXPECT_TRUE(HfLlamaReader::Open(dir).ok());
  all.back().values[7] += 1.0f;
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", all, false, {}).ok());
  auto r = HfLlamaReader::Open(dir);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tensor \"lm_head.weight\" differs from \"model.embed_tokens.weight\" at element 7"),
            std::string::npos) << r.status().message();
  all.pop_back();
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", all, false, {}).ok());
  nlohmann::json cfg = {{"model_type", "llama"}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                        {"hidden_size", 16}, {"intermediate_size", 40}, {"max_position_embeddings", 8},
                        {"vocab_size", 300}, {"num_key_value_heads", 2}, {"tie_word_embeddings", false}};
  {
    std::ofstream f(dir + "/config.json");
    f << cfg.dump();
  }
  r = HfLlamaReader::Open(dir);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("missing tensor \"lm_head.weight\""), std::string::npos) << r.status().message();
  std::filesystem::remove_all(dir);
}

// Exports into one directory: whole, then in many shards, then in fewer: each leaves one model
// (no model.safetensors beside an index, no stale shard), and config.json shows the flags' values.
TEST(HfLlama, ReExportLeavesOneModel) {
  const GPTConfig c = TinyLlama(false);
  const ParamLayout layout(c);
  std::vector<float> p(layout.total_numel());
  InitParameters(layout, 2, p.data());
  const std::string dir = testing::TempDir() + "/hflr_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  auto files = [&] {
    std::vector<std::string> f;
    for (const auto& e : std::filesystem::directory_iterator(dir)) f.push_back(e.path().filename().string());
    std::sort(f.begin(), f.end());
    return f;
  };
  ASSERT_TRUE(WriteHfLlama(dir, layout, p.data(), false).ok());
  EXPECT_EQ(files(), (std::vector<std::string>{"config.json", "model.safetensors"}));
  ASSERT_TRUE(WriteHfLlama(dir, layout, p.data(), false, 2000).ok());
  EXPECT_GT(files().size(), 4u);
  EXPECT_FALSE(std::filesystem::exists(dir + "/model.safetensors"));
  ASSERT_TRUE(WriteHfLlama(dir, layout, p.data(), false, 40000).ok());
  EXPECT_EQ(files(), (std::vector<std::string>{"config.json", "model-00001-of-00002.safetensors",
                                               "model-00002-of-00002.safetensors", "model.safetensors.index.json"}));
  auto r = HfLlamaReader::Open(dir);
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::ifstream f(dir + "/config.json");
  const nlohmann::json cfg = nlohmann::json::parse(f);
  EXPECT_EQ(cfg["rms_norm_eps"].dump(), "1e-05");
  EXPECT_EQ(cfg["rope_theta"].dump(), "500000.0");
  std::filesystem::remove_all(dir);
}

TEST(HfLlama, AGpt2LayoutIsNotWrittenAsLlama) {
  const ParamLayout layout(GPTConfig{2, 2, 16, 8, 300});
  std::vector<float> p(layout.total_numel());
  EXPECT_FALSE(WriteHfLlama(testing::TempDir() + "/never", layout, p.data(), false).ok());
}

// config.json: defaults, accepted no-ops, and each option that changes the computation or field
// of another JSON type refused with one line naming the file and the field.
TEST(HfLlama, ConfigOptionsAndTypesAreRefusedByName) {
  const nlohmann::json good = {{"model_type", "llama"},         {"num_hidden_layers", 2},
                               {"num_attention_heads", 4},      {"hidden_size", 16},
                               {"intermediate_size", 40},       {"max_position_embeddings", 8},
                               {"vocab_size", 300},             {"num_key_value_heads", 2},
                               {"rope_theta", 500000.0},        {"rms_norm_eps", 1e-5},
                               {"tie_word_embeddings", false},  {"hidden_act", "silu"},
                               {"rope_scaling", nullptr},       {"pretraining_tp", 2},
                               {"attention_bias", false},       {"head_dim", 4}};
  auto parsed = ParseHfLlamaConfig("d/config.json", good.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed.value().FirstDifference(TinyLlama(false)), "");
  {  // defaults: num_key_value_heads = heads, rms_norm_eps 1e-6, rope_theta 10000, untied
    nlohmann::json j = good;
    for (const char* k : {"num_key_value_heads", "rope_theta", "rms_norm_eps", "tie_word_embeddings"}) j.erase(k);
    auto d = ParseHfLlamaConfig("d/config.json", j.dump());
    ASSERT_TRUE(d.ok()) << d.status().message();
    EXPECT_EQ(d.value().kv_heads(), 4);
    EXPECT_FLOAT_EQ(d.value().norm_eps, 1e-6f);
    EXPECT_FLOAT_EQ(d.value().rope_theta, 10000.0f);
    EXPECT_FALSE(d.value().tie_embeddings);
  }
  const std::vector<std::pair<nlohmann::json, std::string>> cases = {
      {{{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}}, "rope_scaling an object of 2 is not supported"},
      {{{"sliding_window", 4096}}, "sliding_window 4096 is not supported"},
      {{{"attention_bias", true}}, "attention_bias true is not supported"},
      {{{"mlp_bias", true}}, "mlp_bias true is not supported"},
      {{{"hidden_act", "gelu"}}, "hidden_act \"gelu\" is not supported"},
      {{{"head_dim", 8}}, "head_dim 8 is not supported (expected hidden_size / num_attention_heads = 4)"},
      {{{"model_type", "qwen2"}}, "model_type \"qwen2\" is not supported"},
      {{{"num_key_value_heads", 3}}, "d/config.json: "},  // does not divide the heads: Validate's message
      // wrong JSON types
      {{{"num_key_value_heads", "2"}}, "num_key_value_heads is \"2\" (expected a positive integer)"},
      {{{"hidden_size", 16.0}}, "hidden_size is 16.0 (expected a positive integer)"},
      {{{"rope_theta", "1e4"}}, "rope_theta is \"1e4\" (expected a positive number)"},
      {{{"rms_norm_eps", nullptr}}, "rms_norm_eps is null (expected a positive number)"},
      {{{"tie_word_embeddings", "no"}}, "tie_word_embeddings is \"no\""},
      {{{"hidden_act", 1}}, "hidden_act is 1"},
      {{{"attention_bias", nullptr}}, "attention_bias is null"},
      {{{"pretraining_tp", 0}}, "pretraining_tp is 0 (expected a positive integer)"},
  };
  for (const auto& [edit, want] : cases) {
    nlohmann::json j = good;
    j.update(edit);
    auto r = ParseHfLlamaConfig("d/config.json", j.dump());
    ASSERT_FALSE(r.ok()) << edit.dump();
    const std::string m = r.status().message();
    EXPECT_NE(m.find("d/config.json: "), std::string::npos) << m;
    EXPECT_NE(m.find(want), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  nlohmann::json j = good;
  j.erase("intermediate_size");
  EXPECT_NE(ParseHfLlamaConfig("d/config.json", j.dump()).status().message().find("missing \"intermediate_size\""),
            std::string::npos);
}

}  // namespace
}  // namespace shardgpt
