#include "refit/tensor.h"

#include <cstdint>
#include <limits>
#include <string>

namespace refit {
namespace {

// Product of the dims, or -1 when a dim is negative or the product overflows
// int64. A zero dim gives 0 whatever the other dims are.
std::int64_t checked_numel(const std::vector<std::int64_t>& shape) {
  bool zero = false;
  for (std::int64_t d : shape) {
    if (d < 0) return -1;
    if (d == 0) zero = true;
  }
  if (zero) return 0;
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

std::string shape_string(const TensorSpec& spec) {
  std::string out(dtype_name(spec.dtype));
  out += '[';
  for (std::size_t i = 0; i < spec.shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(spec.shape[i]);
  }
  out += ']';
  return out;
}

}  // namespace

// -1 for an invalid shape (negative dim or overflow); validate_spec rejects it.
std::int64_t TensorSpec::numel() const { return checked_numel(shape); }

std::string TensorSpec::ToString() const { return name + " " + shape_string(*this); }

Status validate_spec(const TensorSpec& spec) {
  if (spec.name.empty()) {
    return InvalidArgument("tensor spec " + shape_string(spec) + " has an empty name");
  }
  if (dtype_size(spec.dtype) == 0) {
    return InvalidArgument("tensor '" + spec.name + "' has an unknown dtype (value " +
                           std::to_string(static_cast<int>(spec.dtype)) + ")");
  }
  for (std::size_t i = 0; i < spec.shape.size(); ++i) {
    if (spec.shape[i] < 0) {
      return InvalidArgument("tensor '" + spec.name + "' " + shape_string(spec) + " has negative dimension " +
                             std::to_string(i) + " (" + std::to_string(spec.shape[i]) + ")");
    }
  }
  std::int64_t n = checked_numel(spec.shape);
  std::int64_t bytes = 0;
  if (n < 0 || __builtin_mul_overflow(n, static_cast<std::int64_t>(dtype_size(spec.dtype)), &bytes)) {
    return InvalidArgument("tensor '" + spec.name + "' " + shape_string(spec) +
                           " is too large: its byte size does not fit in 63 bits");
  }
  return Status::Ok();
}

}  // namespace refit
