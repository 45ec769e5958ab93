// The one commit decision (issue 16): once every engine rank reported refit
// v done, the coordinator decides v committed and records it; a rank killed
// (SIGKILL) or stalled (SIGSTOP) at the commit step afterwards is a lost rank
// of a committed version. The report, every surviving process's exit
// message and every engine's saved file (--save writes `refit_version`)
// agree on the last committed version; no saved file claims a version that
// was not committed. The fault hook (--debug-fault commit:2:kill|stop)
// fires on receiving the commit, before the engine applies or acknowledges
// it, and announces itself on stderr first. fault_step_test.cc runs every
// role x step x action; this test checks the commit step more closely.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "job.h"
#include "refit/safetensors.h"
#include "testing/expect_has.h"

namespace refit {
namespace {

using testing::JobSpec;
using testing::ProcessGroup;
using testing::start_job;

// The refit_version an engine's --save file claims, or -1 without a file.
int SavedVersion(const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) return -1;
  auto it = file->metadata().find("refit_version");
  return it == file->metadata().end() ? -1 : std::stoi(it->second);
}

// Waits (at most 60 s) until `name` wrote `line` to stderr.
bool WaitForLine(ProcessGroup& group, const std::string& name, const std::string& line) {
  for (int i = 0; i < 12000; ++i) {
    if (group.err(name).find(line) != std::string::npos) return true;
    if (group.wait_one(name, 0)) return group.err(name).find(line) != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

struct CommitFault {
  const char* hook;    // the engine's --debug-fault
  const char* signal;  // what it does, as it says on stderr
};

class CommitStepTest : public ::testing::TestWithParam<CommitFault> {};

// Engine rank 0 is killed or stalled at the commit of refit 2 (of 3).
// Catches: a coordinator that records the commit only once every rank
// acknowledged (the report would say 1 while engine rank 1 saved 2), one
// that aborts a committed version (the survivors would exit saying
// "refit aborted" instead of naming the committed version), and an engine
// that saves or bumps its version before the commit arrives (rank 0's
// file would say 2 after it died before applying it).
TEST_P(CommitStepTest, ReportSurvivorsAndSavedFilesAgreeOnTheCommittedVersion) {
  const CommitFault& fault = GetParam();
  const bool stall = std::string(fault.signal) == "SIGSTOP";
  ProcessGroup group;
  JobSpec spec;
  spec.refits = 3;
  spec.refit_timeout_s = 5;  // how long the coordinator waits for a stalled ack
  const std::string saved0 = group.dir() + "/engine0.safetensors", saved1 = group.dir() + "/engine1.safetensors";
  spec.extra["engine rank 0"] = {"--debug-fault", fault.hook, "--save", saved0};
  spec.extra["engine rank 1"] = {"--save", saved1};
  ASSERT_TRUE(start_job(group, spec));
  ASSERT_TRUE(WaitForLine(group, "engine rank 0", std::string("by ") + fault.signal + " at step 'commit' of refit 2"))
      << group.all_stderr();

  for (const std::string& name : group.names()) {
    if (name == "engine rank 0") continue;
    ASSERT_TRUE(group.wait_one(name, spec.refit_timeout_s + 30)) << name << " hung\n" << group.all_stderr();
  }
  if (stall) {
    // Resumed after the job ended: it received commit(2) before it stopped,
    // so it applies it, saves version 2 and exits naming the job's end.
    group.resume("engine rank 0");
  }
  ASSERT_TRUE(group.wait_all(30)) << group.all_stderr();

  auto report = nlohmann::json::parse(group.report(), nullptr, false);
  ASSERT_TRUE(report.is_object()) << group.report();
  EXPECT_EQ(report["committed_version"], 2) << report.dump(2);
  ASSERT_FALSE(report["refits"].empty()) << report.dump(2);
  EXPECT_EQ(report["refits"].back()["version"], 2) << report.dump(2);
  EXPECT_FALSE(report["verified"].get<bool>());
  EXPECT_HAS(report.value("error", std::string()), "engine rank 0");
  EXPECT_HAS(group.err("coordinator"), stall ? "refit 2 was committed, but refit 2 (commit) timed out waiting for "
                                               "'committed' from engine rank 0"
                                             : "lost engine rank 0 after refit 2 was committed");
  EXPECT_NE(group.exit_code("coordinator"), 0);

  // Every survivor agrees: refit 2 is committed, the job ended over engine rank 0.
  for (const char* name : {"trainer rank 0", "trainer rank 1", "engine rank 1"}) {
    EXPECT_NE(group.exit_code(name), 0) << name;
    EXPECT_HAS(group.err(name), "the coordinator ended the job with refit 2 committed");
    EXPECT_HAS(group.err(name), "engine rank 0");
    EXPECT_EQ(group.err(name).find("refit aborted"), std::string::npos) << name << ":\n" << group.err(name);
  }
  EXPECT_EQ(SavedVersion(saved1), 2) << "engine rank 1 saved another version";
  if (stall) {
    EXPECT_EQ(SavedVersion(saved0), 2) << "the resumed engine rank 0 did not apply the commit it received";
    EXPECT_HAS(group.err("engine rank 0"), "the coordinator ended the job with refit 2 committed");
  } else {
    // Killed before applying commit(2): its file still holds refit 1, never
    // a version beyond the committed one.
    EXPECT_EQ(SavedVersion(saved0), 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Faults, CommitStepTest,
                         ::testing::Values(CommitFault{"commit:2:kill", "SIGKILL"},
                                           CommitFault{"commit:2:stop", "SIGSTOP"}),
                         [](const auto& info) { return std::string(info.param.signal); });

}  // namespace
}  // namespace refit
