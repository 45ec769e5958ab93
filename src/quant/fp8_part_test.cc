// Tests of quantizing parts that cut 128-blocks (quant/fp8_part.h): the
// parts' codes and their owners' scales, after the amax exchange, put
// together equal the whole weight quantized by quant/fp8_block.h bit for bit.
#include "quant/fp8_part.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "testing/expect_has.h"

namespace refit {
namespace {

struct Weight3 {
  DType dtype;
  std::int64_t matrices, rows, cols;
  std::vector<std::byte> bytes;  // dense C order
};

Weight3 random_weight(DType dtype, std::int64_t e, std::int64_t r, std::int64_t c, std::mt19937& rng) {
  Weight3 w{dtype, e, r, c, std::vector<std::byte>(static_cast<std::size_t>(e * r * c) * dtype_size(dtype))};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-30.0f, 12.0f);
  for (std::size_t i = 0; i < static_cast<std::size_t>(e * r * c); ++i) {
    const float x = normal(rng) * std::exp2(std::floor(exponent(rng) / 8.0f));  // blocks of very different scales
    const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
    if (dtype == DType::kBFloat16) {
      const auto h = static_cast<std::uint16_t>(u >> 16);
      std::memcpy(w.bytes.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(w.bytes.data() + 4 * i, &u, 4);
    }
  }
  return w;
}

// A rank's part: rows [r0, r1) x columns [c0, c1) of every matrix, copied
// into memory of its own (as an FSDP or TP shard holds it).
struct Part {
  std::vector<std::byte> bytes;
  Fp8Part part;
};

Part cut(const Weight3& w, std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
  const std::size_t size = dtype_size(w.dtype);
  Part p{std::vector<std::byte>(static_cast<std::size_t>(w.matrices * (r1 - r0) * (c1 - c0)) * size), {}};
  // An empty part has no memory (data() may be null: no memcpy from or to it).
  for (std::int64_t m = 0, i = 0; m < w.matrices && c1 > c0; ++m) {
    for (std::int64_t r = r0; r < r1; ++r, ++i) {
      std::memcpy(p.bytes.data() + i * (c1 - c0) * size, w.bytes.data() + ((m * w.rows + r) * w.cols + c0) * size,
                  static_cast<std::size_t>(c1 - c0) * size);
    }
  }
  p.part = Fp8Part{fp8_dense_source(w.dtype, p.bytes.data(), w.matrices, r1 - r0, c1 - c0), r0, c0, w.rows, w.cols};
  return p;
}

// Cut points of n into `k` pieces at random places (some empty ones too).
std::vector<std::int64_t> cuts(std::int64_t n, int k, std::mt19937& rng) {
  std::vector<std::int64_t> at = {0, n};
  std::uniform_int_distribution<std::int64_t> any(0, n);
  for (int i = 1; i < k; ++i) at.push_back(any(rng));
  std::sort(at.begin(), at.end());
  return at;
}

// The whole protocol over a grid of parts: partial amax, the exchange (max
// per block of the weight), quantization; the parts' codes and the owners'
// scales assembled into the whole weight's arrays. Untouched scales stay
// NaN, so a scale nobody owns shows.
void QuantizeByParts(const Weight3& w, const std::vector<std::int64_t>& row_cuts,
                     const std::vector<std::int64_t>& col_cuts, std::vector<std::uint8_t>* codes,
                     std::vector<float>* scales) {
  const std::int64_t br = fp8_blocks(w.rows), bc = fp8_blocks(w.cols);
  std::vector<Part> parts;
  for (std::size_t i = 0; i + 1 < row_cuts.size(); ++i) {
    for (std::size_t j = 0; j + 1 < col_cuts.size(); ++j) {
      parts.push_back(cut(w, row_cuts[i], row_cuts[i + 1], col_cuts[j], col_cuts[j + 1]));
    }
  }
  std::vector<float> combined(static_cast<std::size_t>(w.matrices * br * bc), 0.0f);
  auto global = [&](const Fp8BlockRange& r, std::int64_t m, std::int64_t bi, std::int64_t bj) {
    return static_cast<std::size_t>((m * br + r.row_begin + bi) * bc + r.col_begin + bj);
  };
  for (const Part& p : parts) {
    const Fp8BlockRange r = fp8_part_blocks(p.part);
    std::vector<float> amax(static_cast<std::size_t>(r.blocks()));
    ASSERT_TRUE(fp8_part_amax(p.part, amax).ok());
    for (std::int64_t m = 0, b = 0; m < r.matrices; ++m) {
      for (std::int64_t bi = 0; bi < r.rows; ++bi) {
        for (std::int64_t bj = 0; bj < r.cols; ++bj, ++b) {
          float& c = combined[global(r, m, bi, bj)];
          c = std::max(c, amax[static_cast<std::size_t>(b)]);
        }
      }
    }
  }
  codes->assign(static_cast<std::size_t>(w.matrices * w.rows * w.cols), 0);
  scales->assign(combined.size(), std::numeric_limits<float>::quiet_NaN());
  for (const Part& p : parts) {
    const Fp8BlockRange r = fp8_part_blocks(p.part);
    std::vector<float> amax, scale(static_cast<std::size_t>(r.blocks()), -1.0f);
    for (std::int64_t m = 0; m < r.matrices; ++m) {
      for (std::int64_t bi = 0; bi < r.rows; ++bi) {
        for (std::int64_t bj = 0; bj < r.cols; ++bj) amax.push_back(combined[global(r, m, bi, bj)]);
      }
    }
    const Fp8Source& l = p.part.local;
    std::vector<std::uint8_t> mine(static_cast<std::size_t>(l.matrices * l.rows * l.cols));
    const Status s = quantize_fp8_part(p.part, amax, mine, scale);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (std::int64_t m = 0, i = 0; m < l.matrices; ++m) {
      for (std::int64_t row = 0; row < l.rows; ++row) {
        for (std::int64_t c = 0; c < l.cols; ++c, ++i) {
          (*codes)[static_cast<std::size_t>((m * w.rows + p.part.row_offset + row) * w.cols + p.part.col_offset + c)] =
              mine[static_cast<std::size_t>(i)];
        }
      }
    }
    for (std::int64_t m = 0, b = 0; m < r.matrices; ++m) {
      for (std::int64_t bi = 0; bi < r.rows; ++bi) {
        for (std::int64_t bj = 0; bj < r.cols; ++bj, ++b) {
          const bool owner = fp8_part_owns(p.part, r.row_begin + bi, r.col_begin + bj);
          const float got = scale[static_cast<std::size_t>(b)];
          if (!owner) {
            EXPECT_EQ(got, -1.0f) << "a part wrote the scale of a block it does not own";
            continue;
          }
          float& slot = (*scales)[global(r, m, bi, bj)];
          EXPECT_TRUE(std::isnan(slot)) << "two parts own block (" << m << ", " << r.row_begin + bi << ", "
                                        << r.col_begin + bj << ")";
          slot = got;
        }
      }
    }
  }
}

// Catches: a block index that ignores the part's offset (a part starting at
// row 100 puts its first rows in block row 0, not its own block 0), a
// scale taken from the part's own partial amax instead of the combined one,
// an owner rule that lets two parts or none write a scale, and a partial
// amax that skips the first or last row or column of a part. Tried once:
// `(p.row_offset + r)` replaced by `r` in block_of failed it, as did
// `fp8_block_scale(a)` computed from the part's own amax.
TEST(Fp8Part, PartsThatCutBlocksEqualTheWholeWeightBitForBit) {
  std::mt19937 rng(2029);
  for (int trial = 0; trial < 40; ++trial) {
    const DType dtype = trial % 2 == 0 ? DType::kBFloat16 : DType::kFloat32;
    const std::int64_t e = trial % 5 == 0 ? 3 : 1;
    std::uniform_int_distribution<std::int64_t> size(1, 420);
    const std::int64_t rows = size(rng), cols = size(rng);
    const Weight3 w = random_weight(dtype, e, rows, cols, rng);
    const std::vector<std::int64_t> row_cuts = cuts(rows, 1 + trial % 4, rng);
    const std::vector<std::int64_t> col_cuts = trial % 3 == 0 ? cuts(cols, 2, rng) : std::vector<std::int64_t>{0, cols};
    std::vector<std::uint8_t> codes;
    std::vector<float> scales;
    ASSERT_NO_FATAL_FAILURE(QuantizeByParts(w, row_cuts, col_cuts, &codes, &scales));
    const Fp8Source whole = fp8_dense_source(dtype, w.bytes.data(), e, rows, cols);
    const Fp8Box box = fp8_whole_box(whole);
    std::vector<std::uint8_t> want_codes(static_cast<std::size_t>(box.elements()));
    std::vector<float> want_scales(static_cast<std::size_t>(box.scales()));
    ASSERT_TRUE(quantize_fp8_block(whole, box, want_codes, want_scales).ok());
    ASSERT_EQ(codes, want_codes) << "trial " << trial << ": " << e << " x " << rows << " x " << cols;
    for (std::size_t i = 0; i < scales.size(); ++i) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(scales[i]), std::bit_cast<std::uint32_t>(want_scales[i]))
          << "trial " << trial << ", scale " << i;
    }
  }
}

// By hand: a 256 x 4 bf16 weight cut at row 100. Block row 0 spans both
// parts; its largest magnitude, 448, lies in the second part (row 120), so
// s = 1 and the first part's 1.0 must become code 0x38 (1.0), not what its
// own amax (1.0, s = 1/448) would give (0x7E, 448).
// Catches: quantizing a part with its partial amax.
TEST(Fp8Part, ThePartWithoutTheMaximumUsesTheCombinedScale) {
  std::vector<float> values(256 * 4, 0.5f);
  values[0] = 1.0f;
  values[120 * 4 + 2] = -448.0f;
  std::vector<std::byte> bytes(values.size() * 2);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto h = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(values[i]) >> 16);
    std::memcpy(bytes.data() + 2 * i, &h, 2);
  }
  const Fp8Part top{fp8_dense_source(DType::kBFloat16, bytes.data(), 1, 100, 4), 0, 0, 256, 4};
  const Fp8Part rest{fp8_dense_source(DType::kBFloat16, bytes.data() + 100 * 4 * 2, 1, 156, 4), 100, 0, 256, 4};
  float a_top = 0;
  ASSERT_TRUE(fp8_part_amax(top, {&a_top, 1}).ok());
  float rest_amax[2];  // rest touches block rows 0 and 1
  ASSERT_TRUE(fp8_part_amax(rest, rest_amax).ok());
  EXPECT_EQ(a_top, 1.0f);
  EXPECT_EQ(rest_amax[0], 448.0f);
  EXPECT_EQ(rest_amax[1], 0.5f);
  const float combined = std::max(a_top, rest_amax[0]);
  std::vector<std::uint8_t> codes(400);
  float scale = -1.0f;
  ASSERT_TRUE(quantize_fp8_part(top, {&combined, 1}, codes, {&scale, 1}).ok());
  EXPECT_EQ(codes[0], 0x38);  // 1.0 / 1.0
  EXPECT_EQ(scale, 1.0f);     // the top part owns block row 0
  EXPECT_TRUE(fp8_part_owns(top, 0, 0));
  EXPECT_FALSE(fp8_part_owns(rest, 0, 0));
  EXPECT_TRUE(fp8_part_owns(rest, 1, 0));
}

// Refusals name what is wrong: a NaN in the weight's coordinates, an amax
// that was not combined from every holder, a part outside its weight, spans
// of the wrong size. Catches: a refusal that names the part-relative row
// (the NaN at the part's row 2 is the weight's row 302).
TEST(Fp8Part, RefusalsNameTheElementAndTheReason) {
  std::vector<float> values(4 * 8, 0.25f);
  values[2 * 8 + 5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::byte> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  const Fp8Part part{fp8_dense_source(DType::kFloat32, bytes.data(), 1, 4, 8), 300, 0, 400, 8};
  float amax[2] = {0, 0};  // rows 300..303 lie in block row 2 only
  EXPECT_HAS(fp8_part_amax(part, {amax, 1}).message(), "element [302, 5] is nan");
  EXPECT_HAS(fp8_part_amax(part, amax).message(), "given 2 per-block values");
  values[2 * 8 + 5] = 0.25f;
  values[7] = -3.0f;
  std::memcpy(bytes.data(), values.data(), bytes.size());
  std::vector<std::uint8_t> codes(32);
  float small = 1.0f, scale = 0;
  EXPECT_HAS(quantize_fp8_part(part, {&small, 1}, codes, {&scale, 1}).message(),
             "element [300, 7] (-3.000000) exceeds its block's combined amax 1.000000");
  const float negative = -1.0f;
  EXPECT_HAS(quantize_fp8_part(part, {&negative, 1}, codes, {&scale, 1}).message(), "is not a finite value >= 0");
  const Fp8Part outside{part.local, 398, 0, 400, 8};
  EXPECT_HAS(validate_fp8_part(outside).message(), "rows [398, 402) x columns [0, 8) of a 400 x 8 weight");
}

// The GPU's report of a non-finite element (its index in the part's local
// C order, its kind in the low bits) decodes to fp8_part_amax's refusal of
// that element, word for word. Catches: the report decoded as a weight
// index, rows and columns swapped, -inf read as inf, a report past the part
// decoded instead of refused.
TEST(Fp8Part, ANonFiniteReportNamesWhatTheCpuStepNames) {
  std::vector<float> values(2 * 4 * 8, 0.25f);
  const Fp8Part part{fp8_dense_source(DType::kFloat32, nullptr, 2, 4, 8), 300, 16, 400, 40};
  const float kinds[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity()};
  for (std::uint64_t kind = 0; kind < 3; ++kind) {
    for (std::uint64_t i : {0u, 13u, 45u, 63u}) {
      std::vector<float> v = values;
      v[i] = kinds[kind];
      Fp8Part p = part;
      p.local.data = reinterpret_cast<const std::byte*>(v.data());
      std::vector<float> amax(static_cast<std::size_t>(fp8_part_blocks(p).blocks()));
      EXPECT_EQ(fp8_part_nonfinite_status(p, i << 2 | kind).ToString(), fp8_part_amax(p, amax).ToString());
    }
  }
  EXPECT_TRUE(fp8_part_nonfinite_status(part, kFp8AllFinite).ok());
  EXPECT_EQ(fp8_part_nonfinite_status(part, std::uint64_t{64} << 2).code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace refit
