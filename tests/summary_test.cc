// Every role says what it did when a job ends well (issue 17: "a one-line
// summary from each role on success"): each trainer and engine rank logs
// one line with the refits, their versions, its bytes and the time, and so
// does the coordinator, for the whole job.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "job.h"
#include "refit/plan.h"
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
  EXPECT_HAS(group.err("coordinator"),
             "refit coordinator: 3 refits (versions 1..3) committed (not every byte verified), ");
}

// Catches: a coordinator that ends a good job silently (the summary line
// dropped from Coordinator::run), and one that tallies other bytes than the
// job's per refit (every engine rank's stream; mutation: tally_.add of
// bytes_per_refit() / engine_ranks in src/control/coordinator.cc).
TEST(Summary, TheCoordinatorEndsAGoodJobWithOneLineOfTheWholeJob) {
  ProcessGroup group;
  JobSpec spec;  // 2 engine ranks, 2 refits, every engine verifying
  ASSERT_TRUE(start_job(group, spec));
  ASSERT_TRUE(group.wait_all(60)) << group.all_stderr();
  ASSERT_EQ(group.exit_code("coordinator"), 0) << group.all_stderr();
  const auto report = nlohmann::json::parse(group.report(), nullptr, false);
  ASSERT_TRUE(report.is_object() && report.contains("bytes_per_refit")) << group.report();
  const auto bytes = report["bytes_per_refit"].get<std::uint64_t>();
  EXPECT_HAS(group.err("coordinator"), "refit coordinator: 2 refits (versions 1..2) committed and verified, " +
                                           format_bytes(bytes) + " moved each (" + format_bytes(2 * bytes) +
                                           " in all), ");
  EXPECT_HAS(group.err("coordinator"), " s from setup to the last commit");
}

}  // namespace
}  // namespace refit
