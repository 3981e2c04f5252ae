// MonotonicSeconds: seconds on the steady clock, for durations (never for dates).
#pragma once

#include <chrono>

namespace shardgpt {

// Seconds since the steady clock's epoch: only differences of two readings mean anything.
inline double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace shardgpt
