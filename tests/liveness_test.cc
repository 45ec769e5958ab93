// Every wait has a deadline (issue 16, item 2): heartbeats between the
// coordinator and every rank find a stalled (SIGSTOP) peer within the
// heartbeat deadline, idle or not. Every test here sets refit and setup
// deadlines of a minute and a heartbeat deadline of 2 s, so only liveness
// can end the waits as soon as the tests demand. A stopped process's
// threads all stop, its heartbeat thread included: that is what a stall is.
// Synchronised on log lines and on calls returning, never on sleeps.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <vector>

#include "job.h"
#include "refit/safetensors.h"
#include "refit/trainer_rank.h"
#include "testing/status_matchers.h"
#include "testing/expect_has.h"

namespace refit {
namespace {

using testing::JobSpec;
using testing::ProcessGroup;
using testing::start_job;
using Clock = std::chrono::steady_clock;

constexpr double kHeartbeatTimeout = 2;
// "About the heartbeat deadline": the deadline plus room for a loaded
// machine; far below the 60 s refit deadline.
constexpr double kWithin = kHeartbeatTimeout + 8;
const std::vector<std::string> kLiveness = {"--heartbeat-interval", "0.2", "--heartbeat-timeout", "2"};

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Waits (at most 60 s) until `name` wrote `line` to stderr.
bool WaitForLine(ProcessGroup& group, const std::string& name, const std::string& line) {
  for (int i = 0; i < 12000; ++i) {
    if (group.err(name).find(line) != std::string::npos) return true;
    if (group.wait_one(name, 0)) return group.err(name).find(line) != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// Waits (at most 60 s) until the engine's --save file claims `version`.
bool WaitForSavedVersion(const std::string& path, int version) {
  for (int i = 0; i < 12000; ++i) {
    if (auto file = SafetensorsFile::Open(path); file.ok()) {
      auto it = file->metadata().find("refit_version");
      if (it != file->metadata().end() && it->second == std::to_string(version)) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// An on-demand job: a coordinator and one engine rank as processes, the one
// trainer rank in this process (as a Python Trainer would be).
struct OnDemandJob {
  ProcessGroup group;
  std::unique_ptr<TrainerRank> trainer;

  // `engine_args`: extra flags of the engine rank.
  Status Start(const std::vector<std::string>& engine_args = {}) {
    std::vector<std::string> coordinator = {"--refits", "0", "--trainer-ranks", "1", "--engine-ranks", "1",
                                            "--setup-timeout", "60", "--timeout", "60"};
    coordinator.insert(coordinator.end(), kLiveness.begin(), kLiveness.end());
    const std::string address = group.spawn_coordinator(coordinator);
    if (address.empty()) return Internal("the coordinator did not listen");
    std::vector<std::string> engine = {"engine", "--coordinator", address, "--rank", "0", "--trainer-ranks", "1",
                                       "--engine-ranks", "1", "--model", "tiny", "--setup-timeout", "60",
                                       "--timeout", "60"};
    engine.insert(engine.end(), kLiveness.begin(), kLiveness.end());
    engine.insert(engine.end(), engine_args.begin(), engine_args.end());
    group.spawn("engine rank 0", engine);
    RankOptions options;
    options.coordinator = address;
    options.model = "tiny";
    options.setup_timeout_s = 60;
    options.refit_timeout_s = 60;
    options.heartbeat_interval_s = 0.2;
    options.heartbeat_timeout_s = kHeartbeatTimeout;
    ASSIGN_OR_RETURN(auto source, make_rank_source(options));
    ASSIGN_OR_RETURN(trainer, TrainerRank::Join(options, std::move(source)));
    return Status::Ok();
  }
};

// The tester's case: the coordinator stalls between on-demand refits; the
// trainer's next refit(2) used to wait for 'start' forever.
// Catches: a wait for 'start' without the heartbeat deadline (refit(2)
// would hang: the refit deadline does not cover the wait for 'start'), a
// rank that only heartbeats and never checks the coordinator's silence, and
// the same on the engine (it would wait for 'start' forever too).
TEST(Liveness, ACoordinatorStalledBetweenOnDemandRefitsEndsTheTrainersNextRefit) {
  OnDemandJob job;
  ASSERT_OK(job.Start());
  ASSERT_OK(job.trainer->refit(1));
  job.group.kill("coordinator", SIGSTOP);
  const auto stalled = Clock::now();
  const Status second = job.trainer->refit(2);
  const double took = SecondsSince(stalled);
  EXPECT_FALSE(second.ok());
  EXPECT_HAS(second.message(), "lost the coordinator");
  EXPECT_HAS(second.message(), "heartbeat deadline");
  EXPECT_LT(took, kWithin) << second.ToString();
  EXPECT_GE(took, kHeartbeatTimeout - 0.5) << "gave up before the heartbeat deadline: " << second.ToString();
  ASSERT_TRUE(job.group.wait_one("engine rank 0", kWithin)) << job.group.all_stderr();
  EXPECT_NE(job.group.exit_code("engine rank 0"), 0);
  EXPECT_HAS(job.group.err("engine rank 0"), "lost the coordinator");
  job.group.kill("coordinator", SIGKILL);
}

// An engine rank stalls while the job is idle between on-demand refits.
// Catches: a coordinator that checks liveness only while a refit runs
// (idle has no other deadline: it would wait forever), and a trainer that
// does not hear the job's end (its refit(2) would hang or not name the rank).
TEST(Liveness, AnEngineStalledWhileIdleEndsTheJobNamingIt) {
  OnDemandJob job;
  const std::string saved = job.group.dir() + "/engine.safetensors";
  ASSERT_OK(job.Start({"--save", saved}));
  ASSERT_OK(job.trainer->refit(1));
  // The engine saves refit 1 only after it acknowledged the commit: once the
  // file says 1, the job is idle (the coordinator has the ack, or reads it
  // from the socket even while the engine is stopped).
  ASSERT_TRUE(WaitForSavedVersion(saved, 1)) << job.group.all_stderr();
  job.group.kill("engine rank 0", SIGSTOP);
  const auto stalled = Clock::now();
  ASSERT_TRUE(job.group.wait_one("coordinator", kWithin)) << job.group.all_stderr();
  EXPECT_LT(SecondsSince(stalled), kWithin);
  EXPECT_NE(job.group.exit_code("coordinator"), 0);
  EXPECT_HAS(job.group.err("coordinator"), "lost engine rank 0 during refit 1 (request)");
  EXPECT_HAS(job.group.err("coordinator"), "heartbeat deadline");
  const Status second = job.trainer->refit(2);
  EXPECT_FALSE(second.ok());
  EXPECT_HAS(second.message(), "engine rank 0");
  EXPECT_LT(SecondsSince(stalled), kWithin) << second.ToString();
  job.group.kill("engine rank 0", SIGKILL);
}

// An engine rank stalls mid-refit (on receiving refit 1's commit, before it
// applies or acknowledges it: the fault hook announces itself first).
// Catches: a stall found only by the refit deadline (60 s here) instead of
// the heartbeat deadline, and survivors that do not name the stalled rank.
TEST(Liveness, AnEngineStalledMidRefitEndsEveryOtherProcessNamingIt) {
  ProcessGroup group;
  JobSpec spec;
  spec.refits = 2;
  spec.setup_timeout_s = 60;
  spec.refit_timeout_s = 60;
  spec.rank_args = kLiveness;
  spec.coordinator_args = kLiveness;
  spec.extra["engine rank 0"] = {"--debug-fault", "commit:1:stop"};
  ASSERT_TRUE(start_job(group, spec));
  ASSERT_TRUE(WaitForLine(group, "engine rank 0", "stopping by SIGSTOP at step 'commit' of refit 1"))
      << group.all_stderr();
  const auto stalled = Clock::now();
  for (const std::string& name : group.names()) {
    if (name == "engine rank 0") continue;
    ASSERT_TRUE(group.wait_one(name, kWithin)) << name << " still runs\n" << group.all_stderr();
    EXPECT_LT(SecondsSince(stalled), kWithin) << name;
    EXPECT_NE(group.exit_code(name), 0) << name;
    EXPECT_HAS(group.err(name), "engine rank 0");
  }
  EXPECT_HAS(group.err("coordinator"), "lost engine rank 0 after refit 1 was committed");
  EXPECT_HAS(group.err("coordinator"), "heartbeat deadline");
  group.kill("engine rank 0", SIGKILL);
}

}  // namespace
}  // namespace refit
