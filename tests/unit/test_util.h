// Helpers shared by the kernel and model unit tests: element-wise closeness with a report of
// the first violations, bitwise equality of vectors, random token ids.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "model/rng.h"

namespace shardgpt {
namespace testutil {

// |got - want| <= atol + rtol * |want| element-wise (NaN fails); reports the first few violations.
template <typename A, typename B>
void ExpectClose(const A& got, const B& want, double rtol, double atol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double err = std::fabs((double)got[i] - (double)want[i]);
    worst = std::max(worst, err);
    if (!(err <= atol + rtol * std::fabs((double)want[i]))) {  // also catches NaN
      if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " mismatches, max abs err " << worst;
}

template <typename T>
bool BitwiseEqual(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// n token ids in [0, V), a deterministic function of seed.
inline std::vector<int32_t> RandomTokens(size_t n, int V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng.Next() % V);
  return t;
}

}  // namespace testutil
}  // namespace shardgpt
