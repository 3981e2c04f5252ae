// bf16 <-> fp32 conversion, header-only. bf16 is the top 16 bits of an IEEE fp32 value
// (1 sign, 8 exponent, 7 mantissa bits), so widening is exact and narrowing is a rounding.
//
// Narrowing rounds to nearest, ties to even (RNE), like PyTorch's and CUDA's
// __float2bfloat16_rn. Finite values too large for bf16 round to +-inf, as IEEE RNE requires.
// NaN stays NaN (sign kept; the quiet bit is set so a payload held only in the low 16 bits
// cannot truncate to inf). Denormals are kept (no flush to zero).
//
// A bf16 value is carried as its raw bits in a uint16_t: MPI, HDF5 and the kernels all see a
// plain 2-byte integer. Not a numeric type: no arithmetic on the bits, convert first.
// Thread contract: pure functions, safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace shardgpt {

// Exact: every bf16 value is an fp32 value.
inline float Bf16ToFloat(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Round to nearest even. NaN in -> NaN out (quiet), sign kept.
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign and top payload, force quiet bit
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  // Adding 0x7fff rounds halves down; the extra lsb of the kept part turns ties to even.
  // A carry out of the mantissa bumps the exponent, which is the correct rounding (and
  // turns the largest finite values into inf).
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

// Bulk forms: dst and src hold n elements each and must not overlap.
inline void FloatToBf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToBf16(src[i]);
}
inline void Bf16ToFloat(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(src[i]);
}

// Rounds an fp32 value through bf16 and back: the value a bf16 store would keep.
inline float RoundToBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

}  // namespace shardgpt
