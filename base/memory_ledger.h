// MemoryLedger: the real device allocations of one rank, by kind.
//
// Every parameter, gradient and optimizer-state buffer of the engine, the model's activations,
// the engine's communication staging (reduce-dtype conversions, bf16 gradients in flight) and
// the optimizer's workspace are DeviceBuffers (model/device.h) counted here, so the figures
// printed beside the seed's formulas and `plan`'s predicted peak are the allocations
// themselves (current and peak), never the formula. Not counted: the MPI communicator's own
// host temporaries (on its thread; at most one shard of the reduce-scatter in flight) and
// short-lived copies outside training steps (upload staging at load, checkpoint gathers).
// Not thread-safe: used by the training thread only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace shardgpt {

// The first three are the model state of the seed's formulas (persistent between steps).
enum class MemKind { kParams, kGrads, kOptimizer, kActivations, kComm, kWorkspace, kCount };
inline const char* MemKindName(MemKind k) {
  switch (k) {
    case MemKind::kParams: return "params";
    case MemKind::kGrads: return "grads";
    case MemKind::kOptimizer: return "optimizer";
    case MemKind::kActivations: return "activations";
    case MemKind::kComm: return "comm";
    default: return "workspace";
  }
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
  // Everything tracked now, and the model state (params + grads + optimizer) alone.
  uint64_t Total() const {
    uint64_t t = 0;
    for (uint64_t c : current_) t += c;
    return t;
  }
  uint64_t StateTotal() const { return current_[0] + current_[1] + current_[2]; }
  uint64_t PeakTotal() const { return peak_total_; }
  // Starts a new peak measurement from the current values.
  void ResetPeaks() {
    peak_ = current_;
    peak_total_ = Total();
  }

 private:
  static constexpr size_t kKinds = static_cast<size_t>(MemKind::kCount);
  std::array<uint64_t, kKinds> current_{}, peak_{};
  uint64_t peak_total_ = 0;
};

}  // namespace shardgpt
