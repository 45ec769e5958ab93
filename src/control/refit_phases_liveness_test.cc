// The phase machine's liveness rule (refit_phases.h): heartbeats both ways,
// and a rank silent past the heartbeat deadline is lost, named, in any
// phase, idle included. Fake ranks and a fake clock: time moves in steps of
// one heartbeat interval, and every rank still alive heartbeats at each.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "control/refit_phases.h"
#include "testing/expect_has.h"

namespace refit {
namespace {

using namespace std::chrono_literals;

constexpr int kMembers = 4;  // trainer ranks 0, 1; engine ranks 0, 1 (members 2, 3)

// A job of 2 trainer ranks and 2 engine ranks with heartbeats every 1 s and
// a heartbeat deadline of 10 s; refit deadlines far longer (1 h), so only
// liveness can end a wait here.
class LiveJob {
 public:
  explicit LiveJob(int refits) : phases_([&] {
    PhaseOptions o;
    o.trainer_ranks = 2;
    o.engine_ranks = 2;
    o.refits = refits;
    o.setup_timeout_s = 3600;
    o.refit_timeout_s = 3600;
    o.heartbeats = HeartbeatTiming{1000ms, 10000ms};
    return o;
  }()) {
    Take(phases_.start(now_));
  }

  void Send(int member, RankMessage message) { Take(phases_.on(Received{member, std::move(message)}, now_)); }
  void All(const RankMessage& message) {
    for (int m = 0; m < kMembers; ++m) Send(m, message);
  }
  // Moves the clock by `d` in steps of one second; at each step every rank
  // not in `silent` heartbeats, then the machine gets a tick.
  void Pass(std::chrono::seconds d) {
    for (auto left = d; left > 0s && !Ended(); left -= 1s) {
      now_ += 1s;
      for (int m = 0; m < kMembers; ++m) {
        if (!silent_.contains(m)) Send(m, Heartbeat{});
      }
      Take(phases_.on(Tick{}, now_));
    }
  }
  void Silence(int member) { silent_.insert(member); }
  // The coordinator itself stops for `d` (SIGSTOP): time passes, no event
  // reaches the machine, it sends nothing.
  void Stall(std::chrono::seconds d) { now_ += d; }

  bool Recorded() const {
    for (const PhaseAction& a : actions_) {
      if (std::holds_alternative<RecordCommit>(a)) return true;
    }
    return false;
  }
  // The last message sent to every rank that ends the job or the refit.
  std::optional<CoordinatorMessage> LastVerdict() const {
    for (auto it = actions_.rbegin(); it != actions_.rend(); ++it) {
      const auto* s = std::get_if<SendAll>(&*it);
      if (s != nullptr && (std::holds_alternative<Abort>(s->message) || std::holds_alternative<Shutdown>(s->message))) {
        return s->message;
      }
    }
    return std::nullopt;
  }

  std::optional<Status> Ended() const {
    for (const PhaseAction& a : actions_) {
      if (const auto* end = std::get_if<EndJob>(&a)) return end->status;
    }
    return std::nullopt;
  }
  int HeartbeatsSent() const {
    int n = 0;
    for (const PhaseAction& a : actions_) {
      const auto* s = std::get_if<SendAll>(&a);
      if (s != nullptr && std::holds_alternative<Heartbeat>(s->message)) ++n;
    }
    return n;
  }
  RefitPhases& phases() { return phases_; }
  PhaseTime now() const { return now_; }

 private:
  void Take(std::vector<PhaseAction> actions) {
    for (auto& a : actions) actions_.push_back(std::move(a));
  }
  PhaseTime now_ = PhaseTime() + 1000s;
  RefitPhases phases_;
  std::set<int> silent_;
  std::vector<PhaseAction> actions_;
};

enum class Where { kSetup, kIdle, kPrepare, kTransfer, kVerify, kCommit, kRecovery };

struct Case {
  const char* name;
  Where where;
  RefitPhases::Phase phase;
  const char* named;  // how the job's error names the phase
};

// Drives `job` (on demand for kIdle, else one scheduled refit) into `where`.
void DriveTo(LiveJob& job, Where where) {
  if (where == Where::kSetup) return;
  job.All(Linked{});
  if (where == Where::kIdle) return;
  if (where == Where::kRecovery) {
    job.Send(2, Failed{1, DataLoss("tensor 'w' is wrong")});
    job.Pass(1s);  // the blame grace: no lost connection explains it
    return;
  }
  if (where == Where::kPrepare) return;
  job.All(Ready{1});
  if (where == Where::kTransfer) return;
  job.All(Sent{1});
  if (where == Where::kVerify) return;
  for (int m = 0; m < kMembers; ++m) job.Send(m, Done{1, m >= 2, Json::object(), ""});
}

class SilentRankTest : public ::testing::TestWithParam<Case> {};

// Engine rank 1 (member 3) stops talking in the phase; the others keep
// heartbeating. Catches: a silence check skipped in any phase (idle above
// all, where no other deadline runs), a silent rank lost before its deadline
// (at 9 s it is still in), and an error that does not name the rank.
TEST_P(SilentRankTest, ARankSilentPastTheHeartbeatDeadlineIsLostNamed) {
  const Case& c = GetParam();
  LiveJob job(c.where == Where::kIdle ? 0 : 1);
  DriveTo(job, c.where);
  ASSERT_EQ(job.phases().phase(), c.phase) << c.name;
  ASSERT_FALSE(job.Ended().has_value()) << job.Ended()->ToString();
  job.Silence(3);
  job.Pass(9s);
  ASSERT_FALSE(job.Ended().has_value()) << "lost before its deadline: " << job.Ended()->ToString();
  job.Pass(2s);
  ASSERT_TRUE(job.Ended().has_value()) << "engine rank 1 silent for 11 s is still in the job (" << c.name << ")";
  EXPECT_FALSE(job.Ended()->ok());
  EXPECT_HAS(job.Ended()->message(), "lost engine rank 1");
  EXPECT_HAS(job.Ended()->message(), c.named);
  EXPECT_HAS(job.Ended()->message(), "heartbeat deadline");
  EXPECT_EQ(job.phases().phase(), RefitPhases::Phase::kEnded);
}

INSTANTIATE_TEST_SUITE_P(
    EveryPhase, SilentRankTest,
    ::testing::Values(Case{"setup", Where::kSetup, RefitPhases::Phase::kSetup, "during setup"},
                      Case{"idle", Where::kIdle, RefitPhases::Phase::kIdle, "(request)"},
                      Case{"prepare", Where::kPrepare, RefitPhases::Phase::kPrepare, "(prepare)"},
                      Case{"transfer", Where::kTransfer, RefitPhases::Phase::kTransfer, "(transfer)"},
                      Case{"verify", Where::kVerify, RefitPhases::Phase::kVerify, "(verify)"},
                      Case{"commit", Where::kCommit, RefitPhases::Phase::kCommit, "after refit 1 was committed"},
                      Case{"recovery", Where::kRecovery, RefitPhases::Phase::kRecovery, "recovery failed"}),
    [](const auto& info) { return std::string(info.param.name); });

// Catches: a rank lost for being idle (a fixed idle deadline instead of
// liveness: a trainer step between refits may take hours), and a machine
// that stops sending heartbeats while idle (the ranks would lose it).
TEST(Liveness, HeartbeatsKeepAnIdleRankAliveForHours) {
  LiveJob job(0);
  job.All(Linked{});
  ASSERT_EQ(job.phases().phase(), RefitPhases::Phase::kIdle);
  const int before = job.HeartbeatsSent();
  job.Pass(3h);
  ASSERT_FALSE(job.Ended().has_value()) << job.Ended()->ToString();
  EXPECT_GE(job.HeartbeatsSent() - before, 3 * 3600 - 1) << "the machine stopped heartbeating while idle";
  // And the job goes on: every trainer asks, refit 1 starts.
  job.Send(0, Request{1});
  job.Send(1, Request{1});
  EXPECT_EQ(job.phases().phase(), RefitPhases::Phase::kPrepare);
}

// Catches: a shell that sleeps past a silent rank's deadline because
// wake_at() ignores liveness (idle has no phase deadline at all).
TEST(Liveness, WakeAtComesNoLaterThanTheNextHeartbeatOrSilenceDeadline) {
  LiveJob job(0);
  job.All(Linked{});
  ASSERT_EQ(job.phases().phase(), RefitPhases::Phase::kIdle);
  EXPECT_LE(job.phases().wake_at(), job.now() + 1s);
  EXPECT_GT(job.phases().wake_at(), job.now());
}

// Catches: silence counted from the last heartbeat only, so that a rank
// busy sending other messages (no heartbeat among them) is lost.
TEST(Liveness, AnyMessageCountsAsASignOfLife) {
  LiveJob job(1);
  job.All(Linked{});
  job.Silence(3);  // no heartbeats from engine rank 1 from here on
  job.Pass(8s);
  job.Send(3, Ready{1});
  job.Pass(8s);
  ASSERT_FALSE(job.Ended().has_value()) << job.Ended()->ToString();
  job.Pass(3s);
  ASSERT_TRUE(job.Ended().has_value());
  EXPECT_HAS(job.Ended()->message(), "lost engine rank 1");
}

// The coordinator stalled past the heartbeat deadline (every rank gave it
// up meanwhile: its heartbeats stopped), then resumed with every rank's
// done queued in its sockets. Catches: a machine that decides the commit on
// those messages (the report would name refit 1 committed while every rank
// exited holding version 0), and a stall check that fires on a short pause.
TEST(Liveness, ACoordinatorStalledPastTheDeadlineDecidesNothingMore) {
  LiveJob job(2);
  DriveTo(job, Where::kVerify);
  job.Stall(9s);  // within the deadline: the job goes on
  job.Send(0, Done{1, false, Json::object(), ""});
  ASSERT_FALSE(job.Ended().has_value()) << job.Ended()->ToString();
  job.Stall(12s);
  for (int m = 1; m < kMembers; ++m) job.Send(m, Done{1, m >= 2, Json::object(), ""});
  EXPECT_FALSE(job.Recorded()) << "refit 1 was decided after the coordinator's own stall";
  ASSERT_TRUE(job.Ended().has_value());
  EXPECT_EQ(job.Ended()->code(), StatusCode::kUnavailable);
  EXPECT_HAS(job.Ended()->message(), "the coordinator itself was stalled");
  EXPECT_HAS(job.Ended()->message(), "refit 1 aborted");
  ASSERT_TRUE(job.LastVerdict().has_value());
  EXPECT_TRUE(std::holds_alternative<Abort>(*job.LastVerdict()));
  EXPECT_EQ(job.phases().committed_version(), 0u);
}

// The same stall after the decision: refit 1 stays committed, the verdict
// is a shutdown naming it. Catches: an abort of a decided version.
TEST(Liveness, ACoordinatorStalledAfterItsDecisionKeepsTheVersionCommitted) {
  LiveJob job(2);
  DriveTo(job, Where::kCommit);
  ASSERT_TRUE(job.Recorded());
  job.Stall(12s);
  job.All(Committed{1});
  ASSERT_TRUE(job.Ended().has_value());
  EXPECT_HAS(job.Ended()->message(), "refit 1 was committed, but the coordinator itself was stalled");
  const std::optional<CoordinatorMessage> verdict = job.LastVerdict();
  ASSERT_TRUE(verdict.has_value());
  const auto* shutdown = std::get_if<Shutdown>(&*verdict);
  ASSERT_NE(shutdown, nullptr);
  EXPECT_EQ(shutdown->committed_version, 1u);
}

}  // namespace
}  // namespace refit
