// End to end: synthetic weights that change like an optimizer step
// (`--change-fraction F`, issue 22 item 2) in real processes. The trainers
// generate, and the engines verify, every byte of each version under the
// same rule (content.h ContentKey), so a job verifies at any F, and ranks
// started with different fractions are refused at setup, named.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "job.h"
#include "process_harness.h"

namespace refit {
namespace {

using nlohmann::json;
using testing::JobSpec;
using testing::ProcessGroup;
using testing::run_refit;

// Full and FSDP trainers, 1% and 50%: every refit verified. Catches: an
// engine that checks the old content (every element of every version), a
// sharded source that keys its elements per shard, a fraction not passed
// from the demo to its ranks (the engines would verify the wrong bytes).
TEST(ChangeFractionJob, EveryRefitVerifiesAtAnyFraction) {
  for (const char* fraction : {"0.01", "0.5"}) {
    for (const std::vector<std::string>& layout :
         {std::vector<std::string>{}, std::vector<std::string>{"--trainer-layout", "fsdp", "--trainer-ranks", "3"}}) {
      std::vector<std::string> args = {"demo", "--json", "--model", "tiny", "--engine-ranks", "2", "--refits", "3",
                                       "--transport", "shm", "--change-fraction", fraction, "--timeout", "120"};
      args.insert(args.end(), layout.begin(), layout.end());
      auto r = run_refit(args);
      ASSERT_EQ(r.exit_code, 0) << fraction << "\n" << r.err << r.out;
      const json report = json::parse(r.out);
      EXPECT_TRUE(report["verified"].get<bool>()) << fraction;
      EXPECT_EQ(report["refits"].size(), 3u);
    }
  }
}

// A trainer rank at 1% beside engines at the default: refused at setup by
// the coordinator, naming both ranks and both fractions. Catches: the
// agreement check dropped (every refit would fail its verification instead,
// far from the cause), the fraction not sent in the join.
TEST(ChangeFractionJob, RanksThatDisagreeOnTheFractionAreRefusedNamingThem) {
  JobSpec spec;
  spec.extra["trainer rank 1"] = {"--change-fraction", "0.01"};
  ProcessGroup group;
  ASSERT_TRUE(testing::start_job(group, spec)) << group.all_stderr();
  ASSERT_TRUE(group.wait_all(60)) << group.all_stderr();
  EXPECT_NE(group.err("coordinator").find("change_fraction differs: engine rank 0 has --change-fraction 1, "
                                          "trainer rank 1 has --change-fraction 0.01"),
            std::string::npos)
      << group.err("coordinator");
}

}  // namespace
}  // namespace refit
