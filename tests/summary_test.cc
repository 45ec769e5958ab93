// Every role says what it did when a job ends well (issue 17: "a one-line
// summary from each role on success"): each trainer and engine rank logs
// one line with the refits, their versions, its bytes and the time.
#include <gtest/gtest.h>

#include <string>

#include "job.h"
#include "testing/expect_has.h"

namespace refit {
namespace {

using testing::JobSpec;
using testing::ProcessGroup;
using testing::start_job;

// Catches: a role that ends silently on success (the summary dropped), a
// tally that counts another rank's refits or misses one (3 refits, versions
// 1..3), and an engine that claims verification it was not asked for.
TEST(Summary, EveryRankEndsAGoodJobWithOneLineOfWhatItDid) {
  ProcessGroup group;
  JobSpec spec;
  spec.refits = 3;
  spec.extra["engine rank 1"] = {"--no-verify"};
  ASSERT_TRUE(start_job(group, spec));
  ASSERT_TRUE(group.wait_all(60)) << group.all_stderr();
  for (const std::string& name : group.names()) {
    ASSERT_EQ(group.exit_code(name), 0) << name << "\n" << group.all_stderr();
  }
  for (const char* trainer : {"trainer rank 0", "trainer rank 1"}) {
    EXPECT_HAS(group.err(trainer), std::string(trainer) + ": 3 refits (versions 1..3) committed, ");
    EXPECT_HAS(group.err(trainer), " sent each (");
  }
  EXPECT_HAS(group.err("engine rank 0"), "engine rank 0: 3 refits (versions 1..3) committed and verified, ");
  EXPECT_HAS(group.err("engine rank 1"), "engine rank 1: 3 refits (versions 1..3) committed (not verified), ");
  EXPECT_HAS(group.err("engine rank 0"), " received each (");
}

}  // namespace
}  // namespace refit
