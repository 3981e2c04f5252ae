#include "io/hf_llama.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/json_fields.h"

namespace shardgpt {

namespace fs = std::filesystem;

namespace {

constexpr char kIndexName[] = "model.safetensors.index.json";

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// HF's name of one of our tensors.
std::string HfName(const TensorInfo& t) { return t.name == "lm_head.weight" ? t.name : "model." + t.name; }

// Our tensor's shape as HF stores it: the vocabulary rows unpadded.
std::vector<int64_t> HfShape(const TensorInfo& t, const GPTConfig& c) {
  if (t.name == "embed_tokens.weight" || t.name == "lm_head.weight") return {c.vocab_size, c.n_embd};
  return t.shape;
}

// An optional positive finite number (absent: fallback), narrowed to float.
Status PositiveNumber(const std::string& what, const nlohmann::json& j, const char* key, double fallback, float* out) {
  const nlohmann::json* v = JsonMember(j, key);
  if (!v) {
    *out = static_cast<float>(fallback);
    return Status::OK();
  }
  const float f = v->is_number() ? static_cast<float>(v->get<double>()) : 0.0f;  // as fp32 too: positive, finite
  if (!v->is_number() || !(f > 0) || !std::isfinite(f))
    return Status::InvalidArgument(what + ": " + key + " is " + JsonBrief(*v) + " (expected a positive number)");
  *out = static_cast<float>(v->get<double>());
  return Status::OK();
}

// An optional boolean that shardgpt computes only at false.
Status FalseOnly(const std::string& what, const nlohmann::json& j, const char* key, const char* why) {
  auto b = JsonOptionalBool(what, j, "", key, false);
  if (!b.ok()) return b.status();
  if (b.value()) return Status::InvalidArgument(what + ": " + key + " true is not supported (" + why + "; expected false)");
  return Status::OK();
}

// An option that must be absent or null.
Status NullOnly(const std::string& what, const nlohmann::json& j, const char* key, const char* why) {
  const nlohmann::json* v = JsonMember(j, key);
  if (v && !v->is_null())
    return Status::InvalidArgument(what + ": " + key + " " + JsonBrief(*v) + " is not supported (" + why +
                                   "; expected null)");
  return Status::OK();
}

// A stored lm_head.weight beside tie_word_embeddings true must equal embed_tokens element for
// element (a tied head saved anyway); a different one would be silently dropped, so it is
// refused naming both. Read in blocks.
Status CheckTiedHead(SafetensorsReader& hf, const SafetensorsEntry& head, SafetensorsReader& ef,
                     const SafetensorsEntry& embed) {
  const std::string what = hf.path() + ": tensor " + Quoted(head.name);
  if (head.shape != embed.shape)
    return Status::InvalidArgument(what + " has shape " + ShapeStr(head.shape) + ", " + Quoted(embed.name) + " has " +
                                   ShapeStr(embed.shape) + " (tie_word_embeddings is true: expected it absent or equal)");
  if (head.dtype != "F32" && head.dtype != "BF16" && head.dtype != "F16")
    return Status::InvalidArgument(what + " has dtype " + head.dtype + " (expected F32, BF16 or F16)");
  const uint64_t n = embed.numel(), block = uint64_t{1} << 18;
  std::vector<float> a(std::min(n, block)), b(a.size());
  for (uint64_t at = 0; at < n; at += block) {
    const uint64_t k = std::min(block, n - at);
    SHARDGPT_RETURN_IF_ERROR(hf.ReadFloats(head, at, k, a.data()));
    SHARDGPT_RETURN_IF_ERROR(ef.ReadFloats(embed, at, k, b.data()));
    for (uint64_t i = 0; i < k; i++)
      if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
        return Status::InvalidArgument(what + " differs from " + Quoted(embed.name) + " at element " +
                                       std::to_string(at + i) +
                                       " while tie_word_embeddings is true (set it false to import an untied head)");
  }
  return Status::OK();
}

// The double with the fewest significant digits that reads back as f (1e-5f as 1e-05, not
// 9.99999974737875e-06), so config.json shows the value the flags gave.
double ShortestDecimal(float f) {
  for (int digits = 1; digits <= 9; digits++) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f) return std::strtod(buf, nullptr);
  }
  return static_cast<double>(f);
}

// config.json beside an HF path (the directory itself, or a .safetensors in it).
fs::path HfDir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
}
std::string ConfigPath(const fs::path& dir) { return (dir.empty() ? fs::path("config.json") : dir / "config.json").string(); }

}  // namespace

StatusOr<uint64_t> HfMaxShardBytes() {
  const char* env = std::getenv("SHARDGPT_HF_MAX_SHARD_BYTES");
  if (!env || !*env) return kHfDefaultMaxShardBytes;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(env, &end, 10);
  if (errno != 0 || *end != '\0' || v == 0 || env[0] == '-')
    return Status::InvalidArgument(std::string("SHARDGPT_HF_MAX_SHARD_BYTES is \"") + env +
                                   "\" (expected a positive integer: bytes of tensors per safetensors file)");
  return static_cast<uint64_t>(v);
}

bool IsHfLlamaPath(const std::string& path) {
  const std::string cfg = ConfigPath(HfDir(path));
  std::ifstream f(cfg, std::ios::binary);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return false;
  const nlohmann::json* mt = JsonMember(j, "model_type");
  return mt != nullptr && *mt != "gpt2";
}

StatusOr<GPTConfig> ParseHfLlamaConfig(const std::string& what, const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status::InvalidArgument(what + ": not a JSON object (expected a Hugging Face Llama config.json)");
  if (const nlohmann::json* mt = JsonMember(j, "model_type"); !mt || *mt != "llama")
    return Status::InvalidArgument(what + ": model_type " + (mt ? JsonBrief(*mt) : std::string("absent")) +
                                   " is not supported (expected \"llama\"; shardgpt reads \"gpt2\" and \"llama\")");
  GPTConfig c;
  c.arch = Arch::kLlama;
  SHARDGPT_RETURN_IF_ERROR(JsonPositiveInt(what, j, "num_hidden_layers", &c.n_layer));
  SHARDGPT_RETURN_IF_ERROR(JsonPositiveInt(what, j, "num_attention_heads", &c.n_head));
  SHARDGPT_RETURN_IF_ERROR(JsonPositiveInt(what, j, "hidden_size", &c.n_embd));
  SHARDGPT_RETURN_IF_ERROR(JsonPositiveInt(what, j, "intermediate_size", &c.ffn_hidden));
  SHARDGPT_RETURN_IF_ERROR(JsonPositiveInt(what, j, "max_position_embeddings", &c.max_seq_len));
  SHARDGPT_RETURN_IF_ERROR(JsonPositiveInt(what, j, "vocab_size", &c.vocab_size));
  SHARDGPT_RETURN_IF_ERROR(JsonPositiveInt(what, j, "num_key_value_heads", &c.n_kv_head, c.n_head));
  SHARDGPT_RETURN_IF_ERROR(PositiveNumber(what, j, "rms_norm_eps", 1e-6, &c.norm_eps));
  SHARDGPT_RETURN_IF_ERROR(PositiveNumber(what, j, "rope_theta", 10000.0, &c.rope_theta));
  {
    auto tie = JsonOptionalBool(what, j, "", "tie_word_embeddings", false);
    if (!tie.ok()) return tie.status();
    c.tie_embeddings = tie.value();
  }
  // What our kernels compute: SiLU-gated MLP, no biases, plain RoPE over whole heads of
  // hidden_size / num_attention_heads, full causal attention. Each other value is refused by name.
  {
    auto act = JsonOptionalString(what, j, "", "hidden_act", "silu");
    if (!act.ok()) return act.status();
    if (act.value() != "silu")
      return Status::InvalidArgument(what + ": hidden_act " + Quoted(act.value()) +
                                     " is not supported (expected \"silu\": the MLP is SwiGLU)");
  }
  SHARDGPT_RETURN_IF_ERROR(FalseOnly(what, j, "attention_bias", "the attention projections have no biases"));
  SHARDGPT_RETURN_IF_ERROR(FalseOnly(what, j, "mlp_bias", "the MLP projections have no biases"));
  SHARDGPT_RETURN_IF_ERROR(NullOnly(what, j, "rope_scaling", "rotary positions are unscaled"));
  SHARDGPT_RETURN_IF_ERROR(NullOnly(what, j, "sliding_window", "attention is full causal"));
  if (const nlohmann::json* hd = JsonMember(j, "head_dim"); hd && !hd->is_null()) {
    if (!hd->is_number_integer())
      return Status::InvalidArgument(what + ": head_dim is " + JsonBrief(*hd) + " (expected an integer or null)");
    if (c.n_embd % c.n_head != 0 || hd->get<int64_t>() != c.n_embd / c.n_head)
      return Status::InvalidArgument(what + ": head_dim " + JsonBrief(*hd) +
                                     " is not supported (expected hidden_size / num_attention_heads = " +
                                     std::to_string(c.n_embd / c.n_head) + ")");
  }
  if (const nlohmann::json* tp = JsonMember(j, "pretraining_tp");
      tp && !(tp->is_number_integer() && tp->get<int64_t>() >= 1))
    return Status::InvalidArgument(what + ": pretraining_tp is " + JsonBrief(*tp) + " (expected a positive integer)");
  if (const nlohmann::json* v = JsonMember(j, "attention_dropout");
      v && !(v->is_number() && v->get<double>() >= 0 && v->get<double>() < 1))
    return Status::InvalidArgument(what + ": attention_dropout is " + JsonBrief(*v) + " (expected a probability in [0, 1))");
  {
    Status v = c.Validate();
    if (!v.ok()) return Status::InvalidArgument(what + ": " + v.message());
  }
  return c;
}

Status WriteHfLlama(const std::string& dir, const ParamLayout& layout, const float* params, bool bf16,
                    uint64_t max_shard_bytes) {
  const GPTConfig& c = layout.config();
  if (!c.llama()) return Status::InvalidArgument(dir + ": WriteHfLlama writes --arch llama models (gpt2: WriteHfGpt2)");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IOError(dir + ": cannot create directory (" + ec.message() + ")");
  // tensors in layout order, cut into files of at most max_shard_bytes (a larger tensor alone)
  const uint64_t elt = bf16 ? 2 : 4;
  std::vector<std::vector<const TensorInfo*>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const TensorInfo& t : layout.tensors()) {
    uint64_t n = 1;
    for (int64_t d : HfShape(t, c)) n *= static_cast<uint64_t>(d);
    const uint64_t bytes = n * elt;
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().push_back(&t);
    in_shard += bytes, total += bytes;
  }
  const size_t n_files = shards.size();
  auto file_name = [&](size_t i) {
    if (n_files == 1) return std::string("model.safetensors");
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n_files);
    return std::string(buf);
  };
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t i = 0; i < n_files; i++) {
    std::vector<SafetensorsTensor> tensors;
    for (const TensorInfo* t : shards[i]) {
      const float* src = params + layout.units()[t->unit].offset + t->offset;
      SafetensorsTensor out{HfName(*t), HfShape(*t, c), {}};
      uint64_t n = 1;
      for (int64_t d : out.shape) n *= static_cast<uint64_t>(d);
      out.values.assign(src, src + n);  // embed_tokens / lm_head: the first V rows, padding dropped
      weight_map[out.name] = file_name(i);
      tensors.push_back(std::move(out));
    }
    SHARDGPT_RETURN_IF_ERROR(WriteSafetensors((fs::path(dir) / file_name(i)).string(), tensors, bf16, {{"format", "pt"}}));
  }
  // shards of an earlier export into dir that this one did not rewrite
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    bool ours = false;
    for (size_t i = 0; i < n_files && !ours; i++) ours = f == file_name(i);
    if (!ours && f.rfind("model-", 0) == 0 && f.find("-of-") != std::string::npos && f.size() > 12 &&
        f.compare(f.size() - 12, 12, ".safetensors") == 0)
      fs::remove(e.path(), ec);
  }
  if (n_files > 1) {
    nlohmann::ordered_json idx;
    idx["metadata"] = {{"total_size", total}};
    idx["weight_map"] = weight_map;
    SHARDGPT_RETURN_IF_ERROR(WriteTextFileAtomic((fs::path(dir) / kIndexName).string(), idx.dump(2) + "\n"));
    fs::remove(fs::path(dir) / "model.safetensors", ec);  // transformers would read it first
  } else {
    fs::remove(fs::path(dir) / kIndexName, ec);
  }
  nlohmann::ordered_json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.n_embd;
  j["intermediate_size"] = c.ffn();
  j["num_hidden_layers"] = c.n_layer;
  j["num_attention_heads"] = c.n_head;
  j["num_key_value_heads"] = c.kv_heads();
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = ShortestDecimal(c.norm_eps);
  j["rope_theta"] = ShortestDecimal(c.rope_theta);
  j["rope_scaling"] = nullptr;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["pretraining_tp"] = 1;
  j["initializer_range"] = 0.02;
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["torch_dtype"] = bf16 ? "bfloat16" : "float32";
  return WriteTextFileAtomic((fs::path(dir) / "config.json").string(), j.dump(2) + "\n");
}

StatusOr<std::unique_ptr<HfLlamaReader>> HfLlamaReader::Open(const std::string& path) {
  std::error_code ec;
  const bool is_dir = fs::is_directory(path, ec);
  const fs::path dir = HfDir(path);
  const std::string cfg_path = ConfigPath(dir);
  auto text = ReadTextFile(cfg_path, "a Hugging Face Llama config.json");
  if (!text.ok()) return text.status();
  auto cfg = ParseHfLlamaConfig(cfg_path, text.value());
  if (!cfg.ok()) return cfg.status();
  std::unique_ptr<HfLlamaReader> r(new HfLlamaReader());
  GPTConfig& c = r->config_;
  c = cfg.value();
  r->layout_ = std::make_unique<ParamLayout>(c);

  // The files: path itself, dir/model.safetensors, or the shards an index names.
  std::map<std::string, size_t> file_of_tensor;  // HF name -> index into files_
  std::string where;                             // what errors name for the tensor table
  const std::string single = is_dir ? (dir / "model.safetensors").string() : path;
  const std::string index_path = (dir / kIndexName).string();
  if (!is_dir || fs::exists(single, ec) || !fs::exists(index_path, ec)) {
    auto st = SafetensorsReader::Open(single);
    if (!st.ok()) return st.status();
    r->files_.push_back(std::move(st.value()));
    for (const SafetensorsEntry& e : r->files_[0]->entries()) file_of_tensor[e.name] = 0;
    where = single;
  } else {
    auto itext = ReadTextFile(index_path, "a safetensors index: {\"weight_map\": {tensor: file}}");
    if (!itext.ok()) return itext.status();
    const nlohmann::json idx = nlohmann::json::parse(itext.value(), nullptr, /*allow_exceptions=*/false);
    if (idx.is_discarded() || !idx.is_object())
      return Status::InvalidArgument(index_path + ": not a JSON object (expected {\"weight_map\": {tensor: file}})");
    const nlohmann::json* wm = JsonMember(idx, "weight_map");
    if (!wm) return Status::InvalidArgument(index_path + ": missing \"weight_map\" (expected an object {tensor: file})");
    if (!wm->is_object())
      return Status::InvalidArgument(index_path + ": weight_map is " + JsonBrief(*wm) + " (expected an object {tensor: file})");
    std::map<std::string, size_t> file_index;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string())
        return Status::InvalidArgument(index_path + ": weight_map." + it.key() + " is " + JsonBrief(it.value()) +
                                       " (expected a file name)");
      const std::string f = it.value().get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        return Status::InvalidArgument(index_path + ": weight_map." + it.key() + " is " + Quoted(f) +
                                       " (expected a file name in the directory)");
      auto [slot, fresh] = file_index.emplace(f, r->files_.size());
      if (fresh) {
        auto st = SafetensorsReader::Open((dir / f).string());
        if (!st.ok()) return st.status();
        r->files_.push_back(std::move(st.value()));
      }
      file_of_tensor[it.key()] = slot->second;
    }
    // every tensor of every shard must be in the map, at the file it names
    for (size_t i = 0; i < r->files_.size(); i++)
      for (const SafetensorsEntry& e : r->files_[i]->entries()) {
        auto m = file_of_tensor.find(e.name);
        if (m == file_of_tensor.end() || m->second != i)
          return Status::InvalidArgument(r->files_[i]->path() + ": tensor " + Quoted(e.name) +
                                         (m == file_of_tensor.end() ? " is not in " : " is mapped to another file by ") +
                                         index_path);
      }
    where = index_path;
  }

  std::set<std::string> used;
  for (const TensorInfo& t : r->layout_->tensors()) {
    const std::string name = HfName(t);
    auto m = file_of_tensor.find(name);
    const SafetensorsEntry* e = m == file_of_tensor.end() ? nullptr : r->files_[m->second]->Find(name);
    if (!e)
      return Status::InvalidArgument(where + ": missing tensor " + Quoted(name) + " (config.json describes " + c.ToString() + ")");
    const std::string at = r->files_[m->second]->path();
    const std::vector<int64_t> want = HfShape(t, c);
    if (e->shape != want)
      return Status::InvalidArgument(at + ": tensor " + Quoted(name) + " has shape " + ShapeStr(e->shape) +
                                     ", config.json (" + c.ToString() + ") implies " + ShapeStr(want));
    if (e->dtype != "F32" && e->dtype != "BF16" && e->dtype != "F16")
      return Status::InvalidArgument(at + ": tensor " + Quoted(name) + " has dtype " + e->dtype + " (expected F32, BF16 or F16)");
    used.insert(name);
    r->sources_.push_back(Source{r->files_[m->second].get(), e});
  }
  for (const auto& [name, file] : file_of_tensor) {
    if (used.count(name)) continue;
    const std::string suffix = ".self_attn.rotary_emb.inv_freq";  // a buffer older transformers saved
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) continue;
    if (name == "lm_head.weight" && c.tie_embeddings) {  // a tied head saved anyway: must be embed_tokens
      const Source& embed = r->sources_[r->layout_->Find("embed_tokens.weight")];
      SHARDGPT_RETURN_IF_ERROR(CheckTiedHead(*r->files_[file], *r->files_[file]->Find(name), *embed.file, *embed.entry));
      continue;
    }
    return Status::InvalidArgument(r->files_[file]->path() + ": unexpected tensor " + Quoted(name) + " (not part of a Llama " +
                                   c.ToString() + ")");
  }
  return r;
}

uint64_t HfLlamaReader::bytes_read() const {
  uint64_t n = 0;
  for (const auto& f : files_) n += f->bytes_read();
  return n;
}

Status HfLlamaReader::ReadRange(uint64_t begin, uint64_t end, float* dst) {
  const ParamLayout& L = *layout_;
  for (size_t k = 0; k < L.tensors().size(); k++) {
    const TensorInfo& t = L.tensors()[k];
    const uint64_t g = L.units()[t.unit].offset + t.offset;
    const uint64_t lo = std::max(begin, g), hi = std::min(end, g + t.numel);
    if (lo >= hi) continue;
    const Source& s = sources_[k];
    float* out = dst + (lo - begin);
    const uint64_t real = s.entry->numel();  // embed_tokens / lm_head: V rows; the padded rows after them are zero
    const uint64_t rlo = std::min(lo - g, real), rhi = std::min(hi - g, real);
    if (rhi > rlo) SHARDGPT_RETURN_IF_ERROR(s.file->ReadFloats(*s.entry, rlo, rhi - rlo, out));
    std::fill(out + (rhi - rlo), out + (hi - lo), 0.0f);
    for (uint64_t a = 0; a < hi - lo; a++)
      if (!std::isfinite(out[a]))
        return Status::Corruption(s.file->path() + ": tensor " + Quoted(s.entry->name) + " element " +
                                  std::to_string(lo - g + a) + " is " + (std::isnan(out[a]) ? "NaN" : "infinite") +
                                  " (expected finite weights)");
  }
  return Status::OK();
}

}  // namespace shardgpt
