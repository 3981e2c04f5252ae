// Sampling the next token from logits: temperature and top-k, with the project's Rng.
#pragma once

#include "model/rng.h"

namespace shardgpt {

// logits[V] (real vocabulary only). temperature <= 0 picks the argmax; top_k <= 0 keeps all.
int SampleToken(const float* logits, int V, float temperature, int top_k, Rng& rng);

}  // namespace shardgpt
