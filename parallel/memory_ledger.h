// MemoryLedger and TrackedBuffer: the real model-state allocations of one rank, by kind.
//
// Every parameter, gradient and optimizer-state buffer of the engine is a TrackedBuffer, so
// the figures printed beside the seed's formulas are the allocations themselves (current and
// peak), never the formula. Not thread-safe: used by the training thread only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <utility>

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

// A zero-initialised byte buffer whose size is counted in a MemoryLedger while it lives.
// Move-only. The ledger must outlive the buffer.
class TrackedBuffer {
 public:
  TrackedBuffer() = default;
  TrackedBuffer(MemoryLedger* ledger, MemKind kind, size_t bytes) : ledger_(ledger), kind_(kind), bytes_(bytes) {
    data_ = bytes ? std::calloc(bytes, 1) : nullptr;
    if (ledger_) ledger_->Add(kind_, bytes_);
  }
  ~TrackedBuffer() { Free(); }
  TrackedBuffer(TrackedBuffer&& o) noexcept { *this = std::move(o); }
  TrackedBuffer& operator=(TrackedBuffer&& o) noexcept {
    if (this != &o) {
      Free();
      std::swap(ledger_, o.ledger_), std::swap(kind_, o.kind_), std::swap(bytes_, o.bytes_), std::swap(data_, o.data_);
    }
    return *this;
  }
  TrackedBuffer(const TrackedBuffer&) = delete;
  TrackedBuffer& operator=(const TrackedBuffer&) = delete;

  void Free() {
    if (data_ == nullptr && bytes_ == 0) return;
    std::free(data_);
    if (ledger_) ledger_->Sub(kind_, bytes_);
    data_ = nullptr, bytes_ = 0;
  }
  bool empty() const { return data_ == nullptr; }
  size_t bytes() const { return bytes_; }
  void* data() { return data_; }
  template <typename T>
  T* as() { return static_cast<T*>(data_); }

 private:
  MemoryLedger* ledger_ = nullptr;
  MemKind kind_ = MemKind::kParams;
  size_t bytes_ = 0;
  void* data_ = nullptr;
};

}  // namespace shardgpt
