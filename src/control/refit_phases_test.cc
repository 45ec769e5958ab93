// The coordinator's phase machine driven by fake ranks: no sockets, no
// clock (time is a value the test moves). Each test names the mutation it
// catches.
#include "control/refit_phases.h"
#include "testing/expect_has.h"
#include "testing/phase_actions.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace refit {
namespace {

using namespace std::chrono_literals;

// A job of 2 trainer ranks (members 0, 1) and 2 engine ranks (2, 3), with
// the actions the machine returned so far.
class Job {
 public:
  explicit Job(int refits = 2, bool amax_exchange = false, double replace_timeout_s = 0,
               bool alternate_arenas = false)
      : phases_([&] {
    PhaseOptions o;
    o.alternate_arenas = alternate_arenas;
    o.trainer_replace_timeout_s = replace_timeout_s;
    o.trainer_ranks = 2;
    o.engine_ranks = 2;
    o.refits = refits;
    o.amax_exchange = amax_exchange;
    o.setup_timeout_s = 10;
    o.refit_timeout_s = 20;
    return o;
  }()) {
    (void)phases_.start(now_ + 10s);
  }

  void Send(int member, RankMessage message) { Take(phases_.on(Received{member, std::move(message)}, now_)); }
  void Lose(int member) { Take(phases_.on(Lost{member, "connection closed"}, now_)); }
  void Replace(int member) { Take(phases_.on(Replaced{member}, now_)); }
  void Wait(std::chrono::milliseconds d) {
    now_ += d;
    Take(phases_.on(Tick{}, now_));
  }
  void All(const std::function<RankMessage()>& make) {
    for (int m = 0; m < 4; ++m) Send(m, make());
  }
  // Setup and refit `v` up to (not including) the commit decision.
  void LinkAll() { All([] { return RankMessage(Linked{}); }); }
  void UpToDone(std::uint64_t v, int except = -1) {
    All([&] { return RankMessage(Ready{v}); });
    for (int m = 0; m < 4; ++m) Send(m, refit::Sent{v});
    for (int m = 0; m < 4; ++m) {
      if (m != except) Send(m, Done{v, m >= 2, Json::object(), ""});
    }
  }

  // The messages sent to every rank, by name, in order.
  std::vector<std::string> Names() const {
    std::vector<std::string> out;
    for (const PhaseAction& a : actions_.all()) {
      if (const auto* s = std::get_if<SendAll>(&a)) out.push_back(message_name(s->message));
    }
    return out;
  }
  template <class T>
  std::vector<T> Of() const {
    return actions_.of<T>();
  }
  // The last message of type T sent to every rank.
  template <class T>
  std::optional<T> LastSent() const {
    return actions_.last_sent<T>();
  }
  std::optional<Status> Ended() const { return actions_.ended(); }
  RefitPhases& phases() { return phases_; }

 private:
  void Take(std::vector<PhaseAction> actions) { actions_.take(std::move(actions)); }
  PhaseTime now_ = PhaseTime() + 1000s;
  RefitPhases phases_;
  testing::PhaseActions actions_;
};

// Catches: a phase that moves on before every rank reported (go after one
// ready), a commit sent before every engine is done, a missing step.
TEST(RefitPhases, NormalRefitsRunEveryStepInOrder) {
  Job job(2);
  job.LinkAll();
  EXPECT_EQ(job.Names(), (std::vector<std::string>{"start"}));
  job.All([] { return RankMessage(Ready{1}); });
  job.Send(0, Sent{1});
  job.Send(0, Done{1, false, Json::object(), ""});  // a trainer runs ahead of the engines
  job.Send(1, Sent{1});
  job.Send(2, Sent{1});
  EXPECT_EQ(job.phases().phase(), RefitPhases::Phase::kTransfer);
  job.Send(3, Sent{1});
  for (int m = 1; m < 4; ++m) {
    EXPECT_TRUE(job.Of<RecordCommit>().empty()) << "committed before every rank was done";
    job.Send(m, Done{1, m >= 2, Json::object(), ""});
  }
  ASSERT_EQ(job.Of<RecordCommit>().size(), 1u);
  EXPECT_EQ(job.Of<RecordCommit>()[0].version, 1u);
  EXPECT_TRUE(job.Of<RecordCommit>()[0].verified);
  EXPECT_EQ(job.Names(), (std::vector<std::string>{"start", "go", "commit"}));
  job.All([] { return RankMessage(Committed{1}); });
  job.UpToDone(2);
  job.All([] { return RankMessage(Committed{2}); });
  EXPECT_EQ(job.Names(), (std::vector<std::string>{"start", "go", "commit", "start", "go", "commit", "shutdown"}));
  ASSERT_TRUE(job.Ended().has_value());
  EXPECT_TRUE(job.Ended()->ok()) << job.Ended()->ToString();
  EXPECT_EQ(job.phases().committed_version(), 2u);
}

// Direct mode over shadow weights: the first start names arena 1 (the
// engines serve arena 0), each commit flips it, an aborted refit does not
// (its engines still serve what they served); without shadow every start
// names arena 0. Catches: a flip at the abort, none at a commit, an arena
// named in a job without shadow. Tried once: no flip at the commit failed.
TEST(RefitPhases, StartsNameTheArenaNotServedFlippingOnlyAtACommit) {
  for (bool alternate : {true, false}) {
    Job job(3, false, 0, alternate);
    job.LinkAll();
    job.UpToDone(1);
    job.All([] { return RankMessage(Committed{1}); });
    job.All([] { return RankMessage(Ready{2}); });
    job.Send(3, Failed{2, DataLoss("tensor 'w' is wrong")});
    job.Wait(600ms);
    for (int m = 0; m < 4; ++m) job.Send(m, Linked{1, m >= 2 ? std::optional<bool>(true) : std::nullopt});
    job.UpToDone(3);
    job.All([] { return RankMessage(Committed{3}); });
    ASSERT_TRUE(job.Ended().has_value() && job.Ended()->ok()) << (job.Ended() ? job.Ended()->ToString() : "");
    std::vector<std::uint64_t> arenas;
    for (const SendAll& s : job.Of<SendAll>()) {
      if (const auto* start = std::get_if<Start>(&s.message)) arenas.push_back(start->arena);
    }
    EXPECT_EQ(arenas, alternate ? (std::vector<std::uint64_t>{1, 0, 0}) : (std::vector<std::uint64_t>{0, 0, 0}));
  }
}

// Catches: a rank's failure that ends the job instead of aborting the refit
// and relinking (or commits it anyway), and recovery that never resumes.
TEST(RefitPhases, AFailureAbortsTheRefitRelinksAndTheJobGoesOn) {
  Job job(2);
  job.LinkAll();
  job.All([] { return RankMessage(Ready{1}); });
  job.Send(3, Failed{1, DataLoss("tensor 'w' is wrong")});
  EXPECT_EQ(job.phases().phase(), RefitPhases::Phase::kBlame);
  job.Wait(600ms);  // no lost connection to blame: the failure stands
  EXPECT_EQ(job.Names(), (std::vector<std::string>{"start", "go", "abort", "relink"}));
  ASSERT_EQ(job.Of<RecordFailure>().size(), 1u);
  EXPECT_HAS(job.Of<RecordFailure>()[0].error.message(), "engine rank 1 failed during refit 1 (transfer)");
  job.Send(0, Sent{1});  // what the aborted refit still had in flight is dropped
  for (int m = 0; m < 4; ++m) job.Send(m, Linked{0, m >= 2 ? std::optional<bool>(false) : std::nullopt});
  ASSERT_EQ(job.Of<RecordRecovery>().size(), 1u);
  EXPECT_TRUE(job.Of<RecordCommit>().empty());
  EXPECT_EQ(job.LastSent<Start>()->version, 2u);
  job.UpToDone(2);
  job.All([] { return RankMessage(Committed{2}); });
  EXPECT_TRUE(job.Ended()->ok());
  EXPECT_EQ(job.phases().committed_version(), 2u);
}

// A rank's failure caused by a peer that died: the machine names the dead
// peer. Catches: blaming the reporter, or not waiting for the cause.
TEST(RefitPhases, AFailureExplainedByALostPeerNamesThePeer) {
  Job job(2);
  job.LinkAll();
  job.All([] { return RankMessage(Ready{1}); });
  job.Send(2, Failed{1, Unavailable("trainer rank 0 closed the link")});
  job.Lose(0);
  ASSERT_TRUE(job.Ended().has_value());
  EXPECT_HAS(job.Ended()->message(), "lost trainer rank 0 during refit 1 (transfer) (engine rank 0 failed");
  EXPECT_EQ(job.LastSent<Abort>()->version, 1u);
}

// A rank lost in each phase before the decision: the job ends naming it,
// with an abort of the refit in flight, and nothing is recorded committed.
// Catches: a lost rank left unnoticed in some phase (the job would wait
// for its deadline), or a commit recorded without it.
TEST(RefitPhases, ALostRankInEachPhaseBeforeTheDecisionAbortsNamingIt) {
  struct Case {
    std::function<void(Job&)> reach;
    const char* phase;
  };
  const std::vector<Case> cases = {
      {[](Job&) {}, "setup"},
      {[](Job& j) { j.LinkAll(); }, "refit 1 (prepare)"},
      {[](Job& j) {
         j.LinkAll();
         j.All([] { return RankMessage(Ready{1}); });
       },
       "refit 1 (transfer)"},
      {[](Job& j) {
         j.LinkAll();
         j.UpToDone(1, /*except=*/3);
       },
       "refit 1 (verify)"},
  };
  for (const Case& c : cases) {
    Job job(2);
    c.reach(job);
    job.Lose(3);
    ASSERT_TRUE(job.Ended().has_value()) << c.phase;
    EXPECT_HAS(job.Ended()->message(), std::string("lost engine rank 1 during ") + c.phase);
    EXPECT_TRUE(job.Of<RecordCommit>().empty()) << c.phase;
    EXPECT_TRUE(job.LastSent<Abort>().has_value()) << c.phase;
    EXPECT_FALSE(job.LastSent<Commit>().has_value()) << c.phase;
  }
}

// The one commit decision (issue 16): once every rank is done, v is
// committed; a rank lost or stalled while the acks come in ends the job
// with v committed, and the ranks hear a shutdown carrying the error and
// v, never an abort of v.
// Catches: recording the commit only after every ack (the report would
// say v-1 while ranks committed v), and aborting a version already
// committed (mutation tried: end() sending Abort whenever the status is an
// error: this test fails).
TEST(RefitPhases, ARankLostOrStalledAfterTheCommitDecisionLeavesTheVersionCommitted) {
  for (bool stall : {false, true}) {
    Job job(3);
    job.LinkAll();
    job.UpToDone(1);
    job.All([] { return RankMessage(Committed{1}); });
    job.UpToDone(2);
    ASSERT_EQ(job.Of<RecordCommit>().size(), 2u) << "the decision is taken when every rank is done";
    EXPECT_EQ(job.phases().committed_version(), 2u);
    for (int m = 0; m < 3; ++m) job.Send(m, Committed{2});
    if (stall) {
      job.Wait(21s);  // engine rank 1 never acknowledges: the refit deadline
    } else {
      job.Lose(3);
    }
    ASSERT_TRUE(job.Ended().has_value());
    EXPECT_HAS(job.Ended()->message(), stall ? "refit 2 was committed, but refit 2 (commit) timed out waiting for "
                                               "'committed' from engine rank 1"
                                             : "lost engine rank 1 after refit 2 was committed");
    EXPECT_FALSE(job.LastSent<Abort>().has_value()) << "aborted a committed version";
    auto shutdown = job.LastSent<Shutdown>();
    ASSERT_TRUE(shutdown.has_value());
    EXPECT_EQ(shutdown->committed_version, 2u);
    ASSERT_TRUE(shutdown->error.has_value());
    EXPECT_HAS(shutdown->error->message(), "engine rank 1");
    EXPECT_EQ(job.phases().committed_version(), 2u);
  }
}

// A rank that reports its own failure during the commit (its engine could
// not apply the commit) ends the job with the version still committed.
// Catches: treating a post-decision failure as recoverable (abort + relink).
TEST(RefitPhases, AFailureAfterTheDecisionEndsTheJobWithTheVersionCommitted) {
  Job job(2);
  job.LinkAll();
  job.UpToDone(1);
  job.Send(2, Failed{1, Internal("commit failed")});
  job.Wait(600ms);
  ASSERT_TRUE(job.Ended().has_value());
  EXPECT_HAS(job.Ended()->message(), "engine rank 0 failed during refit 1 (commit)");
  EXPECT_FALSE(job.LastSent<Abort>().has_value());
  EXPECT_EQ(job.LastSent<Shutdown>()->committed_version, 1u);
}

// Catches: a missed deadline before the decision that ends the job instead
// of recovering, or that names no rank.
TEST(RefitPhases, AMissedDeadlineBeforeTheDecisionNamesTheLateRanksAndRecovers) {
  Job job(2);
  job.LinkAll();
  job.Send(0, Ready{1});
  job.Wait(21s);
  ASSERT_EQ(job.Of<RecordFailure>().size(), 1u);
  EXPECT_HAS(job.Of<RecordFailure>()[0].error.message(),
             "refit 1 (prepare) timed out waiting for 'ready' from trainer rank 1, engine rank 0, engine rank 1");
  EXPECT_EQ(job.Names(), (std::vector<std::string>{"start", "abort", "relink"}));
  job.Wait(11s);  // nobody relinks within the setup deadline
  ASSERT_TRUE(job.Ended().has_value());
  EXPECT_HAS(job.Ended()->message(), "recovery failed: refit 1 (recovery) timed out waiting for 'linked'");
}

// Catches: accepting steps out of order (a sent before go, a committed
// before commit) or twice.
TEST(RefitPhases, OutOfOrderAndRepeatedReportsAreProtocolErrors) {
  {
    Job job(2);
    job.LinkAll();
    job.Send(2, Sent{1});
    ASSERT_EQ(job.Of<RecordFailure>().size(), 1u);
    EXPECT_HAS(job.Of<RecordFailure>()[0].error.message(),
               "protocol error: engine rank 0 sent 'sent' during refit 1 (prepare) (expected 'ready')");
  }
  {
    Job job(2);
    job.LinkAll();
    job.Send(2, Ready{1});
    job.Send(2, Ready{1});
    ASSERT_EQ(job.Of<RecordFailure>().size(), 1u);
    EXPECT_HAS(job.Of<RecordFailure>()[0].error.message(), "engine rank 0 sent 'ready' twice during refit 1 (prepare)");
  }
  {
    Job job(2);
    job.LinkAll();
    job.All([] { return RankMessage(Ready{1}); });
    job.Send(1, Sent{1});
    job.Send(1, Done{1, false, Json::object(), ""});
    job.Send(1, Committed{1});
    ASSERT_EQ(job.Of<RecordFailure>().size(), 1u);
    EXPECT_HAS(job.Of<RecordFailure>()[0].error.message(), "trainer rank 1 sent 'committed' during refit 1 (transfer)");
  }
}

// On demand: a refit starts when every trainer rank asked for the same
// version above the last committed one; the job ends when all finished.
// Catches: starting on the first request, or accepting an old version.
TEST(RefitPhases, OnDemandRefitsStartWhenEveryTrainerAsked) {
  Job job(0);
  job.LinkAll();
  job.Send(0, Request{5});
  EXPECT_TRUE(job.Names().empty());
  job.Send(1, Request{5});
  EXPECT_EQ(job.LastSent<Start>()->version, 5u);
  job.UpToDone(5);
  job.Send(0, Committed{5});
  job.Send(0, Request{6});  // asks as soon as it committed
  for (int m = 1; m < 4; ++m) job.Send(m, Committed{5});
  job.Send(1, Finish{});
  ASSERT_TRUE(job.Ended().has_value());
  EXPECT_HAS(job.Ended()->message(), "1 trainer ranks finished while the others asked for refit 6");
  EXPECT_EQ(job.LastSent<Shutdown>()->committed_version, 5u);

  Job old(0);
  old.LinkAll();
  old.Send(0, Request{1});
  old.Send(1, Request{1});
  old.UpToDone(1);
  old.All([] { return RankMessage(Committed{1}); });
  old.Send(0, Request{1});
  EXPECT_HAS(old.Ended()->message(), "trainer rank 0 asked for refit 1, not above the last committed version 1");
}

// ---- a replacement trainer rank (on demand, trainer_replace_timeout_s) ----------

// A trainer lost mid-refit in an on-demand job: the refit is aborted and
// recovered from, recovery waits for a new process of that rank, and the
// next refit commits. Catches: replace_lost_trainer never taking the case
// (the job ends at the loss; tried once); a Replaced that does not clear
// its wait (awaits_replacement stays true).
TEST(RefitPhases, OnDemandALostTrainerIsReplacedAndTheNextRefitCommits) {
  Job job(0, false, /*replace_timeout_s=*/30);
  job.LinkAll();
  job.Send(0, Request{1});
  job.Send(1, Request{1});
  job.All([] { return RankMessage(Ready{1}); });
  job.Send(2, Sent{1});
  job.Lose(0);
  ASSERT_FALSE(job.Ended().has_value()) << job.Ended()->message();
  EXPECT_EQ(job.phases().phase(), RefitPhases::Phase::kRecovery);
  EXPECT_TRUE(job.phases().awaits_replacement(0));
  EXPECT_FALSE(job.phases().awaits_replacement(1));
  ASSERT_EQ(job.Of<RecordFailure>().size(), 1u);
  EXPECT_HAS(job.Of<RecordFailure>()[0].error.message(), "lost trainer rank 0 during refit 1 (transfer)");
  EXPECT_EQ(job.LastSent<Abort>()->version, 1u);
  for (int m = 1; m < 4; ++m) job.Send(m, Linked{});
  EXPECT_EQ(job.phases().phase(), RefitPhases::Phase::kRecovery) << "recovered without trainer rank 0";
  job.Replace(0);
  EXPECT_FALSE(job.phases().awaits_replacement(0));
  job.Send(0, Linked{});
  EXPECT_EQ(job.Of<RecordRecovery>().size(), 1u);
  job.Send(0, Request{2});
  job.Send(1, Request{2});
  EXPECT_EQ(job.LastSent<Start>()->version, 2u);
  job.UpToDone(2);
  ASSERT_FALSE(job.Of<RecordCommit>().empty());
  EXPECT_EQ(job.Of<RecordCommit>().back().version, 2u);
}

// Catches (tried once): recovery keeping setup_timeout_s (10 s) as its
// deadline instead of the replacement's 30 s; a message that does not name
// the rank nobody replaced.
TEST(RefitPhases, NoReplacementWithinItsTimeoutEndsTheJobNamingTheRank) {
  Job job(0, false, /*replace_timeout_s=*/30);
  job.LinkAll();
  job.Send(0, Request{1});
  job.Send(1, Request{1});
  job.Lose(1);
  for (int m : {0, 2, 3}) job.Send(m, Linked{});
  job.Wait(15s);
  ASSERT_FALSE(job.Ended().has_value()) << job.Ended()->message();
  job.Wait(16s);
  ASSERT_TRUE(job.Ended().has_value());
  EXPECT_HAS(job.Ended()->message(), "no replacement trainer rank 1 joined within 30 s");
}

// Where a replacement is not waited for, a lost rank still ends the job:
// without the timeout, in a scheduled job, an engine rank, and a trainer
// lost after the commit decision. Catches: replace_lost_trainer ignoring
// one of those conditions (tried once: the on-demand one dropped).
TEST(RefitPhases, OnlyAnOnDemandTrainerBeforeTheDecisionIsWaitedFor) {
  struct Case {
    int refits;
    double timeout;
    int lost;
    bool after_decision;
  };
  for (const Case& c : {Case{0, 0, 0, false}, Case{2, 30, 0, false}, Case{0, 30, 2, false}, Case{0, 30, 0, true}}) {
    Job job(c.refits, false, c.timeout);
    job.LinkAll();
    if (c.refits == 0) {
      job.Send(0, Request{1});
      job.Send(1, Request{1});
    }
    if (c.after_decision) job.UpToDone(1);
    job.Lose(c.lost);
    EXPECT_TRUE(job.Ended().has_value()) << "refits " << c.refits << ", timeout " << c.timeout << ", lost member "
                                         << c.lost << (c.after_decision ? ", after the decision" : "");
    EXPECT_FALSE(job.phases().awaits_replacement(c.lost));
  }
}

// ---- the amax exchange of sharded trainers under --quantize ---------------------

// Catches: a table sent before every trainer rank shared, sent to the
// engines too, or combined otherwise than by the largest amax per block.
// Tried once: on_amax combining whatever shares had come (not waiting for
// every trainer rank) failed it and the protocol-error test below.
TEST(RefitPhases, TheAmaxTableGoesToTheTrainersOnceEveryTrainerShared) {
  Job job(1, /*amax_exchange=*/true);
  job.LinkAll();
  job.All([] { return RankMessage(Ready{1}); });
  job.Send(0, AmaxShare{1, {{0, 3, 100}, {2, 0, 7}}});
  EXPECT_FALSE(job.LastSent<AmaxTable>().has_value()) << "the table went out before trainer rank 1 shared";
  job.Send(1, AmaxShare{1, {{0, 3, 250}}});
  const auto table = job.LastSent<AmaxTable>();
  ASSERT_TRUE(table.has_value());
  EXPECT_EQ(table->version, 1u);
  EXPECT_EQ(table->entries, (std::vector<AmaxEntry>{{0, 3, 250}, {2, 0, 7}}));
  for (const SendAll& s : job.Of<SendAll>()) {
    const bool is_table = std::holds_alternative<AmaxTable>(s.message);
    EXPECT_EQ(s.audience, is_table ? Audience::kTrainers : Audience::kEveryRank) << message_name(s.message);
  }
  for (int m = 0; m < 4; ++m) job.Send(m, refit::Sent{1});
  for (int m = 0; m < 4; ++m) job.Send(m, Done{1, m >= 2, Json::object(), ""});
  ASSERT_EQ(job.Of<RecordCommit>().size(), 1u);
}

// Catches: an amax_share accepted from an engine rank, twice from one
// trainer rank, or in a job without the exchange (each would corrupt or
// stall the table); every one is a protocol error naming the rank and why.
TEST(RefitPhases, AnAmaxShareOutOfPlaceIsAProtocolError) {
  struct Case {
    bool exchange;
    int member;
    int shares;
    const char* why;
  };
  for (const Case& c : {Case{true, 2, 1, "engine rank 0 sent 'amax_share' of refit 1 during refit 1 (transfer) "
                                         "(only trainer ranks share amax)"},
                        Case{true, 0, 2, "trainer rank 0 sent 'amax_share' of refit 1 during refit 1 (transfer) "
                                         "(it already shared)"},
                        Case{false, 0, 1, "(this job exchanges no amax)"}}) {
    Job job(1, c.exchange);
    job.LinkAll();
    job.All([] { return RankMessage(Ready{1}); });
    for (int i = 0; i < c.shares; ++i) job.Send(c.member, AmaxShare{1, {{0, 0, 1}}});
    ASSERT_EQ(job.Of<RecordFailure>().size(), 1u) << c.why;
    EXPECT_HAS(job.Of<RecordFailure>()[0].error.message(), c.why);
    EXPECT_FALSE(job.LastSent<AmaxTable>().has_value());
  }
}

// Catches: a transfer deadline that names every rank (each waits for the
// table) instead of the trainer rank that never shared.
TEST(RefitPhases, AMissingAmaxShareIsNamedAtTheDeadline) {
  Job job(1, /*amax_exchange=*/true);
  job.LinkAll();
  job.All([] { return RankMessage(Ready{1}); });
  job.Send(0, AmaxShare{1, {}});
  job.Wait(21s);
  ASSERT_EQ(job.Of<RecordFailure>().size(), 1u);
  EXPECT_HAS(job.Of<RecordFailure>()[0].error.message(),
             "refit 1 (transfer) timed out waiting for 'amax_share' from trainer rank 1");
}

}  // namespace
}  // namespace refit
