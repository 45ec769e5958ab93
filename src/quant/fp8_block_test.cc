// Tests of the FP8 block format's CPU reference (quant/fp8_block.h): hand
// computed cases for each rule of the format, and an independent slow
// reference (bf16 decoded from its fields, the nearest e4m3 code found by
// searching all 254 finite codes) checked against quantize_fp8_block on
// random inputs.
#include "quant/fp8_block.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace refit {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }

// Source bytes of `values`, each exactly representable in `dtype`.
std::vector<std::byte> encode(DType dtype, const std::vector<float>& values) {
  std::vector<std::byte> out(values.size() * dtype_size(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint32_t u = bits_of(values[i]);
    if (dtype == DType::kBFloat16) {
      EXPECT_EQ(u & 0xFFFFu, 0u) << values[i] << " is not a bfloat16 value";
      const auto h = static_cast<std::uint16_t>(u >> 16);
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &u, 4);
    }
  }
  return out;
}

struct Quantized {
  std::vector<std::uint8_t> weight;
  std::vector<float> scale;
};

// quantize_fp8_block over `box` of a dense source; fails the test on error.
Quantized quantize(const Fp8Source& src, const Fp8Box& box) {
  Quantized q{std::vector<std::uint8_t>(box.elements()), std::vector<float>(box.scales())};
  const Status s = quantize_fp8_block(src, box, q.weight, q.scale);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return q;
}

Quantized quantize(DType dtype, const std::vector<std::byte>& bytes, std::int64_t e, std::int64_t r, std::int64_t c) {
  const Fp8Source src = fp8_dense_source(dtype, bytes.data(), e, r, c);
  return quantize(src, fp8_whole_box(src));
}

std::vector<std::uint32_t> scale_bits(const Quantized& q) {
  std::vector<std::uint32_t> out;
  for (float s : q.scale) out.push_back(bits_of(s));
  return out;
}

// ---- the slow, independent reference -------------------------------------

// bfloat16 from its fields (sign, 8-bit exponent, 7-bit mantissa), in double.
double slow_bf16(std::uint16_t h) {
  const int sign = h >> 15, e = (h >> 7) & 0xFF, m = h & 0x7F;
  const double mag = e == 0 ? std::ldexp(m, -126 - 7) : std::ldexp(128 + m, e - 127 - 7);
  return sign ? -mag : mag;
}

// The value of a finite e4m3fn code, from the format's definition.
double slow_e4m3(int code) {
  const int sign = code >> 7, e = (code >> 3) & 15, m = code & 7;
  const double mag = e == 0 ? (m / 8.0) * std::pow(2.0, -6) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return sign ? -mag : mag;
}

// The finite code nearest q: ties go to the code whose sign is q's (the two
// zeros), then to the even code (mantissa bit 0). |q| above 448 lands on
// +-448 because no finite code lies beyond it. Distances in double are exact
// wherever two candidates come close to a tie (q and the codes then share an
// exponent range of well under 53 bits).
std::uint8_t slow_nearest_e4m3(float q) {
  const bool negative = std::signbit(q);
  int best = -1;
  double best_d = 0;
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;  // NaN
    const double d = std::fabs(static_cast<double>(q) - slow_e4m3(code));
    bool better = best < 0 || d < best_d;
    if (!better && d == best_d) {
      const bool sign_ok = ((code >> 7) != 0) == negative, best_sign_ok = ((best >> 7) != 0) == negative;
      better = sign_ok != best_sign_ok ? sign_ok : ((code & 1) == 0 && (best & 1) != 0);
    }
    if (better) best = code, best_d = d;
  }
  return static_cast<std::uint8_t>(best);
}

// The format applied element by element to a dense [e, r, c] source: one
// pass gathers every block's amax, a second divides and rounds.
Quantized slow_quantize(DType dtype, const std::vector<std::byte>& bytes, std::int64_t e, std::int64_t r,
                        std::int64_t c) {
  const std::int64_t rb = (r + 127) / 128, cb = (c + 127) / 128;
  auto value = [&](std::int64_t i) -> float {
    if (dtype == DType::kBFloat16) {
      std::uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      return static_cast<float>(slow_bf16(h));
    }
    float f;
    std::memcpy(&f, bytes.data() + 4 * i, 4);
    return f;
  };
  auto block_of = [&](std::int64_t i) {
    const std::int64_t m = i / (r * c), row = i / c % r, col = i % c;
    return (m * rb + row / 128) * cb + col / 128;
  };
  std::vector<float> amax(e * rb * cb, 0.0f);
  for (std::int64_t i = 0; i < e * r * c; ++i) {
    const float a = std::fabs(value(i));
    if (a > amax[block_of(i)]) amax[block_of(i)] = a;
  }
  Quantized out{std::vector<std::uint8_t>(e * r * c), {}};
  for (float a : amax) out.scale.push_back((a < 1e-12f ? 1e-12f : a) / 448.0f);
  for (std::int64_t i = 0; i < e * r * c; ++i) out.weight[i] = slow_nearest_e4m3(value(i) / out.scale[block_of(i)]);
  return out;
}

// ---- e4m3 conversion ------------------------------------------------------

// Catches: a cast that does not saturate (464 and above, Inf, would become
// NaN 0x7F or wrap into the sign bit), or saturates below 448.
TEST(E4m3FromFloat, SaturatesAtAndAbove448) {
  for (float x : {448.0f, 448.00003f, 449.0f, 463.99997f, 464.0f, 465.0f, 480.0f, 1e30f, FLT_MAX, kInf}) {
    EXPECT_EQ(e4m3_from_float(x), 0x7E) << x;
    EXPECT_EQ(e4m3_from_float(-x), 0xFE) << -x;
  }
  EXPECT_EQ(e4m3_from_float(447.0f), 0x7E);  // nearer 448 than 416
  EXPECT_EQ(e4m3_from_float(431.0f), 0x7D);  // 416
  EXPECT_EQ(e4m3_from_float(from_bits(0x7FC00000)), 0x7F);  // NaN stays NaN (never quantized)
}

// Catches: ties rounded away from zero or up, truncation, an off-by-one in the
// 20 dropped mantissa bits, a wrong rounding point in the subnormal range.
TEST(E4m3FromFloat, RoundsToNearestEvenBetweenNeighbours) {
  struct Case {
    float x;
    std::uint8_t code;
  };
  const Case cases[] = {
      {1.0f, 0x38},          {1.0625f, 0x38},  // tie 1 | 1.125: even 1
      {1.0625001f, 0x39},    {1.1875f, 0x3A},  // tie 1.125 | 1.25: even 1.25
      {1.1874999f, 0x39},    {400.0f, 0x7C},   // tie 384 | 416: even 384
      {432.0f, 0x7E},        {-1.0625f, 0xB8},  // tie 416 | 448: even 448
      {0.0009765625f, 0x00},  // 2^-10, tie 0 | 2^-9: even 0
      {0.0009765626f, 0x01},  {0.0029296875f, 0x02},  // 3 * 2^-10, tie 2^-9 | 2^-8
      {0.0146484375f, 0x08},  // 15 * 2^-10, tie 7 * 2^-9 | 2^-6: even 0x08
      {0.015625f, 0x08},      {0.013671875f, 0x07},  // 2^-6; 7 * 2^-9
      {3.0e-3f, 0x02},        {-0.0029296875f, 0x82},
  };
  for (const Case& c : cases) EXPECT_EQ(e4m3_from_float(c.x), c.code) << c.x;
}

// Catches: a zero that loses its sign (tiny negatives must give 0x80), fp32
// subnormals mishandled by the exponent arithmetic.
TEST(E4m3FromFloat, ZerosKeepTheirSign) {
  EXPECT_EQ(e4m3_from_float(0.0f), 0x00);
  EXPECT_EQ(e4m3_from_float(-0.0f), 0x80);
  EXPECT_EQ(e4m3_from_float(-0.00048828125f), 0x80);  // -2^-11
  EXPECT_EQ(e4m3_from_float(-0.0009765625f), 0x80);   // -2^-10: tie to even zero
  EXPECT_EQ(e4m3_from_float(from_bits(0x00000001)), 0x00);
  EXPECT_EQ(e4m3_from_float(from_bits(0x80000001)), 0x80);
  EXPECT_EQ(e4m3_from_float(from_bits(0x807FFFFF)), 0x80);
  EXPECT_EQ(e4m3_from_float(FLT_MIN), 0x00);
}

// Catches: a decoder (or encoder) with a wrong bias or subnormal scale.
TEST(E4m3FromFloat, EveryFiniteCodeRoundTripsAndMatchesTheSearch) {
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;
    const auto c = static_cast<std::uint8_t>(code);
    EXPECT_EQ(e4m3_to_float(c), static_cast<float>(slow_e4m3(code))) << code;
    EXPECT_EQ(e4m3_from_float(e4m3_to_float(c)), c) << code;
  }
  // Every fp32 with an exponent that matters (plus zeros and subnormals), in
  // steps that hit every rounding boundary class: the search agrees.
  std::mt19937 rng(1);
  for (std::uint32_t e = 0; e < 140; ++e) {
    for (int i = 0; i < 2000; ++i) {
      std::uint32_t mant = rng() & 0x7FFFFF;
      if (i < 16) mant = (i & 8 ? 0x80000u : 0x100000u * (i & 7)) | (i & 1);  // near ties
      const float x = from_bits((rng() & 0x80000000u) | (e << 23) | mant);
      ASSERT_EQ(e4m3_from_float(x), slow_nearest_e4m3(x)) << std::hexfloat << x;
    }
  }
}

// ---- blocks by hand -------------------------------------------------------

// Catches: a scale other than amax / 448 (448 / amax, a reciprocal, amax
// itself), rounding that differs from e4m3_from_float's ties to even, a lost
// sign of zero inside a block.
TEST(Fp8Block, ScaleOneKeepsValuesAndRoundsTiesToEven) {
  const std::vector<float> v = {448.0f, 1.0625f, 1.1875f, 432.0f, 400.0f, 0.0009765625f, 0.0029296875f,
                                0.0146484375f, -1.0625f, 0.0f, -0.0f, -0.00048828125f};
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    const std::vector<std::byte> bytes = encode(dtype, v);
    const Quantized q = quantize(dtype, bytes, 1, 1, static_cast<std::int64_t>(v.size()));
    EXPECT_EQ(q.scale, std::vector<float>({1.0f}));
    EXPECT_EQ(q.weight, std::vector<std::uint8_t>({0x7E, 0x38, 0x3A, 0x7E, 0x7C, 0x00, 0x02, 0x08, 0xB8, 0x00,
                                                   0x80, 0x80}));
  }
}

// Catches: a multiplication by a rounded reciprocal (x * (1 / s) or
// x * (448 / amax)) instead of the division: with amax 1.53125, s = 7 * 2^-11
// exactly and x / s lands exactly on the ties 3.125 and 3.625, which the
// products miss upwards (0x45, 0x47); an fp64 or unrounded scale.
TEST(Fp8Block, ScaleIsAmaxOver448InFp32) {
  {
    const std::vector<std::byte> b =
        encode(DType::kBFloat16, {1.53125f, bf16_to_float(0x3C2F), bf16_to_float(0x3C4B)});
    const Quantized q = quantize(DType::kBFloat16, b, 1, 1, 3);
    EXPECT_EQ(scale_bits(q), std::vector<std::uint32_t>({0x3B600000u}));  // 0x1.cp-9
    EXPECT_EQ(q.weight, std::vector<std::uint8_t>({0x7E, 0x44, 0x46}));
  }
  {  // amax 896: s = 2, 2.125 / 2 = 1.0625 ties to 1.0
    const std::vector<std::byte> b = encode(DType::kBFloat16, {896.0f, 2.125f, -2.375f});
    const Quantized q = quantize(DType::kBFloat16, b, 1, 1, 3);
    EXPECT_EQ(q.scale, std::vector<float>({2.0f}));
    EXPECT_EQ(q.weight, std::vector<std::uint8_t>({0x7E, 0x38, 0xBA}));
  }
  {  // amax 1: s = RN(1/448) = 0x3B124925 (just above 1/448), 1 / s = 447.99997, 0.5 / s = 223.99998
    const std::vector<std::byte> b = encode(DType::kBFloat16, {1.0f, 0.5f, -0.5f});
    const Quantized q = quantize(DType::kBFloat16, b, 1, 1, 3);
    EXPECT_EQ(scale_bits(q), std::vector<std::uint32_t>({0x3B124925u}));
    EXPECT_EQ(q.weight, std::vector<std::uint8_t>({0x7E, 0x76, 0xF6}));
  }
}

// Catches: a quotient just above 448 (RN(amax / RN(amax / 448)) can be
// 448.00003) turned into NaN or wrapped instead of saturated.
TEST(Fp8Block, QuotientAbove448Saturates) {
  const float amax = bf16_to_float(0x3F83);  // 1.0234375
  const float s = fp8_block_scale(amax);
  ASSERT_GT(amax / s, 448.0f);  // the case this test is about
  const std::vector<std::byte> b = encode(DType::kBFloat16, {amax, -amax});
  const Quantized q = quantize(DType::kBFloat16, b, 1, 1, 2);
  EXPECT_EQ(q.weight, std::vector<std::uint8_t>({0x7E, 0xFE}));
}

// Catches: a missing floor (s = 1e-13 / 448 would give 448, not 44.8 -> 44),
// a floor applied to s instead of amax, a floor of another value.
TEST(Fp8Block, AmaxBelowTheFloorUsesTheFloor) {
  const std::vector<std::byte> b = encode(DType::kFloat32, {1e-13f, -1e-13f, 0.0f});
  const Quantized q = quantize(DType::kFloat32, b, 1, 1, 3);
  EXPECT_EQ(scale_bits(q), std::vector<std::uint32_t>({0x2720D7C5u}));  // RN(1e-12f / 448)
  EXPECT_EQ(fp8_block_scale(0.0f), 1e-12f / 448.0f);
  EXPECT_EQ(q.weight, std::vector<std::uint8_t>({0x63, 0xE3, 0x00}));  // +-44 (44.8 rounded)
}

// Catches: fp32 subnormals (inputs, or a subnormal amax) treated as NaN, as
// zero-with-the-wrong-sign, or giving a subnormal or zero scale.
TEST(Fp8Block, SubnormalInputsAndASubnormalAmax) {
  {  // every element subnormal: the amax is subnormal, s is the floor's
    const std::vector<std::byte> b = encode(
        DType::kFloat32, {from_bits(0x007FFFFF), from_bits(0x00000001), from_bits(0x80000001), from_bits(0x80400000)});
    const Quantized q = quantize(DType::kFloat32, b, 1, 1, 4);
    EXPECT_EQ(scale_bits(q), std::vector<std::uint32_t>({0x2720D7C5u}));
    EXPECT_EQ(q.weight, std::vector<std::uint8_t>({0x00, 0x00, 0x80, 0x80}));
  }
  {  // subnormals beside a normal amax: zeros of their sign
    const std::vector<std::byte> b =
        encode(DType::kFloat32, {448.0f, from_bits(0x007FFFFF), from_bits(0x80000001)});
    const Quantized q = quantize(DType::kFloat32, b, 1, 1, 3);
    EXPECT_EQ(q.scale, std::vector<float>({1.0f}));
    EXPECT_EQ(q.weight, std::vector<std::uint8_t>({0x7E, 0x00, 0x80}));
  }
  {  // bf16 subnormals (0x0001 = 2^-133, 0x807F)
    const std::vector<std::byte> b = encode(DType::kBFloat16, {bf16_to_float(0x0001), bf16_to_float(0x807F)});
    const Quantized q = quantize(DType::kBFloat16, b, 1, 1, 2);
    EXPECT_EQ(scale_bits(q), std::vector<std::uint32_t>({0x2720D7C5u}));
    EXPECT_EQ(q.weight, std::vector<std::uint8_t>({0x00, 0x80}));
  }
}

// Catches: 0 / 0 (NaN scale or codes) for a block of zeros, -0 losing its sign.
TEST(Fp8Block, AllZeroBlock) {
  std::vector<float> v(128 * 128, 0.0f);
  for (std::size_t i = 0; i < v.size(); i += 7) v[i] = -0.0f;
  const std::vector<std::byte> b = encode(DType::kBFloat16, v);
  const Quantized q = quantize(DType::kBFloat16, b, 1, 128, 128);
  EXPECT_EQ(scale_bits(q), std::vector<std::uint32_t>({0x2720D7C5u}));
  for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(q.weight[i], i % 7 == 0 ? 0x80 : 0x00) << i;
}

// Catches: edge blocks that read past the row (wrapping into the next row's
// first columns, where block (0, 0)'s 448 lies) or past the matrix, scales
// laid out column-major or with the wrong count, a floor-divided scale grid
// that drops the partial blocks.
TEST(Fp8Block, PartialEdgeBlocks) {
  const std::int64_t R = 130, C = 200;  // blocks: 128 + 2 rows, 128 + 72 columns
  std::vector<float> v(R * C, 0.25f);
  auto at = [&](std::int64_t r, std::int64_t c) -> float& { return v[r * C + c]; };
  at(5, 3) = 448.0f;        // block (0, 0): s = 1
  at(127, 199) = -224.0f;   // block (0, 1), partial columns: s = 0.5
  at(129, 127) = 896.0f;    // block (1, 0), partial rows: s = 2
  at(128, 128) = 1792.0f;   // block (1, 1), partial both: s = 4
  at(129, 199) = 4.25f;     // 4.25 / 4 = 1.0625: ties to 1.0
  const std::vector<std::byte> b = encode(DType::kBFloat16, v);
  const Quantized q = quantize(DType::kBFloat16, b, 1, R, C);
  EXPECT_EQ(fp8_block_shapes(R, C).scale, std::vector<std::int64_t>({2, 2}));
  EXPECT_EQ(q.scale, std::vector<float>({1.0f, 0.5f, 2.0f, 4.0f}));
  EXPECT_EQ(q.weight[5 * C + 3], 0x7E);
  EXPECT_EQ(q.weight[127 * C + 199], 0xFE);
  EXPECT_EQ(q.weight[129 * C + 127], 0x7E);
  EXPECT_EQ(q.weight[128 * C + 128], 0x7E);
  EXPECT_EQ(q.weight[129 * C + 199], 0x38);
  EXPECT_EQ(q.weight[1], 0x28);              // 0.25 / 1 = 2^-2
  EXPECT_EQ(q.weight[0 * C + 128], 0x30);    // 0.25 / 0.5 = 2^-1
  EXPECT_EQ(q.weight[129 * C + 0], 0x20);    // 0.25 / 2 = 2^-3
  EXPECT_EQ(q.weight[128 * C + 129], 0x18);  // 0.25 / 4 = 2^-4
}

// Catches: a stacked [E, R, C] tensor quantized as one [E * R, C] matrix
// (its blocks would span two experts: rows 128..255 of the flat view hold
// expert 0's last 2 rows and expert 1's first 126), scales without the E axis.
TEST(Fp8Block, StackedExpertsAreIndependent) {
  const std::int64_t E = 3, R = 130, C = 3;
  std::vector<float> v(E * R * C, 0.5f);
  auto at = [&](std::int64_t m, std::int64_t r, std::int64_t c) -> float& { return v[(m * R + r) * C + c]; };
  at(0, 0, 0) = 448.0f;    // expert 0, block 0: s = 1
  at(0, 129, 2) = 1.0f;    // expert 0, block 1 (2 rows): amax 1
  at(1, 0, 1) = 1792.0f;   // expert 1, block 0: s = 4; expert 1 block 1 stays at amax 0.5
  at(2, 128, 0) = -896.0f; // expert 2, block 1: s = 2; block 0 amax 0.5
  const std::vector<std::byte> b = encode(DType::kFloat32, v);
  const Quantized q = quantize(DType::kFloat32, b, E, R, C);
  ASSERT_EQ(q.scale.size(), 6u);
  EXPECT_EQ(q.scale[0], 1.0f);
  EXPECT_EQ(q.scale[1], fp8_block_scale(1.0f));
  EXPECT_EQ(q.scale[2], 4.0f);
  EXPECT_EQ(q.scale[3], fp8_block_scale(0.5f));
  EXPECT_EQ(q.scale[4], fp8_block_scale(0.5f));
  EXPECT_EQ(q.scale[5], 2.0f);
  // Each expert equals the same [R, C] weight quantized alone.
  for (std::int64_t m = 0; m < E; ++m) {
    const std::vector<std::byte> one(b.begin() + m * R * C * 4, b.begin() + (m + 1) * R * C * 4);
    const Quantized alone = quantize(DType::kFloat32, one, 1, R, C);
    EXPECT_TRUE(std::equal(alone.weight.begin(), alone.weight.end(), q.weight.begin() + m * R * C)) << m;
    EXPECT_TRUE(std::equal(alone.scale.begin(), alone.scale.end(), q.scale.begin() + m * 2)) << m;
  }
}

// ---- boxes (shards of a larger tensor) ------------------------------------

// Random finite values; the kind of each block (from `seed` and the block)
// is one of: random bit patterns (subnormals and huge values included),
// normals of a random magnitude, exact ties (amax 448 * s for a scale s =
// (8 + j) / 8 * 2^k, every other element an e4m3 code or a midpoint between
// neighbours, times s: a division lands on the tie, a multiplication by a
// rounded 1 / s misses it), zeros
// of both signs with a few tiny values, uniform values.
std::vector<float> random_values(DType dtype, std::uint64_t seed, std::int64_t E, std::int64_t R, std::int64_t C) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const std::int64_t rb = (R + 127) / 128, cb = (C + 127) / 128;
  std::vector<int> kind(E * rb * cb), shift(E * rb * cb);
  for (std::size_t i = 0; i < kind.size(); ++i) {
    kind[i] = static_cast<int>(rng() % 5);
    shift[i] = static_cast<int>(rng() % 41) - 20;
  }
  auto finite = [&](std::uint32_t u) {
    if (dtype == DType::kBFloat16) u &= 0xFFFF0000u;
    if ((u & 0x7F800000u) == 0x7F800000u) u &= 0xBFFFFFFFu;  // clear an exponent bit
    return from_bits(u);
  };
  std::vector<float> v(E * R * C);
  for (std::int64_t m = 0; m < E; ++m) {
    for (std::int64_t r = 0; r < R; ++r) {
      for (std::int64_t c = 0; c < C; ++c) {
        const std::int64_t blk = (m * rb + r / 128) * cb + c / 128;
        float x = 0;
        switch (kind[blk]) {
          case 0: x = finite(static_cast<std::uint32_t>(rng())); break;
          case 1: x = std::ldexp(normal(rng), shift[blk] * 6); break;
          case 2: {  // s = (8 + j) / 8 * 2^k exactly, so x / s lands on codes and ties
            const double step = (8 + (shift[blk] + 20) % 8) / 8.0;
            if (r % 128 == 0 && c % 128 == 0) {
              x = static_cast<float>(448.0 * step);
            } else {
              const int code = static_cast<int>(rng() % 0x7E);
              const double lo = slow_e4m3(code), hi = slow_e4m3(code + 1);
              x = static_cast<float>((rng() % 2 ? lo : (lo + hi) / 2) * step);
            }
            x = std::ldexp(rng() % 2 ? -x : x, shift[blk]);
            break;
          }
          case 3: {
            const std::uint64_t p = rng() % 16;
            x = p < 6 ? 0.0f : p < 12 ? -0.0f : finite(static_cast<std::uint32_t>(rng() % 0x00900000u | (p % 2) << 31));
            break;
          }
          default: x = std::uniform_real_distribution<float>(-1, 1)(rng) * std::ldexp(1.0f, shift[blk]); break;
        }
        v[(m * R + r) * C + c] = finite(bits_of(x));
      }
    }
  }
  return v;
}

// Catches: a box whose blocks are not the source's (offsets not applied, a
// row stride taken as the box's width), a box scale grid of the wrong shape.
TEST(Fp8Block, BoxEqualsTheSameSliceOfTheWholeTensor) {
  const std::int64_t E = 2, R = 300, C = 260;
  const std::vector<std::byte> b = encode(DType::kFloat32, random_values(DType::kFloat32, 9, E, R, C));
  const Fp8Source full = fp8_dense_source(DType::kFloat32, b.data(), E, R, C);
  const Quantized whole = quantize(full, fp8_whole_box(full));
  const std::int64_t rb = 3, cb = 3;
  const Fp8Box boxes[] = {{1, 1, 128, 172, 128, 128}, {0, 2, 0, 128, 256, 4}, {0, 1, 256, 44, 0, 260},
                          {1, 1, 128, 0, 0, 260}};
  for (const Fp8Box& box : boxes) {
    const Quantized part = quantize(full, box);
    ASSERT_EQ(part.scale.size(), static_cast<std::size_t>(box.scales()));
    for (std::int64_t m = 0; m < box.matrices; ++m) {
      for (std::int64_t r = 0; r < box.rows; ++r) {
        for (std::int64_t c = 0; c < box.cols; ++c) {
          ASSERT_EQ(part.weight[(m * box.rows + r) * box.cols + c],
                    whole.weight[((box.matrix_begin + m) * R + box.row_begin + r) * C + box.col_begin + c])
              << m << " " << r << " " << c;
        }
      }
      const std::int64_t brb = fp8_blocks(box.rows), bcb = fp8_blocks(box.cols);
      for (std::int64_t i = 0; i < brb; ++i) {
        for (std::int64_t j = 0; j < bcb; ++j) {
          ASSERT_EQ(part.scale[(m * brb + i) * bcb + j],
                    whole.scale[((box.matrix_begin + m) * rb + box.row_begin / 128 + i) * cb + box.col_begin / 128 +
                                j]);
        }
      }
    }
  }
  // The same shard as its own source: data at its first element, the full
  // tensor's strides.
  const Fp8Box box = boxes[0];
  const Fp8Source shard{DType::kFloat32, b.data() + ((1 * R + 128) * C + 128) * 4, 1, 172, 128, C, R * C};
  const Quantized by_stride = quantize(shard, fp8_whole_box(shard));
  EXPECT_EQ(by_stride.weight, quantize(full, box).weight);
  EXPECT_EQ(by_stride.scale, quantize(full, box).scale);
}

bool has(const Status& s, std::string_view text) {
  return !s.ok() && s.message().find(text) != std::string::npos;
}

// Catches: boxes off block boundaries (their scales would differ from the
// whole tensor's), outside the source, wrong output sizes, other dtypes or
// strides that overlap rows, accepted instead of refused (writing nothing).
TEST(Fp8Block, InvalidBoxesAndSourcesAreRefused) {
  std::vector<std::byte> b(2 * 300 * 260 * 2);
  const Fp8Source src = fp8_dense_source(DType::kBFloat16, b.data(), 2, 300, 260);
  auto run = [&](const Fp8Source& s, const Fp8Box& box) {
    std::vector<std::uint8_t> w(std::max<std::int64_t>(box.elements(), 0), 0xAA);
    std::vector<float> sc(std::max<std::int64_t>(box.scales(), 0), -1.0f);
    const Status st = quantize_fp8_block(s, box, w, sc);
    EXPECT_TRUE(std::all_of(w.begin(), w.end(), [](std::uint8_t x) { return x == 0xAA; }));
    return st;
  };
  EXPECT_TRUE(has(run(src, {0, 1, 64, 128, 0, 260}), "begin at 64, not a multiple of 128"));
  EXPECT_TRUE(has(run(src, {0, 1, 0, 200, 0, 260}), "end at 200, neither a multiple of 128 nor the source's end 300"));
  EXPECT_TRUE(has(run(src, {0, 1, 0, 128, 130, 130}), "columns of the box"));
  EXPECT_TRUE(has(run(src, {0, 1, 256, 128, 0, 260}), "do not lie inside [0, 300)"));
  EXPECT_TRUE(has(run(src, {1, 2, 0, 128, 0, 128}), "matrices [1, 3)"));
  EXPECT_TRUE(has(run(src, {0, 1, 0, -1, 0, 1}), "do not lie inside"));
  Fp8Source f16 = src;
  f16.dtype = DType::kFloat16;
  EXPECT_TRUE(has(run(f16, fp8_whole_box(src)), "bfloat16 or float32 weights, not float16"));
  Fp8Source narrow = src;
  narrow.row_stride = 100;
  EXPECT_TRUE(has(run(narrow, fp8_whole_box(src)), "row stride 100 is less than the 260 columns"));
  Fp8Source overlapping = src;
  overlapping.matrix_stride = 260;
  EXPECT_TRUE(has(run(overlapping, fp8_whole_box(src)), "matrix stride 260 is less than"));
  Fp8Source null = src;
  null.data = nullptr;
  EXPECT_TRUE(has(run(null, fp8_whole_box(src)), "null data"));
  std::vector<std::uint8_t> w(10);
  std::vector<float> sc(1);
  EXPECT_TRUE(has(quantize_fp8_block(src, {0, 1, 0, 128, 0, 128}, w, sc),
                  "needs 16384 codes and 1 scales, given 10 and 1"));
  // Empty boxes are fine (nothing to write).
  EXPECT_TRUE(quantize_fp8_block(src, {0, 0, 0, 300, 0, 260}, {}, {}).ok());
  EXPECT_TRUE(quantize_fp8_block(null, {0, 2, 0, 0, 0, 260}, {}, {}).ok());
}

// ---- NaN and Inf ------------------------------------------------------------

// Catches: NaN or Inf quantized (to 0x7F, or to 448 by saturation) instead
// of refused; a refusal that does not name the tensor, the version, or the
// element in the full tensor's coordinates; a report that is not the first.
TEST(Fp8Block, NanAndInfAreRefusedNamingTheTensor) {
  const std::int64_t E = 2, R = 130, C = 5;
  const std::string name = "layers.3.mlp.experts.w13.weight";
  std::vector<float> v(E * R * C, 1.0f);
  {  // bf16 NaN (0x7FC1: a payload) at [1, 129, 4], the last element
    std::vector<std::byte> b = encode(DType::kBFloat16, v);
    const std::uint16_t nan = 0x7FC1;
    std::memcpy(b.data() + (E * R * C - 1) * 2, &nan, 2);
    const Fp8Source src = fp8_dense_source(DType::kBFloat16, b.data(), E, R, C);
    const Status s = check_fp8_finite(src, fp8_whole_box(src), name, 7);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), "tensor 'layers.3.mlp.experts.w13.weight' at weight version 7: element [1, 129, 4] is nan; "
                           "NaN and Inf are refused, never quantized to FP8 or sent");
    std::vector<std::uint8_t> w(E * R * C, 0xAA);
    std::vector<float> sc(E * 2, -1.0f);
    const Status q = quantize_fp8_block(src, fp8_whole_box(src), w, sc);
    EXPECT_TRUE(has(q, "element [1, 129, 4] is nan")) << q.ToString();
    EXPECT_TRUE(std::all_of(w.begin(), w.end(), [](std::uint8_t x) { return x == 0xAA; }));
    EXPECT_TRUE(std::all_of(sc.begin(), sc.end(), [](float x) { return x == -1.0f; }));
    // A box without the NaN is fine; one with it names the full tensor's coordinates.
    EXPECT_TRUE(check_fp8_finite(src, {0, 2, 0, 128, 0, 5}, name, 7).ok());
    EXPECT_TRUE(has(check_fp8_finite(src, {1, 1, 128, 2, 0, 5}, name, 7), "element [1, 129, 4] is nan"));
  }
  {  // bf16 +Inf (0x7F80) and -Inf: the first in C order is named
    std::vector<std::byte> b = encode(DType::kBFloat16, std::vector<float>(R * C, 0.0f));
    const std::uint16_t inf = 0x7F80, ninf = 0xFF80;
    std::memcpy(b.data() + (3 * C + 1) * 2, &ninf, 2);
    std::memcpy(b.data() + (129 * C + 0) * 2, &inf, 2);
    const Fp8Source src = fp8_dense_source(DType::kBFloat16, b.data(), 1, R, C);
    EXPECT_TRUE(has(check_fp8_finite(src, fp8_whole_box(src), "w.weight", 12),
                    "weight version 12: element [3, 1] is -inf"));
    EXPECT_TRUE(has(check_fp8_finite(src, {0, 1, 128, 2, 0, 5}, "w.weight", 12), "element [129, 0] is inf;"));
    // An invalid box is refused as such, not scanned.
    EXPECT_TRUE(has(check_fp8_finite(src, {0, 1, 0, 130, 2, 3}, "w.weight", 12), "not a multiple of 128"));
  }
  {  // fp32 NaN, Inf, -Inf, and a negative NaN
    for (float bad : {std::nanf(""), kInf, -kInf, -std::nanf("")}) {
      std::vector<std::byte> b = encode(DType::kFloat32, {1.0f, 2.0f, bad, 3.0f});
      const Fp8Source src = fp8_dense_source(DType::kFloat32, b.data(), 1, 2, 2);
      const Status s = check_fp8_finite(src, fp8_whole_box(src), "emb.weight", 1);
      const std::string kind = std::isnan(bad) ? "nan" : bad > 0 ? "inf" : "-inf";
      EXPECT_TRUE(has(s, "tensor 'emb.weight' at weight version 1: element [1, 0] is " + kind + ";")) << s.ToString();
    }
  }
  // The report encoding the GPU shares: (index << 2) | kind, minimum = first.
  std::vector<std::byte> b = encode(DType::kFloat32, {1.0f, -kInf, std::nanf("")});
  const Fp8Source src = fp8_dense_source(DType::kFloat32, b.data(), 1, 1, 3);
  EXPECT_EQ(fp8_first_nonfinite(src, fp8_whole_box(src)), (1u << 2) | 2u);
  EXPECT_EQ(fp8_first_nonfinite(src, {0, 0, 0, 1, 0, 3}), kFp8AllFinite);
}

// ---- shapes and specs -------------------------------------------------------

// Catches: floor instead of ceiling, scales without the expert axis, a scale
// name other than <prefix>.weight_scale_inv, dtypes other than bf16/fp32
// accepted.
TEST(Fp8Block, ShapesAndSpecs) {
  EXPECT_EQ(fp8_block_shapes(0, 0).scale, std::vector<std::int64_t>({0, 0}));
  EXPECT_EQ(fp8_block_shapes(1, 1).scale, std::vector<std::int64_t>({1, 1}));
  EXPECT_EQ(fp8_block_shapes(128, 128).scale, std::vector<std::int64_t>({1, 1}));
  EXPECT_EQ(fp8_block_shapes(129, 256).scale, std::vector<std::int64_t>({2, 2}));
  EXPECT_EQ(fp8_block_shapes(4096, 11008).scale, std::vector<std::int64_t>({32, 86}));
  EXPECT_EQ(fp8_block_shapes(4096, 11008).weight, std::vector<std::int64_t>({4096, 11008}));

  auto specs = fp8_block_specs({"model.layers.0.mlp.down_proj.weight", DType::kBFloat16, {4096, 11008}});
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  EXPECT_EQ(specs->weight, (TensorSpec{"model.layers.0.mlp.down_proj.weight", DType::kFloat8E4M3FN, {4096, 11008}}));
  EXPECT_EQ(specs->scale, (TensorSpec{"model.layers.0.mlp.down_proj.weight_scale_inv", DType::kFloat32, {32, 86}}));
  auto stacked = fp8_block_specs({"experts.w2.weight", DType::kFloat32, {8, 130, 257}});
  ASSERT_TRUE(stacked.ok());
  EXPECT_EQ(stacked->weight.shape, std::vector<std::int64_t>({8, 130, 257}));
  EXPECT_EQ(stacked->scale.shape, std::vector<std::int64_t>({8, 2, 3}));

  EXPECT_TRUE(has(fp8_block_specs({"a.weight", DType::kFloat16, {4, 4}}).status(),
                  "tensor a.weight float16[4, 4] cannot be FP8 block quantized: "
                  "its dtype must be bfloat16 or float32"));
  EXPECT_TRUE(has(fp8_block_specs({"a.weight", DType::kBFloat16, {4}}).status(), "not 1-D"));
  EXPECT_TRUE(has(fp8_block_specs({"a.bias", DType::kBFloat16, {4, 4}}).status(), "<prefix>.weight"));
  EXPECT_TRUE(has(fp8_block_specs({".weight", DType::kBFloat16, {4, 4}}).status(), "<prefix>.weight"));
  EXPECT_TRUE(has(fp8_block_specs({"a.weight", DType::kBFloat16, {4, -1}}).status(), "negative dimension"));
}

// ---- against the slow reference ---------------------------------------------

// Catches: any difference from the format as written, on inputs the hand
// cases do not reach: every block kind, bf16 and fp32, partial blocks on
// both axes, stacked experts.
TEST(Fp8Block, MatchesTheSlowReferenceOnRandomInputs) {
  struct Shape {
    std::int64_t e, r, c;
  };
  const Shape shapes[] = {{1, 1, 1},   {1, 127, 129}, {1, 128, 128}, {1, 130, 257},
                          {1, 300, 260}, {3, 130, 129}, {2, 1, 300},   {1, 513, 5}};
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    for (std::uint64_t seed = 1; seed <= 2; ++seed) {
      for (const Shape& s : shapes) {
        const std::vector<std::byte> b = encode(dtype, random_values(dtype, seed * 1000 + s.r, s.e, s.r, s.c));
        const Quantized fast = quantize(dtype, b, s.e, s.r, s.c);
        const Quantized slow = slow_quantize(dtype, b, s.e, s.r, s.c);
        const std::string where = std::string(dtype_name(dtype)) + " [" + std::to_string(s.e) + ", " +
                                  std::to_string(s.r) + ", " + std::to_string(s.c) + "] seed " + std::to_string(seed);
        ASSERT_EQ(scale_bits(fast), scale_bits(slow)) << where;
        const auto mm = std::mismatch(fast.weight.begin(), fast.weight.end(), slow.weight.begin());
        ASSERT_TRUE(mm.first == fast.weight.end())
            << where << ": element " << (mm.first - fast.weight.begin()) << " fast 0x" << std::hex << int(*mm.first)
            << " slow 0x" << int(*mm.second);
      }
    }
  }
}

}  // namespace
}  // namespace refit
