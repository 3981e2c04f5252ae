// Rng: a small, portable, seedable random generator (splitmix64 + Box-Muller).
//
// std::normal_distribution differs between standard libraries; this one gives the same
// numbers everywhere, so the same seed gives the same model on every machine.
#pragma once

#include <cmath>
#include <cstdint>

namespace shardgpt {

// FNV-1a of a string: a stable stream id (std::hash differs between libraries).
inline uint64_t StableHash(const char* s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 0x100000001b3ull;
  return h;
}

class Rng {
 public:
  explicit Rng(uint64_t seed, uint64_t stream = 0) : state_(seed ^ (stream * 0xD1B54A32D192ED03ull)) { Next(); }
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 24 bits.
  float Uniform() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f); }
  // Standard normal (Box-Muller in double, one value per call).
  float Normal() {
    double u1 = (static_cast<double>(Next() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0);
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  uint64_t state() const { return state_; }
  void set_state(uint64_t s) { state_ = s; }

 private:
  uint64_t state_;
};

}  // namespace shardgpt
