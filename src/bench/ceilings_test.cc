#include "refit/ceilings.h"

#include <gtest/gtest.h>

#include "cuda/device.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

// Catches: a memcpy ceiling that times nothing (0 GB/s) or divides by the
// wrong quantity (an infinite or negative figure).
TEST(Ceilings, MemcpyGivesAFiniteRate) {
  const double gbps = measure_memcpy_gbps(1 << 20, 3);
  EXPECT_GT(gbps, 0.0);
  EXPECT_LT(gbps, 1e6);
}

// Catches: the peer measurements accepting a device pair they cannot copy
// over (one device, a device outside the visible ones, from == to) instead
// of failing with the devices named. On a CPU build or a host with fewer
// than two devices both fail before copying anything.
TEST(Ceilings, PeerCopiesRefuseWhatTheyCannotMeasure) {
  auto same = measure_peer_copy_gbps(0, 0, 1 << 20, false, 1);
  EXPECT_FALSE(same.ok());
  auto far = measure_peer_pairs_gbps({{0, 4096}}, 1 << 20, 1);
  ASSERT_FALSE(far.ok());
  StatusOr<int> visible = cuda_device_count();
  if (visible.ok() && *visible >= 2) {
    EXPECT_NE(same.status().message().find("both device 0"), std::string::npos) << same.status().ToString();
    EXPECT_NE(far.status().message().find("0:4096"), std::string::npos) << far.status().ToString();
  }
}

}  // namespace
}  // namespace refit
