// The CUDA emulation's cuda_bf16.h: __nv_bfloat16 as raw bits and the conversions the .cu files
// use, with CUDA's documented rounding (round to nearest even; NaN -> canonical NaN 0x7fff, as
// cvt.rn.bf16.f32 returns).
#pragma once

#include <cstdint>
#include <cstring>

#include "cuda_runtime.h"

struct __nv_bfloat16 {
  uint16_t __x;
};
typedef __nv_bfloat16 nv_bfloat16;
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{0x7fff};
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even; overflows to inf
  return __nv_bfloat16{static_cast<uint16_t>(u >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 b) {
  const uint32_t u = uint32_t{b.__x} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16{u}; }
