#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace shardgpt {

int SampleToken(const float* logits, int V, float temperature, int top_k, Rng& rng) {
  if (temperature <= 0) return static_cast<int>(std::max_element(logits, logits + V) - logits);
  std::vector<int> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  int k = (top_k > 0 && top_k < V) ? top_k : V;
  // ties broken by id so the choice is deterministic
  auto higher = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), higher);
  std::vector<double> p(k);
  double sum = 0;
  for (int i = 0; i < k; i++) sum += p[i] = std::exp((logits[ids[i]] - logits[ids[0]]) / temperature);
  double r = rng.Uniform() * sum;
  for (int i = 0; i < k; i++) {
    r -= p[i];
    if (r <= 0) return ids[i];
  }
  return ids[k - 1];
}

void Generate(GPT& model, UnitHooks& params, std::vector<int32_t>& context, const SamplingOptions& o, Rng& rng,
              const std::function<void(int)>& on_token) {
  const GPTConfig& c = model.config();
  for (int i = 0; i < o.tokens; i++) {
    const int T = std::min(static_cast<int>(context.size()), c.max_seq_len);
    model.Forward(params, context.data() + context.size() - T, nullptr, 1, T, 0.0f);
    const std::vector<float> logits = model.LogitsRow(T - 1);
    const int next = SampleToken(logits.data(), c.vocab_size, o.temperature, o.top_k, rng);
    context.push_back(next);
    on_token(next);
  }
}

}  // namespace shardgpt
