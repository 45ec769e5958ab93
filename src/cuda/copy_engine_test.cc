// Unit tests of group_for_copy_engine (pure host code; runs without a GPU).
#include <gtest/gtest.h>

#include <vector>

#include "cuda/copy_engine.h"

namespace refit {
namespace {

// Catches: adjacent runs not merged (thousands of tiny DMA copies for a
// checkpoint's back-to-back tensors), or merged when only one side continues
// (bytes written to the wrong place).
TEST(GroupForCopyEngine, MergesRunsThatContinueInBothSourceAndDestination) {
  std::vector<std::byte> src(1000), dst(1000);
  const std::vector<CopyRun> runs = {
      copy_run_1d(src.data(), dst.data(), 100),
      copy_run_1d(src.data() + 100, dst.data() + 100, 50),  // continues both: merged
      copy_run_1d(src.data() + 150, dst.data() + 400, 10),  // dst jumps: new copy
      copy_run_1d(src.data() + 500, dst.data() + 410, 10),  // src jumps: new copy
  };
  const CopyEngineRuns grouped = group_for_copy_engine(runs);
  ASSERT_EQ(grouped.flat.size(), 3u);
  EXPECT_EQ(grouped.flat[0].src, src.data());
  EXPECT_EQ(grouped.flat[0].dst, dst.data());
  EXPECT_EQ(grouped.flat[0].row_bytes, 150u);
  EXPECT_EQ(grouped.flat[1].dst, dst.data() + 400);
  EXPECT_EQ(grouped.flat[1].row_bytes, 10u);
  EXPECT_EQ(grouped.flat[2].src, src.data() + 500);
  EXPECT_TRUE(grouped.pitched.empty());
}

// Catches: a 2-D run with gaps flattened into one copy (the gaps' bytes
// copied, the rows misplaced), a gap-free 2-D run not flattened, an empty
// run sent to the driver.
TEST(GroupForCopyEngine, KeepsPitchedRunsAndDropsEmptyOnes) {
  std::vector<std::byte> src(4096), dst(4096);
  const std::vector<CopyRun> runs = {
      CopyRun{src.data(), dst.data(), 16, 8, 64, 16},          // strided source: pitched
      CopyRun{src.data() + 1024, dst.data() + 512, 32, 4, 32, 32},  // rows back to back: flat, 128 bytes
      CopyRun{src.data(), dst.data(), 0, 5, 0, 0},             // empty
      CopyRun{src.data(), dst.data(), 7, 0, 7, 7},             // empty
  };
  const CopyEngineRuns grouped = group_for_copy_engine(runs);
  ASSERT_EQ(grouped.pitched.size(), 1u);
  EXPECT_EQ(grouped.pitched[0].rows, 8u);
  EXPECT_EQ(grouped.pitched[0].src_pitch, 64u);
  ASSERT_EQ(grouped.flat.size(), 1u);
  EXPECT_EQ(grouped.flat[0].row_bytes, 128u);
  EXPECT_EQ(grouped.flat[0].rows, 1u);
}

}  // namespace
}  // namespace refit
