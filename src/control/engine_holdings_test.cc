// EngineHoldings: what the report says each engine rank holds at the end.
//
// Catches (each tried once, 2026-12-05): went() marking shadow engines
// incomplete too (ShadowWeightsStayComplete... fails); went() ignoring the
// version (a go of the committed version itself, as after a recovery's
// relink, would mark them: GoOfALaterRefit... fails); the verified version
// following the commit whatever the done said (Unverified... fails).
#include "control/engine_holdings.h"

#include <gtest/gtest.h>

namespace refit {
namespace {

RecordCommit commit_of(std::uint64_t version, std::vector<bool> verified, bool shadow) {
  RecordCommit commit;
  commit.version = version;
  for (bool v : verified) {
    Done done;
    done.version = version;
    done.verified = v;
    done.stats = Json{{"shadow", shadow}};
    commit.engines.push_back(done);
  }
  return commit;
}

Json engine(const EngineHoldings& h, std::size_t e) { return h.json().at(e); }

TEST(EngineHoldings, GoOfALaterRefitMarksLiveWeightsIncomplete) {
  EngineHoldings h(2);
  h.went(1);
  h.committed(commit_of(1, {true, true}, /*shadow=*/false));
  h.went(1);  // not a later refit: nothing is written
  EXPECT_TRUE(engine(h, 0)["weights_complete"].get<bool>());
  h.went(2);
  for (std::size_t e = 0; e < 2; ++e) {
    EXPECT_EQ(engine(h, e)["weight_version"], 1u);
    EXPECT_EQ(engine(h, e)["verified_version"], 1u);
    EXPECT_FALSE(engine(h, e)["weights_complete"].get<bool>());
    EXPECT_FALSE(engine(h, e)["shadow"].get<bool>());
  }
  h.committed(commit_of(2, {true, true}, false));
  EXPECT_TRUE(engine(h, 1)["weights_complete"].get<bool>());
  EXPECT_EQ(engine(h, 1)["weight_version"], 2u);
}

TEST(EngineHoldings, ShadowWeightsStayCompleteThroughARefitInFlight) {
  EngineHoldings h(1);
  h.committed(commit_of(1, {true}, /*shadow=*/true));
  h.went(2);
  EXPECT_TRUE(engine(h, 0)["weights_complete"].get<bool>());
  EXPECT_TRUE(engine(h, 0)["shadow"].get<bool>());
  EXPECT_EQ(engine(h, 0)["weight_version"], 1u);
}

TEST(EngineHoldings, UnverifiedCommitsKeepTheLastVerifiedVersion) {
  EngineHoldings h(2);
  h.committed(commit_of(1, {true, true}, false));
  h.committed(commit_of(2, {true, false}, false));
  EXPECT_EQ(engine(h, 0)["verified_version"], 2u);
  EXPECT_EQ(engine(h, 1)["verified_version"], 1u);
  EXPECT_EQ(engine(h, 1)["weight_version"], 2u);
}

TEST(EngineHoldings, ARecoveryTakesTheEnginesWord) {
  EngineHoldings h(2);
  h.committed(commit_of(1, {true, true}, false));
  h.went(2);
  RecordRecovery recovery;
  recovery.version = 2;
  recovery.engines = {Linked{1, false}, Linked{1, true}};
  h.recovered(recovery);
  EXPECT_FALSE(engine(h, 0)["weights_complete"].get<bool>());
  EXPECT_TRUE(engine(h, 1)["weights_complete"].get<bool>());
}

}  // namespace
}  // namespace refit
