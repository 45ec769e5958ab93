// The phase machine's partial-refit rules (refit_phase_scope.cc) driven by
// fake ranks: which refits are partial, the whole-engine rule, the trainers'
// agreement and the per-stream digest check. Each test names the mutation
// it catches.
#include "control/refit_phases.h"
#include "testing/expect_has.h"
#include "testing/phase_actions.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace refit {
namespace {

using namespace std::chrono_literals;

const std::vector<std::string> kOnly{"*.q_proj.weight", "*norm*"};

// T trainer ranks (members 0..T-1) into one engine of R ranks (T..T+R-1).
class ScopeJob {
 public:
  ScopeJob(int trainers, int ranks, int refits, std::vector<std::string> only = kOnly, int max_engines = 0)
      : trainers_(trainers), ranks_(ranks), phases_([&] {
          PhaseOptions o;
          o.trainer_ranks = trainers;
          o.engine_ranks = ranks * std::max(max_engines, 1);
          o.max_engines = max_engines;
          o.refits = refits;
          o.only = std::move(only);
          o.only_from = 2;
          o.setup_timeout_s = 10;
          o.refit_timeout_s = 20;
          return o;
        }()) {
    (void)phases_.start(now_ + 10s);
  }
  int members() const { return trainers_ + ranks_; }
  void Send(int member, RankMessage message) { actions_.take(phases_.on(Received{member, std::move(message)}, now_)); }
  void Wait(std::chrono::milliseconds d) {
    now_ += d;
    actions_.take(phases_.on(Tick{}, now_));
  }
  void LinkAll() {
    for (int m = 0; m < members(); ++m) Send(m, Linked{});
  }
  // Every rank ready with `digest` (the same plan everywhere), then sent,
  // done and committed.
  void RunRefit(std::uint64_t v, const std::string& digest = "0123456789abcdef") {
    for (int m = 0; m < members(); ++m) Send(m, Ready{v, digest});
    for (int m = 0; m < members(); ++m) Send(m, Sent{v});
    for (int m = 0; m < members(); ++m) Send(m, Done{v, m >= trainers_, Json::object(), ""});
    for (int m = 0; m < members(); ++m) Send(m, Committed{v});
  }
  std::vector<std::vector<std::string>> StartedOnly() const {
    std::vector<std::vector<std::string>> out;
    for (const SendAll& s : actions_.of<SendAll>()) {
      if (const auto* start = std::get_if<Start>(&s.message)) out.push_back(start->only);
    }
    return out;
  }
  testing::PhaseActions& actions() { return actions_; }
  RefitPhases& phases() { return phases_; }

 private:
  int trainers_, ranks_;
  PhaseTime now_ = PhaseTime() + 1000s;
  RefitPhases phases_;
  testing::PhaseActions actions_;
};

std::string notes(const testing::PhaseActions& actions) {
  std::string out;
  for (const Note& n : actions.of<Note>()) out += n.line + "\n";
  return out;
}

// Scheduled --only from refit 2: refit 1 moves every tensor, 2 and 3 the
// globs, in their starts and their commit records. Catches: only_from
// ignored (refit 1 partial), the whole-engine flag never set at a full
// commit (every refit full), the commit record without its globs.
TEST(RefitPhaseScope, ScheduledPartialRefitsStartAtOnlyFromAfterAFullOne) {
  ScopeJob job(2, 2, 3);
  job.LinkAll();
  for (std::uint64_t v = 1; v <= 3; ++v) job.RunRefit(v);
  ASSERT_TRUE(job.actions().ended() && job.actions().ended()->ok());
  EXPECT_EQ(job.StartedOnly(), (std::vector<std::vector<std::string>>{{}, kOnly, kOnly}));
  const std::vector<RecordCommit> commits = job.actions().of<RecordCommit>();
  ASSERT_EQ(commits.size(), 3u);
  EXPECT_TRUE(commits[0].only.empty());
  EXPECT_EQ(commits[1].only, kOnly);
  EXPECT_TRUE(notes(job.actions()).empty()) << notes(job.actions());
}

// A partial refit that fails leaves a live engine incomplete (its linked
// says so): the next refit moves every tensor, with a note saying why, and
// the one after it is partial again. Catches: the recovery's
// weights_complete ignored (refit 3 partial over torn tensors); the flag
// never set again (refit 4 full). Tried once: no note_engines_whole in
// recovery failed it.
TEST(RefitPhaseScope, AfterAnEngineSaysItsWeightsAreIncompleteTheNextRefitIsFull) {
  ScopeJob job(2, 2, 4);
  job.LinkAll();
  job.RunRefit(1);
  for (int m = 0; m < 4; ++m) job.Send(m, Ready{2, "0123456789abcdef"});
  job.Send(3, Failed{2, DataLoss("tensor 'w' is wrong")});
  job.Wait(600ms);
  for (int m = 0; m < 4; ++m) job.Send(m, Linked{1, m >= 2 ? std::optional<bool>(false) : std::nullopt});
  job.RunRefit(3);
  job.RunRefit(4);
  ASSERT_TRUE(job.actions().ended() && job.actions().ended()->ok()) << job.actions().ended()->ToString();
  EXPECT_EQ(job.StartedOnly(), (std::vector<std::vector<std::string>>{{}, kOnly, {}, kOnly}));
  EXPECT_HAS(notes(job.actions()), "refit 3 moves every tensor, not only [*.q_proj.weight, *norm*]: an engine's "
                                   "weights are incomplete after a failed refit");
}

// Three trainer ranks into two engine ranks: trainers 0 and 2 feed engine
// rank 0, trainer 1 engine rank 1. Plans of different streams may differ;
// a trainer whose plan differs from its engine rank's fails the refit,
// naming both ranks and both digests. Catches: every digest compared with
// one another (the first job never goes); an engine rank's stream taken as
// its member number modulo the ranks (engine rank 0 is member 3: stream 1);
// the check left out (the second job commits). Tried once: the stream as
// the member number modulo the ranks failed it.
TEST(RefitPhaseScope, EachTrainerRanksPlanMustBeItsEngineRanksPlan) {
  ScopeJob agreeing(3, 2, 1, {});
  agreeing.LinkAll();
  const std::vector<std::string> digests{"aaaa", "bbbb", "aaaa", "aaaa", "bbbb"};
  for (int m = 0; m < 5; ++m) agreeing.Send(m, Ready{1, digests[static_cast<std::size_t>(m)]});
  EXPECT_EQ(agreeing.phases().phase(), RefitPhases::Phase::kTransfer);

  ScopeJob differing(3, 2, 1, {});
  differing.LinkAll();
  const std::vector<std::string> wrong{"aaaa", "bbbb", "cccc", "aaaa", "bbbb"};
  for (int m = 0; m < 5; ++m) differing.Send(m, Ready{1, wrong[static_cast<std::size_t>(m)]});
  ASSERT_EQ(differing.actions().of<RecordFailure>().size(), 1u);
  EXPECT_HAS(differing.actions().of<RecordFailure>()[0].error.message(),
             "refit 1 (every tensor): trainer rank 0 planned aaaa for engine rank 0's stream, trainer rank 2 planned "
             "cccc");
  EXPECT_TRUE(differing.actions().of<RecordCommit>().empty());
}

// On demand: trainer ranks asking for different globs end the job, naming
// both lists and the second rank; the same globs start a partial refit
// once the engines are whole. Catches: asks compared by version only (the
// first job starts a refit with one rank's globs).
TEST(RefitPhaseScope, OnDemandTheTrainerRanksMustAskForTheSameTensors) {
  ScopeJob differing(2, 1, 0, {});
  differing.LinkAll();
  differing.Send(0, Request{1});
  differing.Send(1, Request{1});
  differing.RunRefit(1);
  differing.Send(0, Request{2, kOnly});
  differing.Send(1, Request{2, {"*lora*"}});
  ASSERT_TRUE(differing.actions().ended().has_value());
  EXPECT_HAS(differing.actions().ended()->message(), "the trainer ranks ask for different tensors of refit 2: "
                                                     "[*.q_proj.weight, *norm*] and [*lora*] (trainer rank 1)");

  ScopeJob agreeing(2, 1, 0, {});
  agreeing.LinkAll();
  agreeing.Send(0, Request{1, kOnly});  // the engines hold nothing yet: full, with a note
  agreeing.Send(1, Request{1, kOnly});
  agreeing.RunRefit(1);
  agreeing.Send(0, Request{2, kOnly});
  agreeing.Send(1, Request{2, kOnly});
  EXPECT_EQ(agreeing.StartedOnly(), (std::vector<std::vector<std::string>>{{}, kOnly}));
  EXPECT_HAS(notes(agreeing.actions()), "refit 1 moves every tensor, not only [*.q_proj.weight, *norm*]: the engines "
                                        "hold no committed version yet");
}

// A partial ask in a job whose engines cannot take one (a C++ engine
// without begin_partial: the shell's partial_refused) ends the job with the
// reason, before any refit starts. Catches: the ask started (every engine
// rank would refuse it at its begin, and the job recover forever).
TEST(RefitPhaseScope, APartialAskWhoseEnginesCannotTakeItEndsTheJobNamingThem) {
  PhaseOptions o;
  o.refits = 0;
  o.partial_refused = "engine rank 0's engine does not take partial refits (Engine::begin_partial)";
  RefitPhases phases(o);
  testing::PhaseActions actions;
  PhaseTime now = PhaseTime() + 1000s;
  actions.take(phases.start(now, now + 10s));
  actions.take(phases.on(Received{0, Linked{}}, now));
  actions.take(phases.on(Received{1, Linked{}}, now));
  actions.take(phases.on(Received{0, Request{1, kOnly}}, now));
  ASSERT_TRUE(actions.ended().has_value());
  EXPECT_HAS(actions.ended()->message(), "trainer rank 0 asks for a partial refit 1 ([*.q_proj.weight, *norm*]): "
                                         "engine rank 0's engine does not take partial refits");
  EXPECT_TRUE(actions.of<SendAll>().empty() || !std::holds_alternative<Start>(actions.of<SendAll>().back().message));
}

// A partial ask in a job that engines may join is refused, named. Catches:
// the check left out (a joiner would be verified against one version).
TEST(RefitPhaseScope, APartialAskWhereEnginesMayJoinIsRefused) {
  ScopeJob job(1, 1, 0, {}, /*max_engines=*/2);
  for (int m = 0; m < 2; ++m) job.Send(m, Linked{});
  job.Send(0, Request{1, kOnly});
  ASSERT_TRUE(job.actions().ended().has_value());
  EXPECT_HAS(job.actions().ended()->message(), "trainer rank 0 asks for a partial refit 1 ([*.q_proj.weight, "
                                               "*norm*]) in a job that engines may join (--max-engines)");
}

}  // namespace
}  // namespace refit
