// Test helper for kill -9 tests of whole jobs (GPU transports: the CPU ones
// are in failure_test.cc).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "process_harness.h"

namespace refit::testing {

// Waits until the job's coordinator logged "setup complete", lets refits run
// for 1.5 s, kills `victim` with SIGKILL, then expects every other process
// to exit non-zero within `exit_within_s` naming the victim, and the report
// unverified with an error naming it. Fatal failures end the helper only:
// call it inside ASSERT_NO_FATAL_FAILURE.
inline void KillMidJobAndExpectEverySurvivorToNameIt(ProcessGroup& group, const std::string& victim,
                                                     double exit_within_s) {
  bool refitting = false;
  for (int i = 0; i < 12000 && !refitting; ++i) {
    refitting = group.err("coordinator").find("setup complete") != std::string::npos;
    if (group.wait_one("coordinator", 0)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(refitting) << group.all_stderr();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  group.kill(victim, SIGKILL);
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
