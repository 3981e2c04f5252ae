#include "model/param_layout.h"

#include <algorithm>
#include <cmath>

#include "model/rng.h"

namespace shardgpt {

ParamLayout::ParamLayout(const GPTConfig& config) : config_(config) {
  const int64_t C = config.n_embd, Vp = config.padded_vocab(), maxT = config.max_seq_len;
  size_t unit_offset = 0;
  auto begin_unit = [&](const std::string& name) {
    units_.push_back(UnitInfo{name, unit_offset, 0, static_cast<int>(tensors_.size()), 0});
  };
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool decay) {
    UnitInfo& u = units_.back();
    size_t numel = 1;
    for (int64_t d : shape) numel *= static_cast<size_t>(d);
    tensors_.push_back(TensorInfo{name, std::move(shape), static_cast<int>(units_.size()) - 1, u.numel, numel, decay});
    u.numel += numel;
    u.num_tensors++;
    return tensors_.back().offset;
  };
  auto end_unit = [&]() { unit_offset += units_.back().numel; };

  if (config.llama()) {
    const int64_t hs = config.head_size(), NH = config.n_head, KV = config.kv_heads(), F = config.ffn();
    begin_unit("embed");
    add("embed_tokens.weight", {Vp, C}, true);
    end_unit();
    for (int l = 0; l < config.n_layer; l++) {
      const std::string p = "layers." + std::to_string(l) + ".";
      begin_unit("h." + std::to_string(l));
      LlamaBlockOffsets b;
      b.attn_norm_w = add(p + "input_layernorm.weight", {C}, false);
      b.qkv_w = add(p + "self_attn.q_proj.weight", {NH * hs, C}, true);
      add(p + "self_attn.k_proj.weight", {KV * hs, C}, true);
      add(p + "self_attn.v_proj.weight", {KV * hs, C}, true);
      b.o_w = add(p + "self_attn.o_proj.weight", {C, NH * hs}, true);
      b.mlp_norm_w = add(p + "post_attention_layernorm.weight", {C}, false);
      b.gate_up_w = add(p + "mlp.gate_proj.weight", {F, C}, true);
      add(p + "mlp.up_proj.weight", {F, C}, true);
      b.down_w = add(p + "mlp.down_proj.weight", {C, F}, true);
      llama_block_ = b;  // identical for every block
      end_unit();
    }
    begin_unit("final");
    add("norm.weight", {C}, false);
    if (!config.tie_embeddings) add("lm_head.weight", {Vp, C}, true);
    end_unit();
    total_numel_ = unit_offset;
    return;
  }
  begin_unit("embed");
  add("wte.weight", {Vp, C}, true);
  add("wpe.weight", {maxT, C}, true);
  end_unit();
  for (int l = 0; l < config.n_layer; l++) {
    const std::string p = "h." + std::to_string(l) + ".";
    begin_unit("h." + std::to_string(l));
    BlockOffsets b;
    b.ln1_w = add(p + "ln_1.weight", {C}, false);
    b.ln1_b = add(p + "ln_1.bias", {C}, false);
    b.qkv_w = add(p + "attn.c_attn.weight", {3 * C, C}, true);
    b.qkv_b = add(p + "attn.c_attn.bias", {3 * C}, false);
    b.attproj_w = add(p + "attn.c_proj.weight", {C, C}, true);
    b.attproj_b = add(p + "attn.c_proj.bias", {C}, false);
    b.ln2_w = add(p + "ln_2.weight", {C}, false);
    b.ln2_b = add(p + "ln_2.bias", {C}, false);
    b.fc_w = add(p + "mlp.c_fc.weight", {4 * C, C}, true);
    b.fc_b = add(p + "mlp.c_fc.bias", {4 * C}, false);
    b.fcproj_w = add(p + "mlp.c_proj.weight", {C, 4 * C}, true);
    b.fcproj_b = add(p + "mlp.c_proj.bias", {C}, false);
    block_ = b;  // identical for every block
    end_unit();
  }
  begin_unit("final");
  add("ln_f.weight", {C}, false);
  add("ln_f.bias", {C}, false);
  end_unit();
  total_numel_ = unit_offset;
}

int ParamLayout::Find(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); i++)
    if (tensors_[i].name == name) return static_cast<int>(i);
  return -1;
}

std::vector<DecayRange> ParamLayout::DecayRanges(int unit, size_t begin, size_t end) const {
  std::vector<DecayRange> out;
  const UnitInfo& u = units_[unit];
  for (int i = u.first_tensor; i < u.first_tensor + u.num_tensors; i++) {
    const TensorInfo& t = tensors_[i];
    size_t b = std::max(begin, t.offset), e = std::min(end, t.offset + t.numel);
    if (b >= e) continue;
    if (!out.empty() && out.back().decay == t.decay && out.back().end == b)
      out.back().end = e;
    else
      out.push_back(DecayRange{b, e, t.decay});
  }
  return out;
}

void InitParameterRange(const ParamLayout& layout, uint64_t seed, int unit, size_t begin, size_t end, float* out) {
  const GPTConfig& cfg = layout.config();
  const float residual_std = 0.02f / std::sqrt(2.0f * cfg.n_layer);
  const UnitInfo& u = layout.units()[unit];
  for (int ti = u.first_tensor; ti < u.first_tensor + u.num_tensors; ti++) {
    const TensorInfo& t = layout.tensors()[ti];
    const size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    if (lo >= hi) continue;
    float* p = out + (lo - begin);
    const size_t first = lo - t.offset, count = hi - lo;  // element range inside the tensor
    const bool is_ln_weight = (t.name.find("ln_") != std::string::npos || t.name.find("norm") != std::string::npos) &&
                              t.name.find(".weight") != std::string::npos;
    if (t.shape.size() == 1) {
      std::fill(p, p + count, is_ln_weight ? 1.0f : 0.0f);
      continue;
    }
    const bool residual_proj = t.name.find("c_proj.weight") != std::string::npos ||
                               t.name.find("o_proj.weight") != std::string::npos ||
                               t.name.find("down_proj.weight") != std::string::npos;
    const float std = residual_proj ? residual_std : 0.02f;
    // One RNG stream per tensor, so a tensor's values do not depend on the others' sizes.
    // splitmix64 is a counter (+gamma per draw) and Normal() takes two draws per element, so
    // element i of the tensor starts 2*i draws after the stream's start: any slice of the
    // tensor is computed without the elements before it, bitwise as a full initialisation.
    Rng rng(seed, StableHash(t.name.c_str()));
    rng.set_state(rng.state() + 2 * first * 0x9E3779B97F4A7C15ull);
    for (size_t i = 0; i < count; i++) p[i] = rng.Normal() * std;
    if (t.name == "wte.weight" || t.name == "embed_tokens.weight" || t.name == "lm_head.weight") {
      // padded vocabulary rows stay zero
      const size_t real = static_cast<size_t>(cfg.vocab_size) * cfg.n_embd;
      for (size_t i = std::max(first, real); i < first + count; i++) p[i - first] = 0.0f;
    }
  }
}

void InitParameters(const ParamLayout& layout, uint64_t seed, float* params) {
  for (int u = 0; u < layout.num_units(); u++)
    InitParameterRange(layout, seed, u, 0, layout.units()[u].numel, params + layout.units()[u].offset);
}

}  // namespace shardgpt
