#include "model/config.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <sstream>

namespace shardgpt {

const char* ArchName(Arch a) { return a == Arch::kLlama ? "llama" : "gpt2"; }

int GPTConfig::ffn() const {
  if (!llama()) return 4 * n_embd;
  if (ffn_hidden > 0) return ffn_hidden;
  const long long f = (8LL * n_embd + 2) / 3;  // ceil(8C/3); Validate bounds n_embd so that this fits
  return static_cast<int>(std::min<long long>((f + 255) / 256 * 256, INT32_MAX));
}

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
  if (!llama()) {  // the Llama-only fields keep their defaults
    const GPTConfig d;
    if (n_kv_head != 0) return bad("--n-kv-head is a llama option (use --arch llama)");
    if (ffn_hidden != 0) return bad("--ffn-hidden is a llama option (use --arch llama)");
    if (rope_theta != d.rope_theta) return bad("--rope-theta is a llama option (use --arch llama)");
    if (norm_eps != d.norm_eps) return bad("--norm-eps is a llama option (use --arch llama)");
    if (!tie_embeddings) return bad("gpt2's LM head is always tied to wte (an untied head needs --arch llama)");
    return Status::OK();
  }
  if (n_embd > kMaxLlamaWidth || ffn_hidden > kMaxLlamaWidth)
    return bad("llama widths (--n-embd, --ffn-hidden) must be <= " + std::to_string(kMaxLlamaWidth));
  if (n_kv_head < 0 || (n_kv_head > 0 && n_head % n_kv_head != 0))
    return bad("--n-kv-head " + std::to_string(n_kv_head) + " must divide --n-head " + std::to_string(n_head));
  if (head_size() % 2 != 0)
    return bad("rotary embeddings need an even head size, got n_embd / n_head = " + std::to_string(head_size()));
  if (ffn_hidden < 0) return bad("--ffn-hidden must be >= 1, got " + std::to_string(ffn_hidden));
  if (!(std::isfinite(rope_theta) && rope_theta > 1.0f))
    return bad("--rope-theta must be a finite number > 1, got " + std::to_string(rope_theta));
  if (!(std::isfinite(norm_eps) && norm_eps > 0.0f && norm_eps < 1.0f))
    return bad("--norm-eps must be in (0, 1), got " + std::to_string(norm_eps));
  return Status::OK();
}

namespace {
std::string FloatText(float v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace

std::string GPTConfig::ToString() const {
  std::string s = "L" + std::to_string(n_layer) + " H" + std::to_string(n_head) + " C" + std::to_string(n_embd) +
                  " V" + std::to_string(vocab_size) + " T" + std::to_string(max_seq_len);
  if (llama())
    s += " llama KV" + std::to_string(kv_heads()) + " F" + std::to_string(ffn()) + " theta" + FloatText(rope_theta) +
         " eps" + FloatText(norm_eps) + (tie_embeddings ? " tied" : " untied");
  return s;
}

std::string GPTConfig::FirstDifference(const GPTConfig& o) const {
  auto diff = [](const char* name, int a, int b) {
    return std::string(name) + ": " + std::to_string(a) + " vs " + std::to_string(b);
  };
  if (arch != o.arch) return std::string("arch: ") + ArchName(arch) + " vs " + ArchName(o.arch);
  if (n_layer != o.n_layer) return diff("n_layer", n_layer, o.n_layer);
  if (n_head != o.n_head) return diff("n_head", n_head, o.n_head);
  if (n_embd != o.n_embd) return diff("n_embd", n_embd, o.n_embd);
  if (max_seq_len != o.max_seq_len) return diff("max_seq_len", max_seq_len, o.max_seq_len);
  if (vocab_size != o.vocab_size) return diff("vocab_size", vocab_size, o.vocab_size);
  if (!llama()) return "";  // a gpt2 config is all in the fields above (its head count and 4C follow)
  if (kv_heads() != o.kv_heads()) return diff("n_kv_head", kv_heads(), o.kv_heads());
  if (ffn() != o.ffn()) return diff("ffn_hidden", ffn(), o.ffn());
  if (rope_theta != o.rope_theta) return "rope_theta: " + FloatText(rope_theta) + " vs " + FloatText(o.rope_theta);
  if (norm_eps != o.norm_eps) return "norm_eps: " + FloatText(norm_eps) + " vs " + FloatText(o.norm_eps);
  if (tie_embeddings != o.tie_embeddings)
    return std::string("tie_embeddings: ") + (tie_embeddings ? "true" : "false") + " vs " +
           (o.tie_embeddings ? "true" : "false");
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
