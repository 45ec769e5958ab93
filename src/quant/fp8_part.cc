// FP8 block quantization of a part that may cut blocks: see fp8_part.h.
// Written for clarity, as fp8_block.cc: this is the reference.
#include "quant/fp8_part.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace refit {
namespace {

// Element [m, r, c] of the part's own memory as fp32.
float load(const Fp8Source& s, std::int64_t m, std::int64_t r, std::int64_t c) { return fp8_source_element(s, m, r, c); }

std::string where(const Fp8Part& p) {
  return "part of rows [" + std::to_string(p.row_offset) + ", " + std::to_string(p.row_offset + p.local.rows) +
         ") x columns [" + std::to_string(p.col_offset) + ", " + std::to_string(p.col_offset + p.local.cols) +
         ") of a " + std::to_string(p.full_rows) + " x " + std::to_string(p.full_cols) + " weight";
}

// "element [r, c]" ([m, r, c] for stacked parts) in the weight's coordinates.
std::string element(const Fp8Part& p, std::int64_t m, std::int64_t r, std::int64_t c) {
  const std::string rc = std::to_string(p.row_offset + r) + ", " + std::to_string(p.col_offset + c);
  return "element [" + (p.local.matrices > 1 ? std::to_string(m) + ", " : std::string()) + rc + "]";
}

// Index of the touched block holding the part's element [m, r, c].
std::int64_t block_of(const Fp8Part& p, const Fp8BlockRange& range, std::int64_t m, std::int64_t r,
                      std::int64_t c) {
  const std::int64_t bi = (p.row_offset + r) / kFp8BlockSize - range.row_begin;
  const std::int64_t bj = (p.col_offset + c) / kFp8BlockSize - range.col_begin;
  return (m * range.rows + bi) * range.cols + bj;
}

// The refusal of a NaN (kind 0), Inf (1) or -Inf (2) at local [m, r, c].
Status nonfinite(const Fp8Part& p, std::int64_t m, std::int64_t r, std::int64_t c, int kind) {
  constexpr const char* kKinds[] = {"nan", "inf", "-inf"};
  return InvalidArgument(element(p, m, r, c) + " is " + kKinds[kind] +
                         "; NaN and Inf are refused, never quantized to FP8 or sent");
}

Status check_sizes(const Fp8Part& p, std::span<const float> per_block, std::uint64_t elements) {
  RETURN_IF_ERROR(validate_fp8_part(p));
  const Fp8BlockRange range = fp8_part_blocks(p);
  if (per_block.size() != static_cast<std::uint64_t>(range.blocks()) ||
      elements != static_cast<std::uint64_t>(p.local.matrices * p.local.rows * p.local.cols)) {
    return InvalidArgument("FP8 quantization of the " + where(p) + " touches " + std::to_string(range.blocks()) +
                           " blocks and holds " + std::to_string(p.local.matrices * p.local.rows * p.local.cols) +
                           " elements, given " + std::to_string(per_block.size()) + " per-block values and " +
                           std::to_string(elements) + " codes");
  }
  return Status::Ok();
}

}  // namespace

Status validate_fp8_part(const Fp8Part& p) {
  RETURN_IF_ERROR(validate_fp8_box(p.local, Fp8Box{0, p.local.matrices, 0, p.local.rows, 0, p.local.cols}));
  if (p.full_rows < 0 || p.full_cols < 0 || p.row_offset < 0 || p.col_offset < 0 ||
      p.row_offset > p.full_rows - p.local.rows || p.col_offset > p.full_cols - p.local.cols) {
    return InvalidArgument("the " + where(p) + " does not lie inside the weight");
  }
  return Status::Ok();
}

Fp8BlockRange fp8_part_blocks(const Fp8Part& p) {
  if (p.local.matrices == 0 || p.local.rows == 0 || p.local.cols == 0) return Fp8BlockRange{};
  Fp8BlockRange range;
  range.row_begin = p.row_offset / kFp8BlockSize;
  range.rows = (p.row_offset + p.local.rows - 1) / kFp8BlockSize - range.row_begin + 1;
  range.col_begin = p.col_offset / kFp8BlockSize;
  range.cols = (p.col_offset + p.local.cols - 1) / kFp8BlockSize - range.col_begin + 1;
  range.matrices = p.local.matrices;
  return range;
}

Status fp8_part_nonfinite_status(const Fp8Part& p, std::uint64_t report) {
  if (report == kFp8AllFinite) return Status::Ok();
  const auto i = static_cast<std::int64_t>(report >> 2);
  const std::int64_t per_matrix = p.local.rows * p.local.cols;
  if (per_matrix == 0 || i >= p.local.matrices * per_matrix || (report & 3) == 3) {
    return Internal("a non-finite report " + std::to_string(report) + " outside the " + where(p));
  }
  return nonfinite(p, i / per_matrix, i % per_matrix / p.local.cols, i % p.local.cols, static_cast<int>(report & 3));
}

bool fp8_part_owns(const Fp8Part& p, std::int64_t block_row, std::int64_t block_col) {
  const std::int64_t r = block_row * kFp8BlockSize, c = block_col * kFp8BlockSize;
  return r >= p.row_offset && r < p.row_offset + p.local.rows && c >= p.col_offset &&
         c < p.col_offset + p.local.cols;
}

Status fp8_part_amax(const Fp8Part& p, std::span<float> amax) {
  RETURN_IF_ERROR(check_sizes(p, amax, static_cast<std::uint64_t>(p.local.matrices * p.local.rows * p.local.cols)));
  const Fp8BlockRange range = fp8_part_blocks(p);
  std::vector<float> out(amax.size(), 0.0f);
  for (std::int64_t m = 0; m < p.local.matrices; ++m) {
    for (std::int64_t r = 0; r < p.local.rows; ++r) {
      for (std::int64_t c = 0; c < p.local.cols; ++c) {
        const float x = load(p.local, m, r, c);
        if (!std::isfinite(x)) return nonfinite(p, m, r, c, std::isnan(x) ? 0 : x > 0 ? 1 : 2);
        float& a = out[static_cast<std::size_t>(block_of(p, range, m, r, c))];
        a = std::max(a, std::fabs(x));
      }
    }
  }
  std::copy(out.begin(), out.end(), amax.begin());
  return Status::Ok();
}

Status quantize_fp8_part(const Fp8Part& p, std::span<const float> amax, std::span<std::uint8_t> codes,
                         std::span<float> scales) {
  RETURN_IF_ERROR(check_sizes(p, amax, codes.size()));
  if (scales.size() != amax.size()) {
    return InvalidArgument("FP8 quantization of the " + where(p) + ": " + std::to_string(amax.size()) +
                           " amax values but room for " + std::to_string(scales.size()) + " scales");
  }
  const Fp8BlockRange range = fp8_part_blocks(p);
  for (std::size_t b = 0; b < amax.size(); ++b) {
    if (!(amax[b] >= 0.0f) || !std::isfinite(amax[b])) {
      return InvalidArgument("FP8 quantization of the " + where(p) + ": block amax " + std::to_string(amax[b]) +
                             " (touched block " + std::to_string(b) + ") is not a finite value >= 0");
    }
  }
  std::vector<std::uint8_t> out(codes.size());
  for (std::int64_t m = 0, i = 0; m < p.local.matrices; ++m) {
    for (std::int64_t r = 0; r < p.local.rows; ++r) {
      for (std::int64_t c = 0; c < p.local.cols; ++c, ++i) {
        const float x = load(p.local, m, r, c);
        const float a = amax[static_cast<std::size_t>(block_of(p, range, m, r, c))];
        if (!(std::fabs(x) <= a)) {  // NaN fails too
          return InvalidArgument("FP8 quantization of the " + where(p) + ": " + element(p, m, r, c) + " (" +
                                 std::to_string(x) + ") exceeds its block's combined amax " + std::to_string(a) +
                                 ": the amax was not combined from every rank that holds the block");
        }
        out[static_cast<std::size_t>(i)] = e4m3_from_float(x / fp8_block_scale(a));
      }
    }
  }
  std::copy(out.begin(), out.end(), codes.begin());
  for (std::int64_t m = 0; m < range.matrices; ++m) {
    for (std::int64_t bi = 0; bi < range.rows; ++bi) {
      for (std::int64_t bj = 0; bj < range.cols; ++bj) {
        if (!fp8_part_owns(p, range.row_begin + bi, range.col_begin + bj)) continue;
        const auto b = static_cast<std::size_t>((m * range.rows + bi) * range.cols + bj);
        scales[b] = fp8_block_scale(amax[b]);
      }
    }
  }
  return Status::Ok();
}

}  // namespace refit
