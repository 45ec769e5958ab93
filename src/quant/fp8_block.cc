// The CPU reference of FP8 block quantization (see fp8_block.h for the
// format). Written for clarity, not speed: the GPU kernel is the fast path,
// and this is what it is checked against.
#include "quant/fp8_block.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

namespace refit {
namespace {

constexpr std::uint32_t kFp32ExpMask = 0x7F800000u;
constexpr std::uint32_t kFp32Mag448 = 0x43E00000u;  // 448.0f = 1.75 * 2^8

// Element [m, r, c] of the box (box-relative) as fp32.
float load(const Fp8Source& s, const Fp8Box& b, std::int64_t m, std::int64_t r, std::int64_t c) {
  return fp8_source_element(s, b.matrix_begin + m, b.row_begin + r, b.col_begin + c);
}

std::string range(std::int64_t begin, std::int64_t n) {
  return "[" + std::to_string(begin) + ", " + std::to_string(begin + n) + ")";
}

std::string describe(const Fp8Source& s, const Fp8Box& b) {
  return "box matrices " + range(b.matrix_begin, b.matrices) + " x rows " + range(b.row_begin, b.rows) +
         " x columns " + range(b.col_begin, b.cols) + " of a " + std::string(dtype_name(s.dtype)) + " source of " +
         std::to_string(s.matrices) + " x " + std::to_string(s.rows) + " x " + std::to_string(s.cols);
}

// One dimension of the box: inside [0, n), begin on a block boundary, end on
// a block boundary or at n.
Status check_dim(std::string_view what, std::int64_t begin, std::int64_t count, std::int64_t n, bool blocked,
                 const std::string& where) {
  if (begin < 0 || count < 0 || begin > n || count > n - begin) {
    return InvalidArgument(std::string(what) + " " + range(begin, count) + " of the " + where +
                           " do not lie inside [0, " + std::to_string(n) + ")");
  }
  if (!blocked) return Status::Ok();
  if (begin % kFp8BlockSize != 0) {
    return InvalidArgument(std::string(what) + " of the " + where + " begin at " + std::to_string(begin) +
                           ", not a multiple of 128: a box must start on a block boundary");
  }
  const std::int64_t end = begin + count;
  if (end % kFp8BlockSize != 0 && end != n) {
    return InvalidArgument(std::string(what) + " of the " + where + " end at " + std::to_string(end) +
                           ", neither a multiple of 128 nor the source's end " + std::to_string(n) +
                           ": a box must end on a block boundary");
  }
  return Status::Ok();
}

const char* kind_name(std::uint64_t kind) {
  switch (kind) {
    case 0: return "nan";
    case 1: return "inf";
    default: return "-inf";
  }
}

// "element [r, c] is nan" ([m, r, c] when the source is stacked), in the
// full tensor's coordinates.
std::string nonfinite_element(const Fp8Source& s, const Fp8Box& b, std::uint64_t report) {
  const auto i = static_cast<std::int64_t>(report >> 2);
  const std::int64_t c = i % b.cols;
  const std::int64_t r = i / b.cols % b.rows;
  const std::int64_t m = i / b.cols / b.rows;
  std::string at = "[";
  if (s.matrices > 1) at += std::to_string(b.matrix_begin + m) + ", ";
  at += std::to_string(b.row_begin + r) + ", " + std::to_string(b.col_begin + c) + "]";
  return "element " + at + " is " + kind_name(report & 3);
}

}  // namespace

Fp8BlockShapes fp8_block_shapes(std::int64_t rows, std::int64_t cols) {
  return Fp8BlockShapes{{rows, cols}, {fp8_blocks(rows), fp8_blocks(cols)}};
}

StatusOr<Fp8BlockSpecs> fp8_block_specs(const TensorSpec& source) {
  RETURN_IF_ERROR(validate_spec(source));
  const std::string what = "tensor " + source.ToString() + " cannot be FP8 block quantized: ";
  if (source.dtype != DType::kBFloat16 && source.dtype != DType::kFloat32) {
    return InvalidArgument(what + "its dtype must be bfloat16 or float32");
  }
  if (source.shape.size() != 2 && source.shape.size() != 3) {
    return InvalidArgument(what + "it must be 2-D [R, C] or stacked experts [E, R, C], not " +
                           std::to_string(source.shape.size()) + "-D");
  }
  constexpr std::string_view kSuffix = ".weight";
  const std::string_view name = source.name;
  if (name.size() <= kSuffix.size() || name.substr(name.size() - kSuffix.size()) != kSuffix) {
    return InvalidArgument(what + "its name must be <prefix>.weight (the scales go to <prefix>.weight_scale_inv)");
  }
  const std::size_t n = source.shape.size();
  Fp8BlockShapes shapes = fp8_block_shapes(source.shape[n - 2], source.shape[n - 1]);
  if (n == 3) shapes.scale.insert(shapes.scale.begin(), source.shape[0]);
  return Fp8BlockSpecs{TensorSpec{source.name, DType::kFloat8E4M3FN, source.shape},
                       TensorSpec{source.name + "_scale_inv", DType::kFloat32, std::move(shapes.scale)}};
}

Fp8Source fp8_dense_source(DType dtype, const std::byte* data, std::int64_t matrices, std::int64_t rows,
                           std::int64_t cols) {
  return Fp8Source{dtype, data, matrices, rows, cols, cols, rows * cols};
}

Fp8Box fp8_whole_box(const Fp8Source& source) {
  return Fp8Box{0, source.matrices, 0, source.rows, 0, source.cols};
}

Status validate_fp8_box(const Fp8Source& s, const Fp8Box& b) {
  if (s.dtype != DType::kBFloat16 && s.dtype != DType::kFloat32) {
    return InvalidArgument("FP8 block quantization takes bfloat16 or float32 weights, not " +
                           std::string(dtype_name(s.dtype)));
  }
  const std::string where = describe(s, b);
  if (s.matrices < 0 || s.rows < 0 || s.cols < 0) return InvalidArgument("negative size in the " + where);
  if (s.row_stride < s.cols) {
    return InvalidArgument("row stride " + std::to_string(s.row_stride) + " is less than the " +
                           std::to_string(s.cols) + " columns of the " + where);
  }
  std::int64_t matrix_elems = 0;
  if (__builtin_mul_overflow(s.rows, s.row_stride, &matrix_elems)) {
    return InvalidArgument("rows x row stride overflows in the " + where);
  }
  if (s.matrices > 1 && s.matrix_stride < matrix_elems) {
    return InvalidArgument("matrix stride " + std::to_string(s.matrix_stride) + " is less than rows x row stride (" +
                           std::to_string(matrix_elems) + ") in the " + where);
  }
  // The last element's byte offset must fit in int64.
  std::int64_t span = 0, bytes = 0;
  if (s.matrices > 0 && s.rows > 0 && s.cols > 0 &&
      (__builtin_mul_overflow(s.matrices - 1, s.matrix_stride, &span) ||
       __builtin_add_overflow(span, matrix_elems, &span) ||
       __builtin_mul_overflow(span, static_cast<std::int64_t>(dtype_size(s.dtype)), &bytes))) {
    return InvalidArgument("the byte size overflows in the " + where);
  }
  RETURN_IF_ERROR(check_dim("matrices", b.matrix_begin, b.matrices, s.matrices, false, where));
  RETURN_IF_ERROR(check_dim("rows", b.row_begin, b.rows, s.rows, true, where));
  RETURN_IF_ERROR(check_dim("columns", b.col_begin, b.cols, s.cols, true, where));
  if (s.data == nullptr && b.elements() > 0) return InvalidArgument("null data for the " + where);
  return Status::Ok();
}

float bf16_to_float(std::uint16_t bits) { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

float fp8_source_element(const Fp8Source& s, std::int64_t m, std::int64_t r, std::int64_t c) {
  const std::int64_t i = m * s.matrix_stride + r * s.row_stride + c;
  if (s.dtype == DType::kBFloat16) {
    std::uint16_t bits;
    std::memcpy(&bits, s.data + i * 2, sizeof bits);
    return bf16_to_float(bits);
  }
  float x;
  std::memcpy(&x, s.data + i * 4, sizeof x);
  return x;
}

float fp8_block_scale(float amax) { return std::max(amax, kFp8ScaleFloor) / kFp8E4M3Max; }

std::uint8_t e4m3_from_float(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const std::uint32_t mag = bits & 0x7FFFFFFFu;
  if (mag > kFp32ExpMask) return sign | 0x7Fu;   // NaN
  if (mag >= kFp32Mag448) return sign | 0x7Eu;   // 448 and above, Inf: saturate
  const std::uint32_t exp = mag >> 23;           // biased fp32 exponent
  if (exp >= 121) {
    // |x| in [2^-6, 448): an e4m3 normal. e4m3 exponent bias 7, so the code's
    // exponent field is exp - 127 + 7; keep 3 of the 23 mantissa bits and
    // round the other 20 to nearest even (a carry moves into the exponent,
    // and the largest magnitude below 448 carries to 0x7E at most).
    std::uint32_t code = ((exp - 120) << 3) | ((mag >> 20) & 7u);
    const std::uint32_t rest = mag & 0xFFFFFu;
    if (rest > 0x80000u || (rest == 0x80000u && (code & 1u))) ++code;
    return static_cast<std::uint8_t>(sign | code);
  }
  // |x| < 2^-6: k * 2^-9 with k = |x| * 2^9 rounded to nearest even, 0..8
  // (8 is 0x08, the smallest normal). |x| = M * 2^(exp - 150) for a normal
  // fp32 (M with its implicit bit), so k = M >> (141 - exp) before rounding;
  // at shifts of 25 and more (and for fp32 subnormals) |x| < 2^-10: zero.
  if (exp == 0) return sign;
  const std::uint32_t shift = 141 - exp;
  if (shift >= 25) return sign;
  const std::uint32_t m = (mag & 0x7FFFFFu) | 0x800000u;
  std::uint32_t k = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1);
  const std::uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (k & 1u))) ++k;
  return static_cast<std::uint8_t>(sign | k);
}

float e4m3_to_float(std::uint8_t code) {
  const int e = (code >> 3) & 15;
  const int m = code & 7;
  if (e == 15 && m == 7) return std::nanf("");
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(static_cast<float>(8 + m), e - 10);
  return (code & 0x80) ? -mag : mag;
}

std::uint64_t fp8_first_nonfinite(const Fp8Source& s, const Fp8Box& b) {
  std::uint64_t i = 0;
  for (std::int64_t m = 0; m < b.matrices; ++m) {
    for (std::int64_t r = 0; r < b.rows; ++r) {
      for (std::int64_t c = 0; c < b.cols; ++c, ++i) {
        const std::uint32_t bits = std::bit_cast<std::uint32_t>(load(s, b, m, r, c));
        if ((bits & kFp32ExpMask) != kFp32ExpMask) continue;
        const std::uint64_t kind = (bits & 0x7FFFFFu) != 0 ? 0 : (bits >> 31) ? 2 : 1;
        return (i << 2) | kind;
      }
    }
  }
  return kFp8AllFinite;
}

Status fp8_nonfinite_status(const Fp8Source& source, const Fp8Box& box, std::uint64_t report,
                            std::string_view tensor, std::uint64_t version) {
  if (report == kFp8AllFinite) return Status::Ok();
  return InvalidArgument("tensor '" + std::string(tensor) + "' at weight version " + std::to_string(version) + ": " +
                         nonfinite_element(source, box, report) +
                         "; NaN and Inf are refused, never quantized to FP8 or sent");
}

Status check_fp8_finite(const Fp8Source& source, const Fp8Box& box, std::string_view tensor, std::uint64_t version) {
  RETURN_IF_ERROR(validate_fp8_box(source, box).WithContext("tensor '" + std::string(tensor) + "' at weight version " +
                                                            std::to_string(version)));
  return fp8_nonfinite_status(source, box, fp8_first_nonfinite(source, box), tensor, version);
}

Status quantize_fp8_block(const Fp8Source& s, const Fp8Box& b, std::span<std::uint8_t> weight,
                          std::span<float> scale) {
  RETURN_IF_ERROR(validate_fp8_box(s, b));
  if (weight.size() != static_cast<std::uint64_t>(b.elements()) ||
      scale.size() != static_cast<std::uint64_t>(b.scales())) {
    return InvalidArgument("FP8 block quantization of the " + describe(s, b) + " needs " +
                           std::to_string(b.elements()) + " codes and " + std::to_string(b.scales()) +
                           " scales, given " + std::to_string(weight.size()) + " and " +
                           std::to_string(scale.size()));
  }
  if (const std::uint64_t report = fp8_first_nonfinite(s, b); report != kFp8AllFinite) {
    return InvalidArgument("FP8 block quantization of the " + describe(s, b) + ": " +
                           nonfinite_element(s, b, report) + "; NaN and Inf are refused, never quantized");
  }
  const std::int64_t block_rows = fp8_blocks(b.rows), block_cols = fp8_blocks(b.cols);
  for (std::int64_t m = 0; m < b.matrices; ++m) {
    for (std::int64_t bi = 0; bi < block_rows; ++bi) {
      const std::int64_t r0 = bi * kFp8BlockSize, r1 = std::min(r0 + kFp8BlockSize, b.rows);
      for (std::int64_t bj = 0; bj < block_cols; ++bj) {
        const std::int64_t c0 = bj * kFp8BlockSize, c1 = std::min(c0 + kFp8BlockSize, b.cols);
        float amax = 0.0f;
        for (std::int64_t r = r0; r < r1; ++r) {
          for (std::int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(load(s, b, m, r, c)));
        }
        const float sc = fp8_block_scale(amax);
        scale[static_cast<std::size_t>((m * block_rows + bi) * block_cols + bj)] = sc;
        for (std::int64_t r = r0; r < r1; ++r) {
          std::uint8_t* row = weight.data() + (m * b.rows + r) * b.cols;
          for (std::int64_t c = c0; c < c1; ++c) row[c] = e4m3_from_float(load(s, b, m, r, c) / sc);
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace refit
