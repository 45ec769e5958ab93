// Faults by protocol step (issue 16, docs/RELIABILITY.md "Faults by
// protocol step"): every role (a trainer rank, an engine rank, the
// coordinator) is killed (SIGKILL) or stalled (SIGSTOP) at every step of
// refit 2 of 3 (start, ready, go, sent, done, commit, committed: where each
// hook fires is in refit/fault_hook.h). Whatever the schedule, the job's
// report, every surviving process's last line and every engine's saved file
// agree on the last committed version:
//
//   - the report (the file the coordinator keeps, written at every commit
//     decision before commit(v) goes out) names E: 2 once the coordinator
//     decided refit 2 (a fault at commit or committed), else 1;
//   - every rank that survives (a stalled one once continued) ends with
//     "(last committed here: refit K)" and K is E, or E - 1 when it says
//     refit E is in doubt (it reported done, then lost the coordinator
//     before the decision reached it: the window between the coordinator's
//     decision and its commit(v) arriving); never above E;
//   - no saved file (engines run with --save) claims a version above E, and
//     a surviving engine's file holds the version its last line names;
//   - a coordinator that survives (another role was faulted, or it was
//     stopped and continued) exits 1, and its last line is its error
//     naming refit 2 either committed (E = 2) or lost or aborted (E = 1).
//
// A stalled process is continued once the others have exited, as an
// operator's SIGCONT would: it then learns the job's end and exits too.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "job.h"
#include "refit/fault_hook.h"
#include "refit/safetensors.h"

namespace refit {
namespace {

using testing::JobSpec;
using testing::ProcessGroup;
using testing::start_job;
using testing::wait_for_text;

enum class Who { kTrainer, kEngine, kCoordinator };

struct FaultCase {
  Who who;
  ProtocolStep step;
  FaultAction action;
};

std::string process_name(Who who) {
  return who == Who::kTrainer ? "trainer rank 0" : who == Who::kEngine ? "engine rank 0" : "coordinator";
}

std::string case_name(const FaultCase& c) {
  const char* who = c.who == Who::kTrainer ? "trainer" : c.who == Who::kEngine ? "engine" : "coordinator";
  return std::string(who) + "_" + protocol_step_name(c.step) + "_" + (c.action == FaultAction::kKill ? "kill" : "stop");
}

// gtest prints a parameter with the test's name: the case, not its bytes.
void PrintTo(const FaultCase& c, std::ostream* out) { *out << case_name(c); }

// The refit_version an engine's --save file claims, or 0 without a file.
int SavedVersion(const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) return 0;
  auto it = file->metadata().find("refit_version");
  return it == file->metadata().end() ? 0 : std::stoi(it->second);
}

// The K of a rank's last "(last committed here: refit K)", or -1.
int StatedVersion(const std::string& err) {
  static const std::regex kStated(R"(\(last committed here: refit ([0-9]+)\))");
  int k = -1;
  for (auto it = std::sregex_iterator(err.begin(), err.end(), kStated); it != std::sregex_iterator(); ++it) {
    k = std::stoi((*it)[1]);
  }
  return k;
}

// The last line of `text` (without its newline).
std::string LastLine(std::string text) {
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text.substr(text.rfind('\n') + 1);  // npos + 1 == 0: the only line
}

// The committed version the coordinator's last line implies, or -1. The
// line is `refit coordinator: error: <the job's status>` (tools/refit/
// main.cc); the status (control/refit_phases.cc) names refit v as committed
// ("lost trainer rank 0 after refit 2 was committed (waiting for
// 'committed')", "refit 2 was committed, but the coordinator itself was
// stalled"), which is v, or as the refit it lost or aborted ("lost engine
// rank 0 during refit 2 (transfer)", "...; refit 2 aborted"), which leaves
// v - 1. The line names no other version.
int CoordinatorStatedVersion(const std::string& line) {
  static const std::regex kCommitted(R"(refit ([0-9]+) was committed)");
  static const std::regex kLost(R"(during refit ([0-9]+) \(|; refit ([0-9]+) aborted)");
  std::smatch m;
  if (std::regex_search(line, m, kCommitted)) return std::stoi(m[1]);
  if (std::regex_search(line, m, kLost)) return std::stoi(m[1].matched ? m[1].str() : m[2].str()) - 1;
  return -1;
}

const std::vector<std::string> kLiveness = {"--heartbeat-interval", "0.2", "--heartbeat-timeout", "2"};

class FaultStepTest : public ::testing::TestWithParam<FaultCase> {};

// Catches (each mutation tried once, the cases that turned red in brackets):
//  - a coordinator that writes its report only at the end, not at its
//    commit decision [every coordinator_*_kill: no report at all];
//  - an engine that applies refit v before commit(v) arrives [engine and
//    trainer stalls at go/sent/done, coordinator_sent/done/commit_stop,
//    coordinator_commit_kill: its line or file names 2, the report 1];
//  - a rank that, having lost the coordinator after its done, says refit v
//    failed instead of in doubt [coordinator_commit_kill and _stop];
//  - a coordinator whose error after its commit decision names the refit as
//    lost during it, not as committed (refit_phases.cc on_lost, kCommit
//    branch: "lost X during refit 2 (commit)") [the trainer and engine
//    commit and committed cases: the coordinator's last line implies 1, the
//    report says 2].
// The coordinator's own stall check (refit_phases.cc stalled_itself) is
// caught by refit_phases_liveness_test.cc; here the silence check alone
// already keeps a resumed coordinator from deciding.
TEST_P(FaultStepTest, ReportSurvivorsAndSavedFilesAgreeOnTheLastCommittedVersion) {
  const FaultCase& c = GetParam();
  const std::string faulty = process_name(c.who);
  const std::string hook = std::string(protocol_step_name(c.step)) + ":2:" +
                           (c.action == FaultAction::kKill ? "kill" : "stop");
  ProcessGroup group;
  JobSpec spec;
  spec.refits = 3;
  spec.setup_timeout_s = 20;
  spec.refit_timeout_s = 10;
  spec.rank_args = kLiveness;
  spec.coordinator_args = kLiveness;
  const std::string saved[2] = {group.dir() + "/engine0.safetensors", group.dir() + "/engine1.safetensors"};
  // Removed before the group removes its folder (it knows only its own files).
  struct RemoveSaved {
    const std::string* paths;
    ~RemoveSaved() {
      for (int e = 0; e < 2; ++e) std::remove(paths[e].c_str());
    }
  } remove_saved{saved};
  spec.extra["engine rank 0"] = {"--save", saved[0]};
  spec.extra["engine rank 1"] = {"--save", saved[1]};
  if (c.who == Who::kCoordinator) {
    spec.coordinator_args.insert(spec.coordinator_args.end(), {"--debug-fault", hook});
  } else {
    spec.extra[faulty].insert(spec.extra[faulty].end(), {"--debug-fault", hook});
  }
  ASSERT_TRUE(start_job(group, spec));
  const std::string line = std::string(c.action == FaultAction::kKill ? "SIGKILL" : "SIGSTOP") + " at step '" +
                           protocol_step_name(c.step) + "' of refit 2";
  ASSERT_TRUE(wait_for_text(group, faulty, line)) << group.all_stderr();

  // Every other process ends on its own: the fault is found (a closed
  // connection, or a peer silent past the heartbeat deadline) and the job ends.
  for (const std::string& name : group.names()) {
    if (name == faulty) continue;
    ASSERT_TRUE(group.wait_one(name, 40)) << name << " hung after the fault\n" << group.all_stderr();
  }
  if (c.action == FaultAction::kStop) group.resume(faulty);
  ASSERT_TRUE(group.wait_all(40)) << "a process hung\n" << group.all_stderr();

  const bool decided = c.step == ProtocolStep::kCommit || c.step == ProtocolStep::kCommitted;
  const int expected = decided ? 2 : 1;
  auto report = nlohmann::json::parse(group.report(), nullptr, false);
  ASSERT_TRUE(report.is_object()) << "no report\n" << group.all_stderr();
  EXPECT_EQ(report.value("committed_version", -1), expected) << report.dump(2) << "\n" << group.all_stderr();
  EXPECT_TRUE(report.contains("error")) << report.dump(2);
  EXPECT_FALSE(report.value("verified", true));

  const bool faulty_survives = c.action == FaultAction::kStop;
  for (const std::string& name : group.names()) {
    if (name == "coordinator" || (name == faulty && !faulty_survives)) continue;
    const std::string err = group.err(name);
    EXPECT_NE(group.exit_code(name), 0) << name << " exited 0 from a job that failed\n" << err;
    const int stated = StatedVersion(err);
    const bool in_doubt = err.find("refit " + std::to_string(expected) + " is in doubt here") != std::string::npos;
    EXPECT_TRUE(stated == expected || (in_doubt && stated == expected - 1))
        << name << " states refit " << stated << " committed, the report " << expected << "\n" << err;
    if (name.rfind("engine rank ", 0) == 0) {
      EXPECT_EQ(SavedVersion(saved[name.back() - '0']), stated) << name << "'s saved file disagrees with its line";
    }
  }
  for (const std::string& path : saved) {
    EXPECT_LE(SavedVersion(path), expected) << path << " claims a version that was not committed";
  }

  // The coordinator, where it survives, fails and says what it decided.
  if (c.who != Who::kCoordinator || c.action == FaultAction::kStop) {
    const std::string err = group.err("coordinator");
    const std::string last = LastLine(err);
    EXPECT_EQ(group.exit_code("coordinator"), 1) << "1: an error it reported (0: success, 128+N: signal N)\n" << err;
    EXPECT_EQ(last.rfind("refit coordinator: error: ", 0), 0u) << "its last line is not its error: " << last;
    EXPECT_EQ(CoordinatorStatedVersion(last), expected)
        << "the coordinator's last line implies refit " << CoordinatorStatedVersion(last)
        << " committed, the report " << expected << ": " << last;
  }
}

std::vector<FaultCase> EveryFault() {
  std::vector<FaultCase> cases;
  for (Who who : {Who::kTrainer, Who::kEngine, Who::kCoordinator}) {
    for (int s = 0; s < kProtocolStepCount; ++s) {
      for (FaultAction action : {FaultAction::kKill, FaultAction::kStop}) {
        cases.push_back({who, static_cast<ProtocolStep>(s), action});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(EveryRoleStepAndAction, FaultStepTest, ::testing::ValuesIn(EveryFault()),
                         [](const auto& info) { return case_name(info.param); });

}  // namespace
}  // namespace refit
