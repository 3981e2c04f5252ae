// Bf16SourceNotes: which fp32 buffers are known to hold exactly the widening of bf16 values
// stored elsewhere (the fp32 compute copies of bf16 parameters, Kernels::note_bf16_source), so a
// matmul can read the bf16 values themselves instead of converting the floats back. Shared by
// the CPU kernels (Bf16WeightCache) and the CUDA kernels.
//
// Notes are taken only while open (the kernels' weight-reuse window) and dropped when it opens
// or closes again. Forget(p, bytes), called by the device's Free, drops every note touching the
// freed memory on either side, so a freed and reallocated buffer holding other weights at the
// same address is never read through a stale note. Thread-safe: Free may run on another thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace shardgpt {

class Bf16SourceNotes {
 public:
  // Drops every note; notes are taken from now on only if `open`.
  void Reset(bool open) {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = open;
    notes_.clear();
  }
  // widened[0, n) holds exactly the bf16 values bf16[0, n).
  void Note(const float* widened, const uint16_t* bf16, size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_ && n > 0) notes_.push_back({widened, bf16, n});
  }
  // The bf16 values of w[0, n) when a note covers all of it, else null.
  const uint16_t* Find(const float* w, size_t n) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Note_& s : notes_)
      if (w >= s.widened && w + n <= s.widened + s.n) return s.bf16 + (w - s.widened);
    return nullptr;
  }
  void Forget(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    notes_.erase(std::remove_if(notes_.begin(), notes_.end(),
                                [&](const Note_& s) {
                                  return Overlaps(s.widened, s.n * sizeof(float), p, bytes) ||
                                         Overlaps(s.bf16, s.n * sizeof(uint16_t), p, bytes);
                                }),
                 notes_.end());
  }
  // Whether [a, a + an) and [b, b + bn) share a byte.
  static bool Overlaps(const void* a, size_t an, const void* b, size_t bn) {
    const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
    return x < y + bn && y < x + an;
  }

 private:
  struct Note_ {
    const float* widened;
    const uint16_t* bf16;
    size_t n;
  };
  mutable std::mutex mu_;
  bool open_ = false;
  std::vector<Note_> notes_;
};

}  // namespace shardgpt
