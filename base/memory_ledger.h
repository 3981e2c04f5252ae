// MemoryLedger: the real model-state allocations of one rank, by kind.
//
// Every parameter, gradient and optimizer-state buffer of the engine is a DeviceBuffer
// (model/device.h) counted here, so
// the figures printed beside the seed's formulas are the allocations themselves (current and
// peak), never the formula. Not thread-safe: used by the training thread only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace shardgpt {

enum class MemKind { kParams, kGrads, kOptimizer, kCount };
inline const char* MemKindName(MemKind k) {
  return k == MemKind::kParams ? "params" : k == MemKind::kGrads ? "grads" : "optimizer";
}

class MemoryLedger {
 public:
  void Add(MemKind k, size_t bytes) {
    auto i = static_cast<size_t>(k);
    current_[i] += bytes;
    if (current_[i] > peak_[i]) peak_[i] = current_[i];
    if (Total() > peak_total_) peak_total_ = Total();
  }
  void Sub(MemKind k, size_t bytes) { current_[static_cast<size_t>(k)] -= bytes; }
  uint64_t current(MemKind k) const { return current_[static_cast<size_t>(k)]; }
  uint64_t peak(MemKind k) const { return peak_[static_cast<size_t>(k)]; }
  uint64_t Total() const { return current_[0] + current_[1] + current_[2]; }
  uint64_t PeakTotal() const { return peak_total_; }
  // Starts a new peak measurement from the current values.
  void ResetPeaks() {
    peak_ = current_;
    peak_total_ = Total();
  }

 private:
  std::array<uint64_t, 3> current_{}, peak_{};
  uint64_t peak_total_ = 0;
};

}  // namespace shardgpt
