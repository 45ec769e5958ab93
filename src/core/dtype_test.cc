#include "refit/dtype.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace refit {
namespace {

struct Expected {
  DType dtype;
  const char* name;
  std::size_t size;
};

constexpr Expected kAll[] = {
    {DType::kBool, "bool", 1},          {DType::kUInt8, "uint8", 1},
    {DType::kInt8, "int8", 1},          {DType::kInt16, "int16", 2},
    {DType::kInt32, "int32", 4},        {DType::kInt64, "int64", 8},
    {DType::kFloat16, "float16", 2},    {DType::kBFloat16, "bfloat16", 2},
    {DType::kFloat32, "float32", 4},    {DType::kFloat64, "float64", 8},
    {DType::kFloat8E4M3FN, "float8_e4m3fn", 1}, {DType::kFloat8E5M2, "float8_e5m2", 1},
};

// catches: a wrong size or torch name in the table, a table out of enum order.
TEST(DType, SizeAndNameOfEveryDType) {
  static_assert(sizeof(kAll) / sizeof(kAll[0]) == kDTypeCount);
  std::set<std::string> names;
  for (const Expected& e : kAll) {
    EXPECT_EQ(dtype_size(e.dtype), e.size) << e.name;
    EXPECT_EQ(dtype_name(e.dtype), e.name);
    names.insert(std::string(dtype_name(e.dtype)));
  }
  EXPECT_EQ(names.size(), static_cast<std::size_t>(kDTypeCount));
}

// catches: parse_dtype not inverting dtype_name, "torch." prefix not accepted.
TEST(DType, NamesRoundTrip) {
  for (int i = 0; i < kDTypeCount; ++i) {
    auto d = static_cast<DType>(i);
    auto parsed = parse_dtype(dtype_name(d));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(*parsed, d);
    auto with_prefix = parse_dtype("torch." + std::string(dtype_name(d)));
    ASSERT_TRUE(with_prefix.ok()) << with_prefix.status().ToString();
    EXPECT_EQ(*with_prefix, d);
  }
}

// catches: silent fallback for unknown names, an error without the name or the known list.
TEST(DType, UnknownNameError) {
  for (const char* bad : {"bf16", "", "torch.", "Float32", "float8"}) {
    auto parsed = parse_dtype(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    const std::string m = parsed.status().message();
    // (appended, not "'" + std::string(bad) + "'": GCC 12 at -O3 reports
    // false array-bounds errors on that expression with the empty name)
    std::string quoted = "'";
    quoted.append(bad).append("'");
    EXPECT_NE(m.find(quoted), std::string::npos) << m;
    EXPECT_NE(m.find("bfloat16"), std::string::npos) << m;
    EXPECT_NE(m.find("float8_e5m2"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace refit
