// ParamLayout: the single table of every parameter tensor of a GPT model.
//
// Each tensor has a name, a shape, a unit and an offset in its unit's flat buffer. Units are
// the granularity of sharding and of the engine's hooks (like FSDP's FlatParameter):
//   gpt2:  unit 0      "embed"  wte [Vp, C] (also the tied LM head), wpe [maxT, C]
//          unit 1 .. L "h.<l>"  one transformer block (12 tensors)
//          unit L+1    "final"  ln_f weight and bias
//   llama: unit 0      "embed"  embed_tokens [Vp, C] (the LM head too when tied)
//          unit 1 .. L "h.<l>"  input_layernorm [C], q_proj [NH hs, C], k_proj, v_proj [KV hs, C],
//                               o_proj [C, NH hs], post_attention_layernorm [C], gate_proj,
//                               up_proj [F, C], down_proj [C, F] (Hugging Face's names, "model."
//                               dropped); q|k|v and gate|up are adjacent, so each pair or triple
//                               is one [rows, C] matrix to a matmul and separate matrices to Muon
//          unit L+1    "final"  norm [C], then lm_head [Vp, C] when untied
// Units are laid out one after another in one global flat buffer (global offset = unit
// offset + tensor offset). Parameters, gradients, AdamW moments, ZeRO shards, checkpoints,
// export and the memory ledger all derive from this table; nobody computes offsets by hand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace shardgpt {

struct TensorInfo {
  std::string name;            // e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // row-major; Linear weights are [out, in] as in torch.nn.Linear
  int unit = 0;
  size_t offset = 0;  // element offset inside the unit's flat buffer
  size_t numel = 0;
  bool decay = false;  // AdamW weight decay applies (2-D weights and embeddings only)
};

struct UnitInfo {
  std::string name;     // "embed", "h.<l>", "final"
  size_t offset = 0;    // element offset of the unit in the global flat buffer
  size_t numel = 0;
  int first_tensor = 0;  // tensors [first_tensor, first_tensor + num_tensors) belong to this unit
  int num_tensors = 0;
};

// A half-open element range [begin, end) of one unit's flat buffer with one decay setting.
struct DecayRange {
  size_t begin = 0, end = 0;
  bool decay = false;
};

// Offsets of the 12 tensors of a gpt2 block inside the block's unit (filled by ParamLayout).
struct BlockOffsets {
  size_t ln1_w, ln1_b, qkv_w, qkv_b, attproj_w, attproj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
};

// Offsets of a llama block's tensors inside its unit: qkv_w is q_proj's (k_proj and v_proj
// follow it), gate_up_w gate_proj's (up_proj follows it).
struct LlamaBlockOffsets {
  size_t attn_norm_w, qkv_w, o_w, mlp_norm_w, gate_up_w, down_w;
};

class ParamLayout {
 public:
  explicit ParamLayout(const GPTConfig& config);

  const GPTConfig& config() const { return config_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::vector<UnitInfo>& units() const { return units_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  size_t total_numel() const { return total_numel_; }

  static constexpr int kEmbedUnit = 0;
  int block_unit(int layer) const { return 1 + layer; }
  int final_unit() const { return config_.n_layer + 1; }

  // Offsets inside unit "embed": wte at 0, wpe after it (gpt2); inside "final": ln_f.weight,
  // ln_f.bias (gpt2) or norm.weight, lm_head.weight (llama, head_offset(); untied only).
  size_t wte_offset() const { return 0; }
  size_t wpe_offset() const { return static_cast<size_t>(config_.padded_vocab()) * config_.n_embd; }
  size_t head_offset() const { return static_cast<size_t>(config_.n_embd); }
  const BlockOffsets& block() const { return block_; }
  const LlamaBlockOffsets& llama_block() const { return llama_block_; }

  // Index of the tensor with this name, or -1.
  int Find(const std::string& name) const;
  // Splits [begin, end) of unit u into runs of equal decay setting (for sharded AdamW).
  std::vector<DecayRange> DecayRanges(int unit, size_t begin, size_t end) const;

 private:
  GPTConfig config_;
  std::vector<TensorInfo> tensors_;
  std::vector<UnitInfo> units_;
  BlockOffsets block_{};
  LlamaBlockOffsets llama_block_{};
  size_t total_numel_ = 0;
};

// GPT-2 initialisation into a global flat buffer: weights N(0, 0.02), residual projections
// (attn.c_proj, mlp.c_proj; llama: o_proj, down_proj) N(0, 0.02/sqrt(2L)), biases 0, LayerNorm
// and RMSNorm weights 1 / biases 0, padded vocabulary rows of wte (and of an untied head) 0. Deterministic for a seed (own RNG, not std::).
void InitParameters(const ParamLayout& layout, uint64_t seed, float* params);
// The same values for elements [begin, end) of unit `unit` only, into out[end - begin]: what a
// rank that owns that slice needs, without building the whole model (bitwise equal to the
// matching slice of InitParameters).
void InitParameterRange(const ParamLayout& layout, uint64_t seed, int unit, size_t begin, size_t end, float* out);

}  // namespace shardgpt
