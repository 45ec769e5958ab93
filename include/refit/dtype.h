// Element types refit moves. Names are the torch dtype names ("bfloat16",
// "float8_e4m3fn", ...). refit never converts between dtypes: bytes move as
// they are (DESIGN.md rule 5: never promote). The one conversion is the one
// an engine declares with --quantize (quantize.h): bf16/fp32 weights into
// FP8 codes and scales, in a format defined bit for bit.
#pragma once

#include <cstddef>
#include <string_view>

#include "refit/status.h"

namespace refit {

enum class DType : unsigned char {
  kBool,
  kUInt8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kFloat8E4M3FN,
  kFloat8E5M2,
};

inline constexpr int kDTypeCount = 12;

// Bytes per element (1, 2, 4 or 8).
std::size_t dtype_size(DType dtype);

// The torch name, e.g. "bfloat16".
std::string_view dtype_name(DType dtype);

// Parses a torch name (also accepts "torch.bfloat16"). Unknown names give
// kInvalidArgument naming the string and the known names.
StatusOr<DType> parse_dtype(std::string_view name);

}  // namespace refit
