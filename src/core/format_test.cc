// Counts and durations in messages (refit/format.h).
#include "refit/format.h"

#include <gtest/gtest.h>

namespace refit {
namespace {

// Catches: "1 trainer ranks" (the plural kept for one, issue 17) and a
// plural dropped for zero or many.
TEST(FormatCount, OneIsSingularEveryOtherCountPlural) {
  EXPECT_EQ(format_count(1, "trainer rank"), "1 trainer rank");
  EXPECT_EQ(format_count(0, "slot"), "0 slots");
  EXPECT_EQ(format_count(3, "engine rank"), "3 engine ranks");
}

// Catches: std::to_string of a double ("60.000000 s", issue 17), trailing
// zeros kept ("0.500 s"), and an integral value that loses its last zero
// ("6 s" for 60).
TEST(FormatSeconds, NoTrailingZerosAtMostThreeDecimals) {
  EXPECT_EQ(format_seconds(60), "60 s");
  EXPECT_EQ(format_seconds(100), "100 s");
  EXPECT_EQ(format_seconds(0.5), "0.5 s");
  EXPECT_EQ(format_seconds(1.2344), "1.234 s");
  EXPECT_EQ(format_seconds(0.0001), "0 s");
  EXPECT_EQ(format_seconds(-0.0001), "0 s");
  EXPECT_EQ(format_seconds(2.5e6), "2500000 s");
}

}  // namespace
}  // namespace refit
