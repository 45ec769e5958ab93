#include "core/parallel_for.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "testing/expect_has.h"

namespace refit {
namespace {

// Catches: an index skipped or run twice (threads striding wrongly), or
// the work of the calling thread left out (tried once: work(0) removed
// failed it).
TEST(ParallelFor, RunsEveryIndexOnce) {
  for (const unsigned threads : {1u, 3u, 14u}) {
    std::vector<std::atomic<int>> hits(1000);
    ASSERT_TRUE(parallel_for(hits.size(), threads, [&](std::size_t i) {
                  hits[i].fetch_add(1);
                  return Status::Ok();
                }).ok());
    for (std::size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i << ", " << threads;
  }
  EXPECT_TRUE(parallel_for(0, 4, [](std::size_t) { return InvalidArgument("never called"); }).ok());
}

// Catches: an error dropped (a quantization that refused a NaN reported as
// done).
TEST(ParallelFor, ReturnsAnError) {
  const Status s = parallel_for(100, 4, [](std::size_t i) {
    return i == 37 ? InvalidArgument("index 37 refused") : Status::Ok();
  });
  EXPECT_HAS(s.message(), "index 37 refused");
}

}  // namespace
}  // namespace refit
