#include "model/config.h"

namespace shardgpt {

Status GPTConfig::Validate() const {
  auto bad = [](const std::string& what) { return Status::InvalidArgument("model config: " + what); };
  if (n_layer < 1) return bad("--n-layer must be >= 1, got " + std::to_string(n_layer));
  if (n_head < 1) return bad("--n-head must be >= 1, got " + std::to_string(n_head));
  if (n_embd < 1) return bad("--n-embd must be >= 1, got " + std::to_string(n_embd));
  if (n_embd % n_head != 0)
    return bad("--n-embd " + std::to_string(n_embd) + " must be divisible by --n-head " + std::to_string(n_head));
  if (max_seq_len < 1) return bad("--seq-len must be >= 1, got " + std::to_string(max_seq_len));
  if (vocab_size < 2 || vocab_size > 2000000)
    return bad("--vocab-size must be in [2, 2000000], got " + std::to_string(vocab_size));
  return Status::OK();
}

std::string GPTConfig::ToString() const {
  return "L" + std::to_string(n_layer) + " H" + std::to_string(n_head) + " C" + std::to_string(n_embd) + " V" +
         std::to_string(vocab_size) + " T" + std::to_string(max_seq_len);
}

std::string GPTConfig::FirstDifference(const GPTConfig& o) const {
  auto diff = [](const char* name, int a, int b) {
    return std::string(name) + ": " + std::to_string(a) + " vs " + std::to_string(b);
  };
  if (n_layer != o.n_layer) return diff("n_layer", n_layer, o.n_layer);
  if (n_head != o.n_head) return diff("n_head", n_head, o.n_head);
  if (n_embd != o.n_embd) return diff("n_embd", n_embd, o.n_embd);
  if (max_seq_len != o.max_seq_len) return diff("max_seq_len", max_seq_len, o.max_seq_len);
  if (vocab_size != o.vocab_size) return diff("vocab_size", vocab_size, o.vocab_size);
  return "";
}

namespace {
struct Preset {
  const char* name;
  GPTConfig config;
};
// GPT-2 sizes as in llm.c (dN = N layers); tiny is for tests and the quick demo.
const Preset kPresets[] = {
    {"tiny", {2, 4, 64, 128, 256}},       {"d6", {6, 6, 384, 1024, 50257}},
    {"d12", {12, 12, 768, 1024, 50257}},  {"d24", {24, 16, 1024, 1024, 50257}},
    {"d36", {36, 20, 1280, 1024, 50257}}, {"d48", {48, 25, 1600, 1024, 50257}},
};
}  // namespace

StatusOr<GPTConfig> PresetConfig(const std::string& name) {
  for (const auto& p : kPresets)
    if (name == p.name) return p.config;
  std::string names;
  for (const auto& p : kPresets) names += std::string(names.empty() ? "" : ", ") + p.name;
  return Status::InvalidArgument("--model: unknown preset '" + name + "' (expected one of " + names + ")");
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const auto& p : kPresets) names.push_back(p.name);
  return names;
}

}  // namespace shardgpt
