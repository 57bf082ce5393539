// Half and bfloat16 conversions (core/fp16.h): every half / bf16 value round-trips, decoding matches an
// independent formula, and encoding rounds to nearest with ties to even, checked against an oracle that
// searches the sorted list of representable values (and against the F16C instructions when present).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/fp16.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace pg {
namespace {

bool half_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0; }
bool bf16_is_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x007f) != 0; }

// Value of a half from its fields, in double (independent of fp16.h).
double half_value(uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0)
    v = std::ldexp(static_cast<double>(m), -24);
  else if (e == 31)
    v = m ? NAN : INFINITY;
  else
    v = std::ldexp(static_cast<double>(1024 + m), e - 25);
  return sign ? -v : v;
}

// Nearest half to f (ties to the even bit pattern); values at or beyond 65520 overflow to infinity,
// exactly what IEEE round-to-nearest-even gives. Works on |f| against the sorted positive halves.
uint16_t half_oracle(float f) {
  static const std::vector<double> pos = [] {
    std::vector<double> v(0x7c00);
    for (uint32_t h = 0; h < 0x7c00; ++h) v[h] = half_value(static_cast<uint16_t>(h));
    return v;
  }();
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isinf(a) || a >= 65520.0) return sign | 0x7c00;
  const auto it = std::upper_bound(pos.begin(), pos.end(), a);  // first value > a
  const uint32_t hi = static_cast<uint32_t>(it - pos.begin());
  if (hi == pos.size()) return sign | 0x7bff;  // (65504, 65520): nearer to max than to the overflow point
  const uint32_t lo = hi - 1;
  if (pos[lo] == a) return static_cast<uint16_t>(sign | lo);
  const double dl = a - pos[lo], dh = pos[hi] - a;
  if (dl < dh) return static_cast<uint16_t>(sign | lo);
  if (dh < dl) return static_cast<uint16_t>(sign | hi);
  return static_cast<uint16_t>(sign | ((lo & 1) ? hi : lo));
}

TEST(Fp16, AllHalvesRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t hv = static_cast<uint16_t>(h);
    const float f = fp16_to_f32(hv);
    if (half_is_nan(hv)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      const uint16_t back = f32_to_fp16(f);
      ASSERT_TRUE(half_is_nan(back)) << std::hex << h;
      ASSERT_EQ(back & 0x8000, hv & 0x8000) << std::hex << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), half_value(hv)) << std::hex << h;
    ASSERT_EQ(f32_to_fp16(f), hv) << std::hex << h;
    ASSERT_EQ(round_fp16(f), f) << std::hex << h;
  }
}

TEST(Fp16, MidpointsRoundToEven) {
  // Every midpoint between neighbouring finite halves (and just beside it), both signs.
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const float lo = fp16_to_f32(static_cast<uint16_t>(h)), hi = fp16_to_f32(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);  // exact: needs 12 bits
    ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(lo) + hi) / 2);
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    ASSERT_EQ(f32_to_fp16(mid), even) << std::hex << h;
    ASSERT_EQ(f32_to_fp16(-mid), even | 0x8000) << std::hex << h;
    ASSERT_EQ(f32_to_fp16(std::nextafter(mid, 0.f)), h) << std::hex << h;
    ASSERT_EQ(f32_to_fp16(std::nextafter(mid, INFINITY)), h + 1) << std::hex << h;
  }
  // Above the largest half: 65520 is the midpoint to the (virtual) next value and rounds to inf.
  EXPECT_EQ(f32_to_fp16(65519.996f), 0x7bff);
  EXPECT_EQ(f32_to_fp16(65520.f), 0x7c00);
  EXPECT_EQ(f32_to_fp16(-65520.f), 0xfc00);
  EXPECT_EQ(f32_to_fp16(1e30f), 0x7c00);
  EXPECT_EQ(f32_to_fp16(INFINITY), 0x7c00);
  EXPECT_EQ(f32_to_fp16(-INFINITY), 0xfc00);
  // Below half the smallest subnormal (2^-25) goes to zero; exactly 2^-25 is a tie to even (zero).
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.f, -25)), 0);
  EXPECT_EQ(f32_to_fp16(std::nextafter(std::ldexp(1.f, -25), 1.f)), 1);
  EXPECT_EQ(f32_to_fp16(-std::ldexp(1.f, -26)), 0x8000);
  EXPECT_EQ(f32_to_fp16(-0.f), 0x8000);
}

TEST(Fp16, RandomFloatsMatchOracle) {
  std::mt19937 rng(2024);
  std::uniform_int_distribution<uint32_t> bits;
  // Exponents spread over the whole float range, with extra weight on the half range.
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = bits(rng);
    if (i % 2) u = (u & 0x807fffffu) | ((97u + (u >> 23) % 50) << 23);  // 2^-30 .. 2^19
    const float f = bits_to_f32(u);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_fp16(f), half_oracle(f)) << std::hex << u;
  }
}

#if defined(__F16C__)
TEST(Fp16, MatchesF16CInstructions) {
  for (uint32_t h = 0; h < 65536; ++h) {
    if (half_is_nan(static_cast<uint16_t>(h))) continue;
    ASSERT_EQ(f32_to_bits(fp16_to_f32(static_cast<uint16_t>(h))), f32_to_bits(_cvtsh_ss(static_cast<uint16_t>(h)))) << h;
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 4000000; ++i) {
    uint32_t u = bits(rng);
    if (i % 2) u = (u & 0x807fffffu) | ((97u + (u >> 23) % 50) << 23);
    const float f = bits_to_f32(u);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_fp16(f), _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)) << std::hex << u;
  }
}
#endif

TEST(Bf16, AllValuesRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t hv = static_cast<uint16_t>(h);
    const float f = bf16_to_f32(hv);
    ASSERT_EQ(f32_to_bits(f), h << 16);
    if (bf16_is_nan(hv)) {
      const uint16_t back = f32_to_bf16(f);
      ASSERT_TRUE(bf16_is_nan(back)) << std::hex << h;
      ASSERT_TRUE(back & 0x40) << "NaN must come back quiet " << std::hex << h;
      continue;
    }
    ASSERT_EQ(f32_to_bf16(f), hv) << std::hex << h;
  }
}

TEST(Bf16, RoundsToNearestEven) {
  // Oracle: the two bf16 neighbours of f compared in double, ties to the even pattern.
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = bits(rng);
    if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;  // exact ties
    const float f = bits_to_f32(u);
    if (std::isnan(f)) continue;
    const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;  // same sign, next magnitude
    const double a = std::fabs(static_cast<double>(f)), vl = std::fabs(static_cast<double>(bits_to_f32(lo)));
    // hi may be the infinity pattern; treat its magnitude as 2^128 (the overflow point of IEEE rounding).
    const double vh =
        ((hi & 0x7fffffffu) == 0x7f800000u) ? std::ldexp(1.0, 128) : std::fabs(static_cast<double>(bits_to_f32(hi)));
    uint16_t want;
    if (std::isinf(f) || a - vl < vh - a)
      want = static_cast<uint16_t>(lo >> 16);
    else if (vh - a < a - vl)
      want = static_cast<uint16_t>(hi >> 16);
    else
      want = static_cast<uint16_t>(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
    ASSERT_EQ(f32_to_bf16(f), want) << std::hex << u;
  }
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);    // 1 + 2^-8: tie between 1 and 1+2^-7 -> 1 (even)
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);    // 1 + 3·2^-8: tie -> 1 + 2^-6 (even)
  EXPECT_EQ(f32_to_bf16(3.4028235e38f), 0x7f80);  // FLT_MAX rounds up to inf
  EXPECT_EQ(f32_to_bf16(std::nanf("")) & 0x7fc0, 0x7fc0);
}

}  // namespace
}  // namespace pg
