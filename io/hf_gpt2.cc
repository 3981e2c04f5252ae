#include "io/hf_gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/json_fields.h"

namespace shardgpt {

namespace fs = std::filesystem;

namespace {

bool IsConv1D(const std::string& name) {
  return name.find("attn.c_attn.weight") != std::string::npos || name.find("attn.c_proj.weight") != std::string::npos ||
         name.find("mlp.c_fc.weight") != std::string::npos || name.find("mlp.c_proj.weight") != std::string::npos;
}

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Our tensor's shape as HF stores it.
std::vector<int64_t> HfShape(const TensorInfo& t, const GPTConfig& c) {
  if (t.name == "wte.weight") return {c.vocab_size, c.n_embd};
  if (IsConv1D(t.name)) return {t.shape[1], t.shape[0]};
  return t.shape;
}

// An optional boolean option that shardgpt computes only at `want` (absent means HF's default,
// which is `want`): another value is refused naming it, and so is any other JSON type (null
// included: transformers would read it as false).
Status FixedBool(const std::string& what, const nlohmann::json& j, const char* key, bool want, const char* why) {
  const nlohmann::json* v = JsonMember(j, key);
  if (!v) return Status::OK();
  if (!v->is_boolean())
    return Status::InvalidArgument(what + ": " + key + " is " + JsonBrief(*v) + " (expected " +
                                   (want ? "true" : "false") + ")");
  if (v->get<bool>() != want)
    return Status::InvalidArgument(what + ": " + key + " " + (want ? "false" : "true") + " is not supported (" + why +
                                   "; expected " + (want ? "true" : "false") + ")");
  return Status::OK();
}

// A stored lm_head.weight must equal wte element for element (a tied head saved anyway): an
// untied head cannot be imported, as shardgpt's LM head is wte itself. Read in blocks.
Status CheckTiedHead(SafetensorsReader& st, const SafetensorsEntry& head, const SafetensorsEntry& wte) {
  const std::string what = st.path() + ": tensor \"" + head.name + "\"";
  if (head.shape != wte.shape)
    return Status::InvalidArgument(what + " has shape " + ShapeStr(head.shape) + ", wte has " + ShapeStr(wte.shape) +
                                   " (expected the LM head tied to wte: absent, or equal to it)");
  if (head.dtype != "F32" && head.dtype != "BF16" && head.dtype != "F16")
    return Status::InvalidArgument(what + " has dtype " + head.dtype + " (expected F32, BF16 or F16)");
  const uint64_t n = wte.numel(), block = uint64_t{1} << 18;
  std::vector<float> a(std::min(n, block)), b(a.size());
  for (uint64_t at = 0; at < n; at += block) {
    const uint64_t k = std::min(block, n - at);
    SHARDGPT_RETURN_IF_ERROR(st.ReadFloats(head, at, k, a.data()));
    SHARDGPT_RETURN_IF_ERROR(st.ReadFloats(wte, at, k, b.data()));
    for (uint64_t i = 0; i < k; i++)
      if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
        return Status::InvalidArgument(what + " differs from \"" + wte.name + "\" at element " + std::to_string(at + i) +
                                       ": an untied LM head, which shardgpt cannot import (its head is tied to wte)");
  }
  return Status::OK();
}

}  // namespace

StatusOr<GPTConfig> ParseHfGpt2Config(const std::string& what, const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(what + ": not a JSON object (expected a Hugging Face GPT-2 config.json)");
  if (const nlohmann::json* mt = JsonMember(j, "model_type"); mt && *mt != "gpt2")
    return Status::InvalidArgument(what + ": model_type is " + JsonBrief(*mt) + " (expected \"gpt2\")");
  GPTConfig c;
  SHARDGPT_RETURN_IF_ERROR(JsonPositiveInt(what, j, "n_layer", &c.n_layer));
  SHARDGPT_RETURN_IF_ERROR(JsonPositiveInt(what, j, "n_head", &c.n_head));
  SHARDGPT_RETURN_IF_ERROR(JsonPositiveInt(what, j, "n_embd", &c.n_embd));
  SHARDGPT_RETURN_IF_ERROR(JsonPositiveInt(what, j, "n_positions", &c.max_seq_len));
  SHARDGPT_RETURN_IF_ERROR(JsonPositiveInt(what, j, "vocab_size", &c.vocab_size));
  {
    Status v = c.Validate();
    if (!v.ok()) return Status::InvalidArgument(what + ": " + v.message());
  }
  // What our kernels compute: the tanh GELU, LayerNorm eps 1e-5, MLP width 4C, attention scaled
  // by 1/sqrt(head size) only, no cross-attention, no pruned heads, the LM head tied to wte.
  // Each other value is refused by name (docs/HUGGINGFACE.md lists them).
  if (const nlohmann::json* act = JsonMember(j, "activation_function");
      act && *act != "gelu_new" && *act != "gelu_pytorch_tanh")
    return Status::InvalidArgument(what + ": activation_function " + JsonBrief(*act) +
                                   " is not supported (expected \"gelu_new\", the tanh GELU)");
  if (const nlohmann::json* eps = JsonMember(j, "layer_norm_epsilon");
      eps && (!eps->is_number() || std::fabs(eps->get<double>() - 1e-5) > 1e-12))
    return Status::InvalidArgument(what + ": layer_norm_epsilon " + JsonBrief(*eps) + " is not supported (expected 1e-05)");
  if (const nlohmann::json* inner = JsonMember(j, "n_inner");
      inner && !inner->is_null() && !(inner->is_number_integer() && inner->get<int64_t>() == 4 * int64_t{c.n_embd}))
    return Status::InvalidArgument(what + ": n_inner " + JsonBrief(*inner) + " is not supported (expected null or 4 x n_embd = " +
                                   std::to_string(4 * c.n_embd) + ")");
  SHARDGPT_RETURN_IF_ERROR(FixedBool(what, j, "tie_word_embeddings", true, "the LM head is tied to wte"));
  SHARDGPT_RETURN_IF_ERROR(FixedBool(what, j, "scale_attn_weights", true, "attention scores are scaled by 1/sqrt(head size)"));
  SHARDGPT_RETURN_IF_ERROR(FixedBool(what, j, "scale_attn_by_inverse_layer_idx", false,
                                     "attention scores are not scaled by layer"));
  SHARDGPT_RETURN_IF_ERROR(FixedBool(what, j, "reorder_and_upcast_attn", false,
                                     "attention is computed in the model's own order and precision"));
  SHARDGPT_RETURN_IF_ERROR(FixedBool(what, j, "add_cross_attention", false, "GPT-2 blocks have no cross-attention"));
  SHARDGPT_RETURN_IF_ERROR(FixedBool(what, j, "is_encoder_decoder", false, "a decoder-only model"));
  if (const nlohmann::json* pruned = JsonMember(j, "pruned_heads");
      pruned && !pruned->is_null() && !(pruned->is_object() && pruned->empty()))
    return Status::InvalidArgument(what + ": pruned_heads " + JsonBrief(*pruned) + " is not supported (expected {}: every head present)");
  // read by the trainer only as the model's shape: dropout is not applied (docs/HUGGINGFACE.md)
  for (const char* p : {"resid_pdrop", "embd_pdrop", "attn_pdrop"})
    if (const nlohmann::json* v = JsonMember(j, p); v && !(v->is_number() && v->get<double>() >= 0 && v->get<double>() < 1))
      return Status::InvalidArgument(what + ": " + p + " is " + JsonBrief(*v) + " (expected a probability in [0, 1))");
  return c;
}

bool IsHfGpt2Path(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return fs::exists(fs::path(path) / "config.json", ec);
  const std::string ext = ".safetensors";
  return path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
}

Status WriteHfGpt2(const std::string& dir, const ParamLayout& layout, const float* params, bool bf16) {
  const GPTConfig& c = layout.config();
  if (c.llama())
    return Status::Unimplemented(dir + ": Hugging Face export writes GPT2LMHeadModel directories only; an --arch "
                                       "llama model is not exported yet");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IOError(dir + ": cannot create directory (" + ec.message() + ")");
  std::vector<SafetensorsTensor> tensors;
  for (const TensorInfo& t : layout.tensors()) {
    const float* src = params + layout.units()[t.unit].offset + t.offset;
    SafetensorsTensor out{"transformer." + t.name, HfShape(t, c), {}};
    if (t.name == "wte.weight") {
      out.values.assign(src, src + static_cast<size_t>(c.vocab_size) * c.n_embd);  // drop the padded rows
    } else if (IsConv1D(t.name)) {  // ours [out, in] -> Conv1D [in, out]
      const int64_t rows = t.shape[0], cols = t.shape[1];
      out.values.resize(t.numel);
      for (int64_t o = 0; o < rows; o++)
        for (int64_t i = 0; i < cols; i++) out.values[i * rows + o] = src[o * cols + i];
    } else {
      out.values.assign(src, src + t.numel);
    }
    tensors.push_back(std::move(out));
  }
  SHARDGPT_RETURN_IF_ERROR(
      WriteSafetensors((fs::path(dir) / "model.safetensors").string(), tensors, bf16, {{"format", "pt"}}));
  nlohmann::ordered_json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = c.vocab_size;
  j["n_positions"] = c.max_seq_len;
  j["n_ctx"] = c.max_seq_len;
  j["n_embd"] = c.n_embd;
  j["n_layer"] = c.n_layer;
  j["n_head"] = c.n_head;
  j["n_inner"] = nullptr;  // 4 x n_embd
  j["activation_function"] = "gelu_new";
  j["layer_norm_epsilon"] = 1e-5;
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["initializer_range"] = 0.02;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  j["add_cross_attention"] = false;
  j["tie_word_embeddings"] = true;
  if (c.vocab_size > 50256) j["bos_token_id"] = 50256, j["eos_token_id"] = 50256;  // GPT-2's <|endoftext|>
  j["torch_dtype"] = bf16 ? "bfloat16" : "float32";
  return WriteTextFileAtomic((fs::path(dir) / "config.json").string(), j.dump(2) + "\n");
}

StatusOr<std::unique_ptr<HfGpt2Reader>> HfGpt2Reader::Open(const std::string& path) {
  std::error_code ec;
  const bool is_dir = fs::is_directory(path, ec);
  const fs::path dir = is_dir ? fs::path(path) : fs::path(path).parent_path();
  const std::string st_path = is_dir ? (dir / "model.safetensors").string() : path;
  const std::string cfg_path = (dir.empty() ? fs::path("config.json") : dir / "config.json").string();
  std::ifstream f(cfg_path);
  if (!f) return Status::NotFound(cfg_path + ": cannot open (expected a Hugging Face GPT-2 config.json beside " + st_path + ")");
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return Status::IOError(cfg_path + ": read failed (expected a Hugging Face GPT-2 config.json)");
  auto cfg = ParseHfGpt2Config(cfg_path, ss.str());
  if (!cfg.ok()) return cfg.status();
  std::unique_ptr<HfGpt2Reader> r(new HfGpt2Reader());
  GPTConfig& c = r->config_;
  c = cfg.value();

  auto st = SafetensorsReader::Open(st_path);
  if (!st.ok()) return st.status();
  r->st_ = std::move(st.value());
  r->layout_ = std::make_unique<ParamLayout>(c);
  const std::string prefix = r->st_->Find("transformer.wte.weight") ? "transformer." : "";
  std::vector<bool> used(r->st_->entries().size(), false);
  auto index_of = [&](const SafetensorsEntry* e) { return static_cast<size_t>(e - r->st_->entries().data()); };
  for (const TensorInfo& t : r->layout_->tensors()) {
    const std::string name = prefix + t.name;
    const SafetensorsEntry* e = r->st_->Find(name);
    if (!e) return Status::InvalidArgument(st_path + ": missing tensor \"" + name + "\" (config.json describes " + c.ToString() + ")");
    const std::vector<int64_t> want = HfShape(t, c);
    if (e->shape != want)
      return Status::InvalidArgument(st_path + ": tensor \"" + name + "\" has shape " + ShapeStr(e->shape) + ", config.json (" +
                                     c.ToString() + ") implies " + ShapeStr(want));
    if (e->dtype != "F32" && e->dtype != "BF16" && e->dtype != "F16")
      return Status::InvalidArgument(st_path + ": tensor \"" + name + "\" has dtype " + e->dtype + " (expected F32, BF16 or F16)");
    used[index_of(e)] = true;
    r->sources_.push_back(Source{e, IsConv1D(t.name)});
  }
  for (size_t i = 0; i < used.size(); i++) {
    if (used[i]) continue;
    const std::string& n = r->st_->entries()[i].name;
    auto ends_with = [&](const char* suffix) {
      const size_t k = std::strlen(suffix);
      return n.size() > k && n.compare(n.size() - k, k, suffix) == 0;
    };
    if (ends_with(".attn.bias") || ends_with(".attn.masked_bias")) continue;  // causal-mask buffers
    if (n == "lm_head.weight") {  // the LM head: ours is tied to wte, so it must be wte
      SHARDGPT_RETURN_IF_ERROR(CheckTiedHead(*r->st_, r->st_->entries()[i], *r->st_->Find(prefix + "wte.weight")));
      continue;
    }
    return Status::InvalidArgument(st_path + ": unexpected tensor " + Quoted(n) + " (not part of a GPT-2 " + c.ToString() + ")");
  }
  return r;
}

Status HfGpt2Reader::ReadRange(uint64_t begin, uint64_t end, float* dst) {
  const ParamLayout& L = *layout_;
  for (size_t k = 0; k < L.tensors().size(); k++) {
    const TensorInfo& t = L.tensors()[k];
    const uint64_t g = L.units()[t.unit].offset + t.offset;
    const uint64_t lo = std::max(begin, g), hi = std::min(end, g + t.numel);
    if (lo >= hi) continue;
    const Source& s = sources_[k];
    float* out = dst + (lo - begin);
    if (s.transposed) {  // one of our rows is a column of HF's [in, out]: read the tensor whole
      if (cached_ != s.entry) {
        cache_.resize(s.entry->numel());
        SHARDGPT_RETURN_IF_ERROR(st_->ReadFloats(*s.entry, 0, cache_.size(), cache_.data()));
        cached_ = s.entry;
      }
      const uint64_t in = static_cast<uint64_t>(t.shape[1]), rows = static_cast<uint64_t>(t.shape[0]);
      for (uint64_t a = lo; a < hi; a++) {
        const uint64_t idx = a - g, o = idx / in, i = idx % in;
        out[a - lo] = cache_[i * rows + o];
      }
    } else {
      const uint64_t real = s.entry->numel();  // wte: V rows; the padded rows after them are zero
      const uint64_t rlo = std::min(lo - g, real), rhi = std::min(hi - g, real);
      if (rhi > rlo) SHARDGPT_RETURN_IF_ERROR(st_->ReadFloats(*s.entry, rlo, rhi - rlo, out));
      std::fill(out + (rhi - rlo), out + (hi - lo), 0.0f);
    }
    for (uint64_t a = 0; a < hi - lo; a++)
      if (!std::isfinite(out[a]))
        return Status::Corruption(st_->path() + ": tensor \"" + s.entry->name + "\" element " +
                                  std::to_string(lo - g + a) + " is " + (std::isnan(out[a]) ? "NaN" : "infinite") +
                                  " (expected finite weights)");
  }
  return Status::OK();
}

}  // namespace shardgpt
