#include "control/gpu_sharing.h"

#include <gtest/gtest.h>

namespace refit {
namespace {

// Catches: a warning for ranks on GPUs of their own, for ranks without a GPU
// (CPU ranks report ""), a shared GPU that goes unnamed, or a warning that
// does not name every rank on it.
TEST(GpuSharing, EveryGpuWithTwoOrMoreRanksIsNamedWithItsRanks) {
  const std::vector<RankGpu> ranks = {{"engine rank 0", "GPU-a"},  {"engine rank 1", "GPU-b"},
                                      {"trainer rank 0", "GPU-b"}, {"trainer rank 1", "GPU-a"},
                                      {"trainer rank 2", "GPU-a"}, {"engine rank 2", "GPU-c"},
                                      {"trainer rank 3", ""},      {"engine rank 3", ""}};
  const auto warnings = shared_gpu_warnings(ranks);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_EQ(warnings[0].rfind("warning: engine rank 0, trainer rank 1 and trainer rank 2 share GPU GPU-a: ", 0), 0u)
      << warnings[0];
  EXPECT_EQ(warnings[1].rfind("warning: engine rank 1 and trainer rank 0 share GPU GPU-b: ", 0), 0u) << warnings[1];
  EXPECT_NE(warnings[1].find("--transport cuda_ipc"), std::string::npos) << warnings[1];
}

TEST(GpuSharing, RanksOnGpusOfTheirOwnOrOnNoGpuGetNoWarning) {
  EXPECT_TRUE(shared_gpu_warnings({{"engine rank 0", "GPU-a"}, {"trainer rank 0", "GPU-b"}}).empty());
  EXPECT_TRUE(shared_gpu_warnings({{"engine rank 0", ""}, {"trainer rank 0", ""}}).empty());
  EXPECT_TRUE(shared_gpu_warnings({}).empty());
}

}  // namespace
}  // namespace refit
