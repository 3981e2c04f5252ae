#include "io/hf_gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

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

Status WriteTextAtomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      return Status::IOError(tmp + ": write failed: " + std::strerror(errno));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Status::IOError(path + ": cannot rename into place: " + std::strerror(errno));
  }
  return Status::OK();
}

// An integer field of config.json, required and positive.
Status IntField(const std::string& what, const nlohmann::json& j, const char* key, int* out) {
  if (!j.contains(key)) return Status::InvalidArgument(what + ": missing \"" + key + "\"");
  const auto& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 30))
    return Status::InvalidArgument(what + ": \"" + key + "\" is " + v.dump() + " (expected a positive integer)");
  *out = v.get<int>();
  return Status::OK();
}

}  // namespace

bool IsHfGpt2Path(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return fs::exists(fs::path(path) / "config.json", ec);
  const std::string ext = ".safetensors";
  return path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
}

Status WriteHfGpt2(const std::string& dir, const ParamLayout& layout, const float* params, bool bf16) {
  const GPTConfig& c = layout.config();
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
  j["tie_word_embeddings"] = true;
  if (c.vocab_size > 50256) j["bos_token_id"] = 50256, j["eos_token_id"] = 50256;  // GPT-2's <|endoftext|>
  j["torch_dtype"] = bf16 ? "bfloat16" : "float32";
  return WriteTextAtomic((fs::path(dir) / "config.json").string(), j.dump(2) + "\n");
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
  const nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(cfg_path + ": not a JSON object");
  if (j.contains("model_type") && j["model_type"] != "gpt2")
    return Status::InvalidArgument(cfg_path + ": model_type " + j["model_type"].dump() + " (expected \"gpt2\")");
  std::unique_ptr<HfGpt2Reader> r(new HfGpt2Reader());
  GPTConfig& c = r->config_;
  SHARDGPT_RETURN_IF_ERROR(IntField(cfg_path, j, "n_layer", &c.n_layer));
  SHARDGPT_RETURN_IF_ERROR(IntField(cfg_path, j, "n_head", &c.n_head));
  SHARDGPT_RETURN_IF_ERROR(IntField(cfg_path, j, "n_embd", &c.n_embd));
  SHARDGPT_RETURN_IF_ERROR(IntField(cfg_path, j, "n_positions", &c.max_seq_len));
  SHARDGPT_RETURN_IF_ERROR(IntField(cfg_path, j, "vocab_size", &c.vocab_size));
  {
    Status v = c.Validate();
    if (!v.ok()) return Status::InvalidArgument(cfg_path + ": " + v.message());
  }
  // What our kernels compute: the tanh GELU, LayerNorm eps 1e-5, MLP width 4C, tied head.
  const std::string act = j.value("activation_function", std::string("gelu_new"));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    return Status::InvalidArgument(cfg_path + ": activation_function " + Quoted(act) + " (expected gelu_new, the tanh GELU)");
  if (j.contains("layer_norm_epsilon") &&
      (!j["layer_norm_epsilon"].is_number() || std::fabs(j["layer_norm_epsilon"].get<double>() - 1e-5) > 1e-12))
    return Status::InvalidArgument(cfg_path + ": layer_norm_epsilon " + j["layer_norm_epsilon"].dump() + " (expected 1e-05)");
  if (j.contains("n_inner") && !j["n_inner"].is_null() && j["n_inner"] != 4 * c.n_embd)
    return Status::InvalidArgument(cfg_path + ": n_inner " + j["n_inner"].dump() + " (expected null or 4 x n_embd = " +
                                   std::to_string(4 * c.n_embd) + ")");
  if (j.value("tie_word_embeddings", true) != true)
    return Status::InvalidArgument(cfg_path + ": tie_word_embeddings is false (expected the LM head tied to wte)");
  if (j.value("scale_attn_by_inverse_layer_idx", false) != false)
    return Status::InvalidArgument(cfg_path + ": scale_attn_by_inverse_layer_idx is true (not supported)");

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
    const bool mask = n.size() > 9 && (n.compare(n.size() - 9, 9, "attn.bias") == 0 ||
                                       (n.size() > 16 && n.compare(n.size() - 16, 16, "attn.masked_bias") == 0));
    if (n == "lm_head.weight" || mask) continue;  // tied to wte / causal-mask buffers: nothing to load
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
