// Writes a small --arch llama training run for tests/torch/llama_torch.py to repeat in PyTorch:
// the config and parameter table (meta.json), the initial parameters (init.f32, the layout's flat
// buffer), the token ids of every step (tokens.i32: per step B*T inputs, then B*T targets) and
// the loss of every step (in meta.json). The run is the trainer's arithmetic on one process:
// GPT::Forward/Backward on the CPU device, then adamw_update per tensor with the layout's decay
// setting, at a constant learning rate.
//   llama_ref OUT_DIR [--tied]
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/gpt.h"
#include "model/kernels_cpu.h"
#include "model/optimizer.h"
#include "model/param_layout.h"
#include "model/rng.h"

using namespace shardgpt;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: llama_ref OUT_DIR [--tied]\n");
    return 2;
  }
  const std::string out = argv[1];
  const bool tied = argc > 2 && std::strcmp(argv[2], "--tied") == 0;
  SetComputeThreads(1);
  GPTConfig c{2, 8, 64, 16, 97};  // 8 query heads of 8, 2 kv heads; an odd vocabulary
  c.arch = Arch::kLlama, c.n_kv_head = 2, c.ffn_hidden = 96, c.tie_embeddings = tied, c.rope_theta = 500000.0f;
  const int B = 3, T = 13, steps = 5;  // an odd sequence length
  const float lr = 3e-3f;
  const AdamWConfig adamw;
  ParamLayout layout(c);
  LocalParams p(layout);
  InitParameters(layout, 1234, p.params());
  std::vector<float> init(p.params(), p.params() + layout.total_numel());
  std::vector<float> m(layout.total_numel(), 0.0f), v(layout.total_numel(), 0.0f);
  GPT model(c, B, T);
  Rng rng(99);
  std::vector<int32_t> tokens;
  nlohmann::json losses = nlohmann::json::array();
  for (int s = 1; s <= steps; s++) {
    std::vector<int32_t> x(B * T), y(B * T);
    for (int i = 0; i < B * T; i++) x[i] = static_cast<int32_t>(rng.Next() % c.vocab_size);
    for (int i = 0; i < B * T; i++) y[i] = static_cast<int32_t>((x[i] * 7 + 3) % c.vocab_size);  // learnable
    tokens.insert(tokens.end(), x.begin(), x.end());
    tokens.insert(tokens.end(), y.begin(), y.end());
    p.ZeroGrads();
    losses.push_back(model.Forward(p, x.data(), y.data(), B, T, 1.0f));
    model.Backward(p);
    for (const TensorInfo& t : layout.tensors()) {
      const size_t at = layout.units()[t.unit].offset + t.offset;
      adamw_update(p.params() + at, p.grads() + at, m.data() + at, v.data() + at, t.numel, lr,
                   t.decay ? adamw.weight_decay : 0.0f, adamw, s, 1.0f);
    }
  }
  nlohmann::json tensors = nlohmann::json::array();
  for (const TensorInfo& t : layout.tensors())
    tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"offset", layout.units()[t.unit].offset + t.offset},
                       {"decay", t.decay}});
  nlohmann::json meta = {{"n_layer", c.n_layer}, {"n_head", c.n_head}, {"n_kv_head", c.kv_heads()},
                         {"n_embd", c.n_embd}, {"ffn_hidden", c.ffn()}, {"vocab_size", c.vocab_size},
                         {"padded_vocab", c.padded_vocab()}, {"rope_theta", c.rope_theta}, {"norm_eps", c.norm_eps},
                         {"tied", tied}, {"B", B}, {"T", T}, {"steps", steps}, {"lr", lr},
                         {"beta1", adamw.beta1}, {"beta2", adamw.beta2}, {"eps", adamw.eps},
                         {"weight_decay", adamw.weight_decay}, {"tensors", tensors}, {"losses", losses}};
  std::ofstream(out + "/meta.json") << meta.dump(1);
  std::ofstream(out + "/init.f32", std::ios::binary)
      .write(reinterpret_cast<const char*>(init.data()), static_cast<std::streamsize>(init.size() * sizeof(float)));
  std::ofstream(out + "/tokens.i32", std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 4));
  std::printf("llama_ref: %s, %d steps, losses %s\n", c.ToString().c_str(), steps, losses.dump().c_str());
  return 0;
}
