#include "refit/dtype.h"

#include <array>
#include <string>

namespace refit {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::size_t size;
};

// Indexed by the enum's value; the order must follow dtype.h.
constexpr std::array<DTypeInfo, kDTypeCount> kDTypes = {{
    {DType::kBool, "bool", 1},
    {DType::kUInt8, "uint8", 1},
    {DType::kInt8, "int8", 1},
    {DType::kInt16, "int16", 2},
    {DType::kInt32, "int32", 4},
    {DType::kInt64, "int64", 8},
    {DType::kFloat16, "float16", 2},
    {DType::kBFloat16, "bfloat16", 2},
    {DType::kFloat32, "float32", 4},
    {DType::kFloat64, "float64", 8},
    {DType::kFloat8E4M3FN, "float8_e4m3fn", 1},
    {DType::kFloat8E5M2, "float8_e5m2", 1},
}};

constexpr bool table_in_enum_order() {
  for (std::size_t i = 0; i < kDTypes.size(); ++i) {
    if (static_cast<std::size_t>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(table_in_enum_order(), "kDTypes must be indexed by DType's value");

const DTypeInfo* find(DType dtype) {
  auto i = static_cast<std::size_t>(dtype);
  return i < kDTypes.size() ? &kDTypes[i] : nullptr;
}

}  // namespace

std::size_t dtype_size(DType dtype) {
  const DTypeInfo* info = find(dtype);
  return info ? info->size : 0;
}

std::string_view dtype_name(DType dtype) {
  const DTypeInfo* info = find(dtype);
  return info ? info->name : std::string_view("unknown_dtype");
}

StatusOr<DType> parse_dtype(std::string_view name) {
  std::string_view bare = name;
  if (bare.starts_with("torch.")) bare.remove_prefix(6);
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == bare) return info.dtype;
  }
  std::string known;
  for (const DTypeInfo& info : kDTypes) {
    if (!known.empty()) known += ", ";
    known += info.name;
  }
  return InvalidArgument("unknown dtype '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace refit
