// Sampling the next token from logits: temperature and top-k, with the project's Rng.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/gpt.h"
#include "model/rng.h"

namespace shardgpt {

// logits[V] (real vocabulary only). temperature <= 0 picks the argmax; top_k <= 0 keeps all.
int SampleToken(const float* logits, int V, float temperature, int top_k, Rng& rng);

struct SamplingOptions {
  int tokens = 200;
  float temperature = 1.0f;
  int top_k = 40;
};

// Extends context by options.tokens sampled tokens, calling on_token(id) for each. The model
// (allocated for B=1 and T = its max_seq_len) sees at most the last max_seq_len tokens.
void Generate(GPT& model, UnitHooks& params, std::vector<int32_t>& context, const SamplingOptions& options, Rng& rng,
              const std::function<void(int)>& on_token);

}  // namespace shardgpt
