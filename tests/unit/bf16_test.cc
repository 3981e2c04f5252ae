// bf16 <-> fp32: round to nearest even, exact round trip, inf/NaN/denormal handling.
#include "base/bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace shardgpt {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

bool IsBf16Nan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; }

TEST(Bf16, SimpleValues) {
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBf16(0.5f), 0x3f00);
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0x4049), 3.140625f);  // pi in bf16
  EXPECT_EQ(FloatToBf16(3.14159265f), 0x4049);
}

TEST(Bf16, RoundsToNearestTiesToEven) {
  // 1 + 2^-8 lies exactly between 0x3f80 (1.0) and 0x3f81 (1 + 2^-7): tie, to even 0x3f80.
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808000u)), 0x3f80);
  // Between 0x3f81 and 0x3f82: tie, to even 0x3f82.
  EXPECT_EQ(FloatToBf16(FromBits(0x3f818000u)), 0x3f82);
  // Just above / below a tie go to the nearer neighbour.
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(FloatToBf16(FromBits(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(FloatToBf16(FromBits(0x3f81ffffu)), 0x3f82);
  // Negative values mirror positive ones.
  EXPECT_EQ(FloatToBf16(FromBits(0xbf808000u)), 0xbf80);
  EXPECT_EQ(FloatToBf16(FromBits(0xbf818000u)), 0xbf82);
  // A carry out of the mantissa bumps the exponent: 0x3fff8000 is halfway to 0x4000 (2.0),
  // the tie goes to the even 0x4000.
  EXPECT_EQ(FloatToBf16(FromBits(0x3fff8000u)), 0x4000);
  // Decimal examples: 1.00390625 = 1 + 2^-8 (tie, down), 1.01171875 = 1 + 3*2^-8 (tie, up).
  EXPECT_EQ(FloatToBf16(1.00390625f), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.01171875f), 0x3f82);
}

TEST(Bf16, DenormalsAreRoundedNotFlushed) {
  EXPECT_EQ(FloatToBf16(FromBits(0x00010000u)), 0x0001);  // smallest bf16 denormal
  EXPECT_EQ(FloatToBf16(FromBits(0x00008000u)), 0x0000);  // tie, to even 0
  EXPECT_EQ(FloatToBf16(FromBits(0x00018000u)), 0x0002);  // tie, to even 2
  EXPECT_EQ(FloatToBf16(FromBits(0x00008001u)), 0x0001);
  EXPECT_GT(Bf16ToFloat(0x0001), 0.0f);
}

TEST(Bf16, OverflowAndInfinity) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToBf16(inf), 0x7f80);
  EXPECT_EQ(FloatToBf16(-inf), 0xff80);
  EXPECT_EQ(Bf16ToFloat(0x7f80), inf);
  EXPECT_EQ(Bf16ToFloat(0xff80), -inf);
  // FLT_MAX is above the largest bf16 (0x7f7f) by more than half an ulp: rounds to inf.
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::max()), 0xff80);
  // Just below the halfway point stays at the largest finite bf16.
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7f8000u)), 0x7f80);  // tie: to even, which is inf
}

TEST(Bf16, NanStaysNan) {
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  // Payload only in the low 16 bits: plain truncation would give inf, rounding would carry.
  for (uint32_t bits : {0x7f800001u, 0x7f807fffu, 0x7f80ffffu, 0x7fffffffu, 0x7fc00000u}) {
    const uint16_t b = FloatToBf16(FromBits(bits));
    EXPECT_TRUE(IsBf16Nan(b)) << std::hex << bits << " -> " << b;
    EXPECT_EQ(b & 0x8000u, 0u);
    const uint16_t nb = FloatToBf16(FromBits(bits | 0x80000000u));
    EXPECT_TRUE(IsBf16Nan(nb)) << std::hex << (bits | 0x80000000u) << " -> " << nb;
    EXPECT_EQ(nb & 0x8000u, 0x8000u) << "sign kept";
  }
}

TEST(Bf16, EveryBf16ValueRoundTripsExactly) {
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = Bf16ToFloat(bits);
    if (IsBf16Nan(bits)) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(IsBf16Nan(FloatToBf16(f)));
    } else {
      ASSERT_EQ(FloatToBf16(f), bits) << "bits 0x" << std::hex << b;
      ASSERT_EQ(RoundToBf16(f), f);
    }
  }
}

TEST(Bf16, RoundingIsNearest) {
  // For a sweep of fp32 values, the chosen bf16 is never farther than its neighbours.
  for (uint32_t u = 0x3f000000u; u < 0x40800000u; u += 0x1357u) {
    const float f = FromBits(u);
    const uint16_t b = FloatToBf16(f);
    const double err = std::fabs(static_cast<double>(Bf16ToFloat(b)) - f);
    const double down = std::fabs(static_cast<double>(Bf16ToFloat(static_cast<uint16_t>(b - 1))) - f);
    const double up = std::fabs(static_cast<double>(Bf16ToFloat(static_cast<uint16_t>(b + 1))) - f);
    ASSERT_LE(err, down) << std::hex << u;
    ASSERT_LE(err, up) << std::hex << u;
  }
}

TEST(Bf16, BulkMatchesScalar) {
  std::vector<float> src = {0.0f, 1.0f, FromBits(0x3f808000u), FromBits(0x3f818000u), -7.25f, 1e30f, -1e-30f};
  std::vector<uint16_t> bits(src.size());
  FloatToBf16(src.data(), bits.data(), src.size());
  std::vector<float> back(src.size());
  Bf16ToFloat(bits.data(), back.data(), bits.size());
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(bits[i], FloatToBf16(src[i])) << i;
    EXPECT_EQ(back[i], Bf16ToFloat(bits[i])) << i;
  }
}

}  // namespace
}  // namespace shardgpt
