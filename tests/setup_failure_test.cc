// A rank that fails during setup tells the coordinator why (issue 17;
// runtime/setup_failure.h): before it joined, by a SetupFailed in place of
// a join; after, by a Failed on its control link. Every process then stops
// within seconds naming that rank and its reason, instead of waiting out
// the setup deadline (60 s here) and saying only "missing trainer rank 0".
// A rank whose command line the parser refuses (exit 2) reports it the same
// way when its --coordinator and --rank could be read (tools/refit/flags.h).
// After joining: DataPlaneAuth.ATrainerWithAnotherDataSecretCannotFeed
// (tests/fault_test.cc) checks that the reason reaches every process.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "job.h"
#include "testing/expect_has.h"

namespace refit {
namespace {

using testing::JobSpec;
using testing::ProcessGroup;
using testing::start_job;

using Clock = std::chrono::steady_clock;
// The deadline the mutations wait out, and the bound the job must end
// within: half of it, as ranks under TSan on a loaded 2-core machine take
// several seconds each to start (CI, 2026-12-05: over 10 s in all).
constexpr double kSetupTimeout = 60;
constexpr double kWithin = 30;

// Runs the job with `broken`'s extra flags and checks that every process
// ends within kWithin seconds, non-zero, and that the coordinator and every
// other rank name `broken` and `reason`.
void ExpectEveryProcessStopsNaming(const std::string& broken, const std::vector<std::string>& flags,
                                   const std::string& reason) {
  ProcessGroup group;
  JobSpec spec;
  spec.setup_timeout_s = kSetupTimeout;
  spec.extra[broken] = flags;
  const auto started = Clock::now();
  ASSERT_TRUE(start_job(group, spec));
  ASSERT_TRUE(group.wait_all(kSetupTimeout + 20)) << group.all_stderr();
  const double took = std::chrono::duration<double>(Clock::now() - started).count();
  EXPECT_LT(took, kWithin) << "the job waited for the setup deadline\n" << group.all_stderr();
  for (const std::string& name : group.names()) {
    EXPECT_NE(group.exit_code(name), 0) << name;
    if (name == broken) continue;
    EXPECT_HAS(group.err(name), broken);
    EXPECT_HAS(group.err(name), reason);
  }
  EXPECT_HAS(group.report(), broken);
}

// Catches: run_trainer without report_setup_failure (the others wait 60 s
// and say "missing trainer rank 0"); a coordinator that ignores a
// setup_failed (the same).
TEST(SetupFailure, ATrainerThatCannotOpenItsModelStopsEveryProcessNamingIt) {
  ExpectEveryProcessStopsNaming("trainer rank 0", {"--model", "/nonexistent/model.safetensors"},
                                "/nonexistent/model.safetensors");
}

// Catches: run_engine without report_setup_failure.
TEST(SetupFailure, AnEngineThatCannotOpenItsModelStopsEveryProcessNamingIt) {
  ExpectEveryProcessStopsNaming("engine rank 1", {"--model", "/nonexistent/model.safetensors"},
                                "/nonexistent/model.safetensors");
}

// Catches: main exiting 2 on a rank's refused command line without
// report_refused_command_line (the others wait 60 s and say "missing engine
// rank 1"), and a report that drops the parser's reason.
TEST(SetupFailure, AnEngineWhoseCommandLineIsRefusedStopsEveryProcessNamingIt) {
  ExpectEveryProcessStopsNaming("engine rank 1", {"--bucket-size", "0"}, "0 is not a bucket size");
}

}  // namespace
}  // namespace refit
