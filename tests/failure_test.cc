// Failure behaviour: a killed process makes every other process exit non-zero
// within the refit deadline with an error naming the lost rank; the version in
// flight is never reported as committed; no shared memory segment is left
// behind (DESIGN.md: "a dead peer fails every rank with its name; the version
// is not bumped").
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "job.h"

namespace refit {
namespace {

using testing::JobSpec;
using testing::ProcessGroup;
using testing::start_job;

struct KillCase {
  std::string victim;     // process name
  std::string transport;
  int delay_ms;           // after the first refit committed
};

class KillTest : public ::testing::TestWithParam<KillCase> {};

// Catches: a rank that waits forever on a dead peer (no deadline / no abort
// propagation), a coordinator that commits without every rank, and shm
// segments that outlive their processes.
TEST_P(KillTest, EverySurvivorFailsNamingTheLostRank) {
  const KillCase& c = GetParam();
  JobSpec spec;
  spec.engine_ranks = 2;
  spec.trainer_ranks = 2;
  spec.refits = 1000;  // far more than will run: the kill lands mid-job
  spec.transport = c.transport;
  spec.refit_timeout_s = 10;
  ProcessGroup group;
  ASSERT_TRUE(start_job(group, spec));
  // Wait until the job is refitting, then kill the victim.
  ASSERT_TRUE(testing::wait_for_setup(group)) << group.all_stderr();
  std::this_thread::sleep_for(std::chrono::milliseconds(c.delay_ms));
  std::vector<pid_t> pids;
  for (const auto& n : group.names()) pids.push_back(group.proc(n).pid);
  group.kill(c.victim, SIGKILL);

  // Every survivor exits within the refit deadline (plus slack for startup).
  ASSERT_TRUE(group.wait_all(spec.refit_timeout_s + 10)) << "a survivor hung:\n" << group.all_stderr();
  for (const auto& name : group.names()) {
    if (name == c.victim) continue;
    EXPECT_NE(group.exit_code(name), 0) << name << " exited 0 after " << c.victim << " died\n" << group.all_stderr();
  }
  // The coordinator names the lost rank; so does every rank (via the abort).
  EXPECT_NE(group.err("coordinator").find("lost " + c.victim), std::string::npos) << group.all_stderr();
  for (const auto& name : group.names()) {
    if (name == c.victim || name == "coordinator") continue;
    EXPECT_NE(group.err(name).find(c.victim), std::string::npos) << name << ":\n" << group.err(name);
  }
  // The report lists only committed refits and the error; no refit past them.
  auto report = nlohmann::json::parse(group.report());
  EXPECT_FALSE(report["verified"].get<bool>());
  EXPECT_NE(report["error"].get<std::string>().find(c.victim), std::string::npos) << report.dump();
  const auto& refits = report["refits"];
  for (std::size_t i = 0; i < refits.size(); ++i) EXPECT_EQ(refits[i]["version"], i + 1);
  // Nothing left in /dev/shm by any process of the job (the pool's name is
  // removed once every trainer opened it, so even SIGKILL leaves nothing).
  for (pid_t pid : pids) EXPECT_TRUE(group.shm_left_by(pid).empty()) << "leftover shm of pid " << pid;
}

INSTANTIATE_TEST_SUITE_P(Roles, KillTest,
                         ::testing::Values(KillCase{"engine rank 1", "shm", 300}, KillCase{"trainer rank 0", "shm", 300},
                                           KillCase{"engine rank 0", "tcp", 500}, KillCase{"trainer rank 1", "tcp", 100},
                                           KillCase{"engine rank 1", "shm", 0}),
                         [](const auto& info) {
                           std::string v = info.param.victim;
                           for (char& ch : v) {
                             if (ch == ' ') ch = '_';
                           }
                           return v + "_" + info.param.transport + "_" + std::to_string(info.param.delay_ms) + "ms";
                         });

// DESIGN.md rules 2 and 8: a trainer that packs engine rank 0's shards for
// engine rank 1 (what a transposed payload list does) moves bytes of the right
// sizes and names — tiny's shards over 2 ranks are even, so no shape check
// can see it — and only verification by content catches it. The refit must
// fail with data_loss naming the tensor and the rank, and commit nothing.
// Catches: an engine that reports success without checking content, or
// content that does not depend on the global byte offset.
TEST(WrongRank, ShardsPackedForAnotherRankFailVerification) {
  JobSpec spec;
  spec.refits = 2;
  spec.extra["trainer rank 1"] = {"--debug-pack-rank", "0"};
  ProcessGroup group;
  ASSERT_TRUE(start_job(group, spec));
  ASSERT_TRUE(group.wait_all(60)) << group.all_stderr();
  EXPECT_NE(group.exit_code("coordinator"), 0);
  std::string err = group.err("coordinator");
  EXPECT_NE(err.find("data_loss"), std::string::npos) << err;
  EXPECT_NE(err.find("engine rank 1: tensor 'model.embed_tokens.weight' is wrong"), std::string::npos) << err;
  auto report = nlohmann::json::parse(group.report());
  EXPECT_FALSE(report["verified"].get<bool>());
  EXPECT_TRUE(report["refits"].empty()) << report.dump();
}

// Catches: a rank that keeps running after the coordinator died.
TEST(CoordinatorLost, EveryRankExitsNamingTheCoordinator) {
  JobSpec spec;
  spec.refits = 1000;
  ProcessGroup group;
  ASSERT_TRUE(start_job(group, spec));
  ASSERT_TRUE(testing::wait_for_setup(group)) << group.all_stderr();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  group.kill("coordinator", SIGKILL);
  ASSERT_TRUE(group.wait_all(spec.refit_timeout_s + 10)) << group.all_stderr();
  for (const auto& name : group.names()) {
    if (name == "coordinator") continue;
    EXPECT_NE(group.exit_code(name), 0) << name;
    EXPECT_NE(group.err(name).find("coordinator"), std::string::npos) << name << ":\n" << group.err(name);
  }
}

// Catches: a stalled (not dead) peer hanging the job: SIGSTOP one trainer;
// the refit deadline fails every other process, naming who did not answer.
TEST(StalledPeer, RefitDeadlineFailsEveryRank) {
  JobSpec spec;
  spec.refits = 1000;
  spec.refit_timeout_s = 3;
  // The refit times out; recovery then waits up to the setup deadline for the
  // stalled rank to relink (tests/recovery_test.cc: it resumes in time) and,
  // as it never does, ends the job on every rank.
  spec.setup_timeout_s = 8;
  ProcessGroup group;
  ASSERT_TRUE(start_job(group, spec));
  ASSERT_TRUE(testing::wait_for_setup(group)) << group.all_stderr();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  group.kill("trainer rank 1", SIGSTOP);
  bool others_exited = true;
  for (const auto& name : group.names()) {
    if (name == "trainer rank 1") continue;
    others_exited = group.wait_one(name, spec.refit_timeout_s + spec.setup_timeout_s + 10) && others_exited;
  }
  group.kill("trainer rank 1", SIGKILL);
  ASSERT_TRUE(others_exited) << group.all_stderr();
  EXPECT_NE(group.exit_code("coordinator"), 0);
  EXPECT_NE(group.err("coordinator").find("timed out"), std::string::npos) << group.err("coordinator");
  EXPECT_NE(group.err("coordinator").find("trainer rank 1"), std::string::npos) << group.err("coordinator");
}

}  // namespace
}  // namespace refit
