// FP8 block quantization (issue 20): the format, and its CPU reference.
//
// This file defines the format; the GPU kernel (src/cuda/fp8_block.h) must
// produce the same bytes, and its test checks that it does bit for bit.
//
// For a 2-D weight W [R, C] and block (i, j) = rows [128 i, 128 i + 128) x
// columns [128 j, 128 j + 128) (the last block of a row or column of blocks
// is partial when R or C is not a multiple of 128):
//
//   amax = max |W| over the block, in fp32 (exact: bf16 widens exactly)
//   s    = max(amax, 1e-12f) / 448.0f             fp32 division, nearest even
//   q    = e4m3fn(W_fp32 / s)                     fp32 division, nearest even;
//          the cast rounds to nearest even and saturates to +-448;
//          zeros keep their sign
//
// A stacked expert tensor [E, R, C] is E independent [R, C] weights (blocks
// never span two experts). The engine holds `<prefix>.weight` (e4m3fn, the
// source's shape) and `<prefix>.weight_scale_inv` (fp32, [ceil(R/128),
// ceil(C/128)], [E, ...] when stacked), holding s: W is approximately
// e4m3_to_float(q) * s.
//
// No fast math: the divisions are IEEE divisions and fp32 subnormals are not
// flushed. (The result does not depend on flushing: s >= 1e-12f / 448 keeps
// every subnormal input far below half the smallest e4m3 subnormal, 2^-10,
// so a subnormal input becomes a zero of its sign either way.)
//
// NaN and Inf are refused, never quantized: check_fp8_finite names the
// tensor and weight version; quantize_fp8_block refuses them too.
//
// Everything here is a pure function over memory the caller owns; distinct
// calls may run on distinct threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "refit/dtype.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit {

inline constexpr std::int64_t kFp8BlockSize = 128;
inline constexpr float kFp8E4M3Max = 448.0f;    // the largest finite e4m3fn value (code 0x7E)
inline constexpr float kFp8ScaleFloor = 1e-12f;  // amax below this gives s = kFp8ScaleFloor / 448

// ceil(n / 128): the blocks along a dimension of n elements. REQUIRES: n >= 0.
inline constexpr std::int64_t fp8_blocks(std::int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; }

// The shapes of a quantized [R, C] weight: the codes [R, C] and the scales
// [ceil(R/128), ceil(C/128)]. REQUIRES: rows, cols >= 0.
struct Fp8BlockShapes {
  std::vector<std::int64_t> weight;
  std::vector<std::int64_t> scale;
};
Fp8BlockShapes fp8_block_shapes(std::int64_t rows, std::int64_t cols);

// The engine's two tensors for the trainer weight `source`, which must be
// "<prefix>.weight", bfloat16 or float32, [R, C] or stacked [E, R, C]:
// "<prefix>.weight" float8_e4m3fn of the same shape and
// "<prefix>.weight_scale_inv" float32 [ceil(R/128), ceil(C/128)] (with E in
// front when stacked). kInvalidArgument naming the tensor otherwise.
struct Fp8BlockSpecs {
  TensorSpec weight;
  TensorSpec scale;
};
StatusOr<Fp8BlockSpecs> fp8_block_specs(const TensorSpec& source);

// A bf16 or fp32 source in memory: `matrices` row-major [rows, cols]
// matrices (1 for a 2-D weight, E for a stacked [E, R, C] tensor). Element
// [m, r, c] lies at data + (m * matrix_stride + r * row_stride + c) *
// dtype_size(dtype). Strides are in elements. The memory is the caller's
// (host memory here; device memory for quantize_fp8_block_device).
struct Fp8Source {
  DType dtype = DType::kBFloat16;   // kBFloat16 or kFloat32
  const std::byte* data = nullptr;  // element [0, 0, 0]
  std::int64_t matrices = 1;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t row_stride = 0;     // >= cols
  std::int64_t matrix_stride = 0;  // >= rows * row_stride (unused when matrices == 1)
};

// A dense C-order tensor [matrices, rows, cols].
Fp8Source fp8_dense_source(DType dtype, const std::byte* data, std::int64_t matrices, std::int64_t rows,
                           std::int64_t cols);

// The part of a source that one call quantizes: matrices [matrix_begin,
// matrix_begin + matrices) x rows [row_begin, row_begin + rows) x columns
// [col_begin, col_begin + cols). Its blocks are the source's own blocks: each
// begin is a multiple of 128, and each end is a multiple of 128 or the
// source's end, so the output of a box (a TP or EP shard) equals the same
// part of the whole tensor's output, computed in place from the full tensor.
struct Fp8Box {
  std::int64_t matrix_begin = 0;
  std::int64_t matrices = 0;
  std::int64_t row_begin = 0;
  std::int64_t rows = 0;
  std::int64_t col_begin = 0;
  std::int64_t cols = 0;

  std::int64_t elements() const { return matrices * rows * cols; }
  // Scales of the box: matrices * ceil(rows / 128) * ceil(cols / 128).
  std::int64_t scales() const { return matrices * fp8_blocks(rows) * fp8_blocks(cols); }
};

// The whole source.
Fp8Box fp8_whole_box(const Fp8Source& source);

// OK when `source` is well formed (dtype bf16 or fp32, sizes >= 0, strides
// that keep rows and matrices apart, data non-null unless empty) and `box`
// lies inside it on block boundaries as above; kInvalidArgument naming the
// offending value otherwise.
Status validate_fp8_box(const Fp8Source& source, const Fp8Box& box);

// Quantizes `box` of `source` into `weight` (e4m3fn codes, dense C-order
// [box.matrices, box.rows, box.cols]) and `scale` (fp32 s, dense
// [box.matrices, ceil(box.rows / 128), ceil(box.cols / 128)]).
// kInvalidArgument, writing nothing, when the box is invalid, a span's size
// is not box.elements() / box.scales(), or an element is NaN or Inf (the
// message names the element; callers add the tensor, or call
// check_fp8_finite first).
Status quantize_fp8_block(const Fp8Source& source, const Fp8Box& box, std::span<std::uint8_t> weight,
                          std::span<float> scale);

// OK when every element of `box` is finite; else kInvalidArgument naming
// `tensor`, weight `version`, the first non-finite element in the full
// tensor's coordinates ([r, c]; [m, r, c] when source.matrices > 1) and what
// it is (nan, inf, -inf). An invalid box gives validate_fp8_box's error.
Status check_fp8_finite(const Fp8Source& source, const Fp8Box& box, std::string_view tensor, std::uint64_t version);

// The non-finite report, shared with the GPU kernel: kFp8AllFinite, or
// (i << 2) | kind for the first non-finite element, where i is its index in
// the box's C order ((m * box.rows + r) * box.cols + c, box-relative) and
// kind is 0 for NaN, 1 for +Inf, 2 for -Inf. The smallest report is the
// first element, so a device can combine reports with an atomic minimum.
inline constexpr std::uint64_t kFp8AllFinite = ~std::uint64_t{0};
// REQUIRES: validate_fp8_box(source, box) is OK.
std::uint64_t fp8_first_nonfinite(const Fp8Source& source, const Fp8Box& box);
// OK for kFp8AllFinite; else check_fp8_finite's error for that report.
Status fp8_nonfinite_status(const Fp8Source& source, const Fp8Box& box, std::uint64_t report,
                            std::string_view tensor, std::uint64_t version);

// The scale of a block whose largest magnitude is `amax` (finite, >= 0):
// max(amax, 1e-12f) / 448.0f.
float fp8_block_scale(float amax);

// fp32 -> e4m3fn code: round to nearest even, saturating to +-448 (0x7E,
// 0xFE) for every larger magnitude and for +-Inf; the sign of zero is kept;
// NaN gives 0x7F (0xFF when negative), though the format never quantizes NaN.
std::uint8_t e4m3_from_float(float x);

// e4m3fn code -> its value (NaN for 0x7F and 0xFF).
float e4m3_to_float(std::uint8_t code);

// bfloat16 bits -> fp32 (exact).
float bf16_to_float(std::uint16_t bits);

// Element [m, r, c] of `source`'s memory as fp32 (exact). REQUIRES: the
// element lies inside the source.
float fp8_source_element(const Fp8Source& source, std::int64_t m, std::int64_t r, std::int64_t c);

}  // namespace refit
