// The amax exchange's combination (control/amax_exchange.h).
#include "control/amax_exchange.h"

#include <gtest/gtest.h>

#include <vector>

#include "testing/expect_has.h"

namespace refit {
namespace {

// Catches: a combination by the last share instead of the largest amax,
// entries out of (tensor, block) order, or a block held by one share only
// dropped. 0x3F800000 is 1.0f, 0x40000000 2.0f: bits order as values.
// Tried once: the last share's bits kept instead of the max failed it.
TEST(CombineAmax, TheLargestAmaxOfEachBlockInBlockOrder) {
  const std::vector<std::vector<AmaxEntry>> shares = {
      {{1, 4, 0x40000000}, {0, 9, 0x3F800000}},
      {{1, 4, 0x3F800000}, {0, 2, 0}},
      {{0, 9, 0x40000000}},
  };
  auto table = combine_amax(shares);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  EXPECT_EQ(*table, (std::vector<AmaxEntry>{{0, 2, 0}, {0, 9, 0x40000000}, {1, 4, 0x40000000}}));
  auto none = combine_amax({{}, {}});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

// Catches: a NaN, Inf or negative amax combined (its bits would win or lose
// the max at random), and a share that lists a block twice accepted.
TEST(CombineAmax, RefusesAnAmaxThatIsNotFiniteAndNonNegativeAndARepeatedBlock) {
  EXPECT_HAS(combine_amax({{}, {{3, 7, 0x7F800000}}}).status().message(),
             "share 1: tensor 3, block 7: amax bits 0x7f800000 are not a finite value >= 0");
  EXPECT_HAS(combine_amax({{{0, 0, 0xBF800000}}}).status().message(), "0xbf800000 are not a finite value >= 0");
  EXPECT_HAS(combine_amax({{{2, 5, 1}, {2, 5, 2}}}).status().message(), "share 0: tensor 2, block 5 is listed twice");
}

}  // namespace
}  // namespace refit
