// The ReferenceEngine and partial refits (refit/partial.h): live weights
// take the scope's tensors and keep the others; shadow weights first copy
// the served bytes of the tensors outside the scope into the arena the
// refit lands in, only where that arena holds another version of them, so
// every flip serves a whole version.
//
// Catches (each tried once, 2026-12-06):
//   - no catch-up (begin_partial without catch_up_landing): the flip serves
//     t1..t5 of refit 0 (zeros) beside t0 of refit 2: ShadowCatchUp fails;
//   - a catch-up that copies every time (the held versions ignored):
//     catch_up_bytes of the repeated scope is not 0;
//   - an abort that leaves the moved tensors' versions as they were
//     (note_landed(0) left out): the landing arena's aborted t1 counts as
//     refit 1's, is not copied back, and the next flip serves refit 3's
//     bytes of t1: AnAbortedPartialRefit... fails.
#include <gtest/gtest.h>

#include "refit/reference_engine.h"
#include "testing/status_matchers.h"
#include "testing/versioned_tensors.h"

namespace refit {
namespace {

constexpr int kTensors = 6;
constexpr std::uint64_t kTensorBytes = 64;

struct Versions : testing::VersionedTensors {
  Versions() : VersionedTensors(kTensors, kTensorBytes) {}
  // Refit `version` of tensors [first, last) (every tensor: a full refit).
  void refit(ReferenceEngine& engine, std::uint64_t version, int first = 0, int last = kTensors,
             const std::vector<std::string>& only = {}) {
    ASSERT_OK(only.empty() ? engine.begin(version) : engine.begin_partial(version, RefitScope{only}));
    ASSERT_OK(engine.apply(batch(version, first, last)));
    ASSERT_OK(engine.commit(version));
  }
  // Whether the served weights hold tensor i at want[i].
  bool serves(const ReferenceEngine& engine, const std::vector<std::uint64_t>& want) const {
    for (std::size_t i = 0; i < kTensors; ++i) {
      if (!holds(engine.weight(0, name(i)), want[i], i)) return false;
    }
    return true;
  }
};

std::unique_ptr<ReferenceEngine> make(const Versions& v, bool shadow) {
  ReferenceEngineOptions options;
  options.shadow = shadow;
  auto engine = ReferenceEngine::Create(v.streams, {0}, options);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  return std::move(engine).value();
}

// Live weights: the scope's tensors are written, the others keep their
// bytes and their versions (served_version). Catches: begin_partial
// marking every tensor moved (served_version of t3 would be 2), a catch-up
// run over live weights (catch_up_bytes not 0).
TEST(ReferenceEnginePartial, LiveWeightsKeepTheTensorsOutsideTheScope) {
  Versions v;
  auto engine = make(v, /*shadow=*/false);
  v.refit(*engine, 1);
  v.refit(*engine, 2, 0, 1, {"t0"});
  EXPECT_EQ(engine->weight_version(), 2u);
  EXPECT_TRUE(v.serves(*engine, {2, 1, 1, 1, 1, 1}));
  EXPECT_EQ(engine->served_version(0, 0), 2u);
  EXPECT_EQ(engine->served_version(0, 3), 1u);
  EXPECT_EQ(engine->stats().catch_up_bytes, 0u);
}

TEST(ReferenceEnginePartial, ShadowCatchUpCopiesOnlyWhatTheLandingArenaLacks) {
  Versions v;
  auto engine = make(v, /*shadow=*/true);
  v.refit(*engine, 1);  // arena 1 serves refit 1; arena 0 holds nothing
  v.refit(*engine, 2, 0, 1, {"t0"});  // lands in arena 0: t1..t5 copied from arena 1
  EXPECT_TRUE(v.serves(*engine, {2, 1, 1, 1, 1, 1}));
  EXPECT_EQ(engine->stats().catch_up_bytes, 5 * kTensorBytes);
  v.refit(*engine, 3, 0, 1, {"t0"});  // lands in arena 1: t1..t5 are refit 1's there already
  EXPECT_TRUE(v.serves(*engine, {3, 1, 1, 1, 1, 1}));
  EXPECT_EQ(engine->stats().catch_up_bytes, 5 * kTensorBytes) << "a repeated scope copies nothing";
  v.refit(*engine, 4, 1, 2, {"t1"});  // lands in arena 0, whose t0 is refit 2's: copied
  EXPECT_TRUE(v.serves(*engine, {3, 4, 1, 1, 1, 1}));
  EXPECT_EQ(engine->stats().catch_up_bytes, 6 * kTensorBytes);
  EXPECT_EQ(engine->served_version(0, 0), 3u);
  EXPECT_EQ(engine->served_version(0, 1), 4u);
}

// A partial refit aborted after its batch: the served version stays whole,
// and the next partial refit of another scope still catches the landing
// arena up (the aborted tensor there is not known any more).
TEST(ReferenceEnginePartial, AnAbortedPartialRefitLeavesItsTensorsUnknownWhereItLanded) {
  Versions v;
  auto engine = make(v, /*shadow=*/true);
  v.refit(*engine, 1);
  v.refit(*engine, 2, 0, 1, {"t0"});
  ASSERT_OK(engine->begin_partial(3, RefitScope{{"t1"}}));  // lands in arena 1
  ASSERT_OK(engine->apply(v.batch(3, 1, 2)));
  engine->abort(3, Aborted("a trainer died"));
  EXPECT_TRUE(v.serves(*engine, {2, 1, 1, 1, 1, 1}));
  v.refit(*engine, 4, 2, 3, {"t2"});  // lands in arena 1 again: its t1 (refit 3's, aborted) is copied back
  EXPECT_TRUE(v.serves(*engine, {2, 1, 4, 1, 1, 1}));
}

// Catches: a glob that selects nothing taken as an empty scope (a refit of
// nothing called done).
TEST(ReferenceEnginePartial, AGlobThatSelectsNothingIsRefused) {
  Versions v;
  auto engine = make(v, /*shadow=*/true);
  v.refit(*engine, 1);
  const Status s = engine->begin_partial(2, RefitScope{{"nothing*"}});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("glob 'nothing*' selects none"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace refit
