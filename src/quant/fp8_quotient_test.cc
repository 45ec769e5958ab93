// fp8_quotient.h against the format's own arithmetic (an IEEE fp32 division,
// then e4m3_from_float):
//   - below fp8_nonzero_floor the division's code is the zero of x's sign,
//     for every exponent pair and the mantissas that decide it, and the floor
//     is tight (one binade lower and the code is not always zero);
//   - at or above it fp8_block_quotient is the division bit for bit, for
//     every finite bf16 x within the block's amax under scales of every
//     exponent, and for random fp32 x.
//
// Catches (each tried once, 2026-12-05):
//   - the floor one binade higher, `(s_bits >> 23) - 9`: the zero sweep, the
//     tight-bound test and both quotient sweeps fail;
//   - fp8_block_quotient without its correction step (returning q0): both
//     quotient sweeps fail;
//   - the shortcut returning +0 for negative x: the zero sweep, the
//     subnormal test and both quotient sweeps fail.
#include "quant/fp8_quotient.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <random>

#include "quant/fp8_block.h"

namespace refit {
namespace {

float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t to_bits(float x) { return std::bit_cast<std::uint32_t>(x); }

// The format's s for a block whose largest magnitude is `amax`.
float scale_of(float amax) { return std::max(amax, kFp8ScaleFloor) / kFp8E4M3Max; }

bool signed_zero_applies(std::uint32_t x_bits, std::uint32_t s_bits) {
  return (x_bits & 0x7FFFFFFFu) < fp8_nonzero_floor(s_bits);
}

// The zero of x's sign, as an e4m3 code.
std::uint8_t signed_zero(std::uint32_t x_bits) { return (x_bits >> 31) != 0 ? 0x80 : 0x00; }

TEST(Fp8Quotient, BelowTheFloorTheDivisionGivesTheSignedZero) {
  const std::uint32_t mantissas[] = {0x000000u, 0x000001u, 0x400000u, 0x7FFFFEu, 0x7FFFFFu};
  int checked = 0;
  for (std::uint32_t es = 10; es < 255; ++es) {
    for (const std::uint32_t sm : mantissas) {
      const std::uint32_t s_bits = (es << 23) | sm;
      const float s = from_bits(s_bits);
      for (std::uint32_t ex = 0; ex < 255; ++ex) {
        for (const std::uint32_t xm : mantissas) {
          for (const std::uint32_t sign : {0u, 0x80000000u}) {
            const std::uint32_t x_bits = sign | (ex << 23) | xm;
            if (!signed_zero_applies(x_bits, s_bits)) continue;
            ++checked;
            ASSERT_EQ(e4m3_from_float(from_bits(x_bits) / s), signed_zero(x_bits))
                << "x bits 0x" << std::hex << x_bits << ", s bits 0x" << s_bits;
            const float q = fp8_block_quotient(from_bits(x_bits), s, 1.0f / s, fp8_nonzero_floor(s_bits));
            ASSERT_EQ(to_bits(q), x_bits & 0x80000000u) << "x bits 0x" << std::hex << x_bits;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 100000);
}

TEST(Fp8Quotient, TheFloorIsTight) {
  // One binade above the floor's bound: x = (2 - 2^-23) 2^(Es - 137), s =
  // 2^(Es - 127): x / s is just below 2^-9, above the 2^-10 midpoint, so the
  // code is 0x01.
  const std::uint32_t es = 120;
  const std::uint32_t s_bits = es << 23;
  const std::uint32_t x_bits = ((es - 10) << 23) | 0x7FFFFFu;
  EXPECT_FALSE(signed_zero_applies(x_bits, s_bits));
  EXPECT_EQ(e4m3_from_float(from_bits(x_bits) / from_bits(s_bits)), 0x01);
  // Just below the floor the code is zero.
  const std::uint32_t below = ((es - 11) << 23) | 0x7FFFFFu;
  EXPECT_TRUE(signed_zero_applies(below, s_bits));
  EXPECT_EQ(e4m3_from_float(from_bits(below) / from_bits(s_bits)), 0x00);
}

TEST(Fp8Quotient, SubnormalsAreBelowTheFloorOfEveryFormatScale) {
  // The smallest s the format makes (amax <= 1e-12) has a floor far above
  // every subnormal; the sign survives.
  const std::uint32_t s_bits = to_bits(scale_of(0.0f));
  EXPECT_TRUE(signed_zero_applies(0x007FFFFFu, s_bits));
  EXPECT_TRUE(signed_zero_applies(0x807FFFFFu, s_bits));
  const float s = from_bits(s_bits);
  EXPECT_EQ(to_bits(fp8_block_quotient(from_bits(0x807FFFFFu), s, 1.0f / s, fp8_nonzero_floor(s_bits))),
            0x80000000u);
}

// Checks x / s for x against the division: bit for bit above the floor, the
// same code below it. Returns false (after a failure) to stop the sweep.
bool agrees(float x, float s) {
  const float r = 1.0f / s;
  const std::uint32_t floor = fp8_nonzero_floor(to_bits(s));
  const float want = x / s;
  const float got = fp8_block_quotient(x, s, r, floor);
  if (signed_zero_applies(to_bits(x), to_bits(s))) {
    EXPECT_EQ(e4m3_from_float(got), e4m3_from_float(want)) << "x " << x << ", s " << s;
    return e4m3_from_float(got) == e4m3_from_float(want);
  }
  EXPECT_EQ(to_bits(got), to_bits(want)) << "x bits 0x" << std::hex << to_bits(x) << ", s bits 0x" << to_bits(s);
  return to_bits(got) == to_bits(want);
}

TEST(Fp8Quotient, AboveTheFloorEveryBf16QuotientIsTheDivision) {
  const std::uint32_t amax_mantissas[] = {0x000000u, 0x000001u, 0x2AAAAAu, 0x7FFFFFu};
  long checked = 0;
  for (std::uint32_t ea = 0; ea < 255; ++ea) {
    for (const std::uint32_t am : amax_mantissas) {
      const float amax = from_bits((ea << 23) | am);
      const float s = scale_of(amax);
      for (std::uint32_t b = 0; b < 0x10000u; ++b) {
        const float x = from_bits(b << 16);
        if (!std::isfinite(x) || std::fabs(x) > amax) continue;
        ++checked;
        if (!agrees(x, s)) return;
      }
    }
  }
  EXPECT_GT(checked, 10'000'000);
}

TEST(Fp8Quotient, AboveTheFloorRandomFp32QuotientsAreTheDivision) {
  std::mt19937 rng(20261205);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0x7F7FFFFFu);  // finite magnitudes
  for (int i = 0; i < 8'000'000; ++i) {
    const float amax = from_bits(bits(rng));
    // x within the amax: magnitude bits at most the amax's (integers order them).
    const float x = from_bits(bits(rng) % (to_bits(amax) + 1)) * (i % 2 == 0 ? 1.0f : -1.0f);
    if (!agrees(x, scale_of(amax))) return;
  }
}

}  // namespace
}  // namespace refit
