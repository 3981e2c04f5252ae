#include "io/file_checks.h"

namespace shardgpt {

Status CheckFileConfig(const GPTConfig& c, const std::string& where) {
  auto bad = [&](const char* field, int v, const std::string& expected) {
    return Status::Corruption(where + " " + field + " " + std::to_string(v) + " (expected " + expected + ")");
  };
  if (c.n_layer < 1) return bad("n_layer", c.n_layer, ">= 1");
  if (c.n_head < 1) return bad("n_head", c.n_head, ">= 1");
  if (c.n_embd < 1) return bad("n_embd", c.n_embd, ">= 1");
  if (c.n_embd % c.n_head != 0)
    return bad("n_embd", c.n_embd, "a multiple of n_head " + std::to_string(c.n_head));
  if (c.max_seq_len < 1) return bad("max_seq_len", c.max_seq_len, ">= 1");
  if (c.vocab_size < 2 || c.vocab_size > 2000000) return bad("vocab_size", c.vocab_size, "2 to 2000000");
  if (c.llama()) {  // the llama fields as the flags would have them
    Status v = c.Validate();
    if (!v.ok()) return Status::Corruption(where + " " + v.message());
  }
  return Status::OK();
}

bool FileParamCount(const GPTConfig& c, uint64_t* count) {
  if (!CheckFileConfig(c, "").ok()) return false;
  // The sum ParamLayout builds (model/param_layout.cc), in 128-bit integers:
  //   embed  Vp*C + maxT*C;  each block 12*C^2 + 13*C;  final 2*C.
  // Every factor is below 2^31, so no term can overflow 128 bits.
  const unsigned __int128 C = static_cast<unsigned>(c.n_embd), L = static_cast<unsigned>(c.n_layer);
  const unsigned __int128 Vp = static_cast<unsigned>(c.padded_vocab()), T = static_cast<unsigned>(c.max_seq_len);
  // llama: embed Vp*C; each block C*W + C^2 + 3*C*F + 2*C; final C (+ Vp*C untied).
  // W and F are read only for llama, whose widths Validate bounds so that they fit an int.
  const unsigned __int128 W = c.llama() ? static_cast<unsigned>(c.qkv_width()) : 0;
  const unsigned __int128 F = c.llama() ? static_cast<unsigned>(c.ffn()) : 0;
  const unsigned __int128 n = c.llama() ? Vp * C + L * (C * W + C * C + 3 * C * F + 2 * C) + C +
                                              (c.tie_embeddings ? 0 : Vp * C)
                                        : Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
  if (n > kMaxFileParams) return false;
  *count = static_cast<uint64_t>(n);
  return true;
}

}  // namespace shardgpt
