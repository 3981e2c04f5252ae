// Reproducible random inputs for kernel tests and benchmarks (std::mt19937, so the same seed
// gives the same data on every machine and compiler).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace shardgpt {

// n floats uniform in [lo, hi).
inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// n token ids uniform in [0, V).
inline std::vector<int32_t> RandomTokens(size_t n, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace shardgpt
