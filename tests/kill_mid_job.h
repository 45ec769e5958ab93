// Test helper for kill -9 tests of whole jobs (GPU transports: the CPU ones
// are in failure_test.cc).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "job.h"

namespace refit::testing {

// Make the job's trainer `stopped` stop itself inside refit `refit` first
// (job.h's stop_mid_refit: --debug-stop-after-bucket). Waits for its line
// saying it sent its first bucket of that refit and stopped, so the kill is
// sure to land mid-refit; kills `victim` with SIGKILL and resumes `stopped`
// (unless it is the victim); then expects every other process to exit
// non-zero within `exit_within_s` naming the victim, and the report
// unverified with an error naming it. Fatal failures end the helper only:
// call it inside ASSERT_NO_FATAL_FAILURE.
inline void KillMidJobAndExpectEverySurvivorToNameIt(ProcessGroup& group, const std::string& victim,
                                                     double exit_within_s, const std::string& stopped,
                                                     std::uint64_t refit) {
  ASSERT_TRUE(wait_for_refit_under_way(group, stopped, refit)) << group.all_stderr();
  group.kill(victim, SIGKILL);
  if (stopped != victim) group.resume(stopped);
  ASSERT_TRUE(group.wait_all(exit_within_s)) << "a survivor hung:\n" << group.all_stderr();
  for (const auto& name : group.names()) {
    if (name == victim) continue;
    EXPECT_NE(group.exit_code(name), 0) << name << " exited 0 after " << victim << " died\n" << group.all_stderr();
    EXPECT_NE(group.err(name).find(victim), std::string::npos) << name << ":\n" << group.err(name);
  }
  const nlohmann::json report = nlohmann::json::parse(group.report());
  EXPECT_FALSE(report["verified"].get<bool>());
  EXPECT_NE(report["error"].get<std::string>().find(victim), std::string::npos) << report.dump();
}

}  // namespace refit::testing
