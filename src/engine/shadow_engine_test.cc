// ShadowEngine (refit/shadow_engine.h): each refit copies into the arena not
// served, commit flips it into service and then calls the flip hook, an abort
// leaves the served arena whole, and the arenas alternate.
//
// Catches (each tried once, 2026-12-06):
//   - begin() targeting the served arena: CommitServes... and Abort... fail;
//   - commit() without the flip: CommitServes... and Arenas... fail;
//   - the flip hook called before the flip: CommitServes... fails;
//   - abort() flipping (or weights_complete() following the copies'
//     engine): Abort... fails;
//   - a partial refit without the catch-up: PartialRefits... fails (the
//     flip serves t1..t3 at 0 beside t0 at 2);
//   - a catch-up that ignores the held versions: PartialRefits... fails
//     (the repeated scope copies again).
#include "refit/shadow_engine.h"

#include <gtest/gtest.h>

#include <vector>

#include "testing/status_matchers.h"
#include "testing/versioned_tensors.h"

namespace refit {
namespace {

constexpr int kTensors = 4;

struct Fixture : ::testing::Test {
  testing::VersionedTensors v{kTensors, 96};
  std::unique_ptr<ShadowEngine> engine;
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(engine, ShadowEngine::Create(0, v.streams[0], MemoryKind::kHost, -1));
  }
  void refit(std::uint64_t version) {
    ASSERT_OK(engine->begin(version));
    for (int i = 0; i < kTensors; i += 2) ASSERT_OK(engine->apply(v.batch(version, i, i + 2)));
    ASSERT_OK(engine->commit(version));
  }
  bool holds(const WeightArena& arena, std::uint64_t version) const {
    for (std::size_t i = 0; i < kTensors; ++i) {
      if (!v.holds(arena.tensor(i), version, i)) return false;
    }
    return true;
  }
};

using ShadowEngineTest = Fixture;

TEST_F(ShadowEngineTest, CommitServesTheLandedArenaThenCallsTheFlipHook) {
  std::vector<std::uint64_t> flips;
  engine->set_flip_hook([&](std::uint64_t version) {
    flips.push_back(version);
    EXPECT_TRUE(holds(*engine->served(), version)) << "the hook runs after the flip";
    EXPECT_EQ(engine->weight_version(), version);
    return Status::Ok();
  });
  refit(1);
  EXPECT_TRUE(holds(*engine->served(), 1));
  EXPECT_FALSE(holds(*engine->landing(), 1)) << "version 1 landed in one arena only";
  refit(2);
  EXPECT_TRUE(holds(*engine->served(), 2));
  EXPECT_TRUE(holds(*engine->landing(), 1)) << "the arena served before is the next one to land in";
  EXPECT_EQ(flips, (std::vector<std::uint64_t>{1, 2}));
}

TEST_F(ShadowEngineTest, AbortLeavesTheServedArenaWholeAndTheNextRefitCommits) {
  refit(1);
  const WeightArena* served = engine->served().get();
  ASSERT_OK(engine->begin(2));
  ASSERT_OK(engine->apply(v.batch(2, 0, 2)));  // half of version 2, then the refit fails
  engine->abort(2, Aborted("a trainer died"));
  EXPECT_EQ(engine->served().get(), served);
  EXPECT_TRUE(holds(*engine->served(), 1));
  EXPECT_TRUE(engine->weights_complete());
  EXPECT_EQ(engine->weight_version(), 1u);
  refit(3);
  EXPECT_TRUE(holds(*engine->served(), 3));
  EXPECT_EQ(engine->weight_version(), 3u);
}

// Partial refits: the landing arena first takes the served bytes of the
// tensors outside the scope (only those it holds at another version), so
// each flip serves a whole version; an aborted partial refit's tensors are
// copied back before the next flip.
TEST_F(ShadowEngineTest, PartialRefitsServeWholeVersionsCopyingOnlyWhatTheLandingArenaLacks) {
  auto partial = [&](std::uint64_t version, int tensor, bool commit = true) {
    ASSERT_OK(engine->begin_partial(version, RefitScope{{testing::VersionedTensors::name(tensor)}}));
    ASSERT_OK(engine->apply(v.batch(version, tensor, tensor + 1)));
    if (commit) {
      ASSERT_OK(engine->commit(version));
    } else {
      engine->abort(version, Aborted("a trainer died"));
    }
  };
  auto serves = [&](const std::vector<std::uint64_t>& want) {
    for (std::size_t i = 0; i < kTensors; ++i) {
      if (!v.holds(engine->served()->tensor(i), want[i], i)) return false;
    }
    return true;
  };
  refit(1);
  partial(2, 0);
  EXPECT_TRUE(serves({2, 1, 1, 1}));
  EXPECT_EQ(engine->catch_up_bytes(), 3 * 96u);
  partial(3, 0);
  EXPECT_TRUE(serves({3, 1, 1, 1}));
  EXPECT_EQ(engine->catch_up_bytes(), 3 * 96u) << "the landing arena held t1..t3 at 1 already";
  partial(4, 1, /*commit=*/false);
  EXPECT_TRUE(serves({3, 1, 1, 1}));
  partial(5, 2);
  EXPECT_TRUE(serves({3, 1, 5, 1}));
}

TEST_F(ShadowEngineTest, ArenasAlternateAndCostTwiceTheWeights) {
  const WeightArena* first = engine->served().get();
  refit(1);
  EXPECT_NE(engine->served().get(), first);
  refit(2);
  EXPECT_EQ(engine->served().get(), first);
  EXPECT_EQ(engine->weight_memory_bytes(), 2 * engine->served()->bytes());
  EXPECT_GE(engine->served()->bytes(), std::uint64_t{kTensors} * 96);
}

TEST_F(ShadowEngineTest, AFlipHookErrorFailsTheCommitWithTheNewVersionServed) {
  engine->set_flip_hook([](std::uint64_t) { return Aborted("the server's cache flush failed"); });
  ASSERT_OK(engine->begin(1));
  for (int i = 0; i < kTensors; i += 2) ASSERT_OK(engine->apply(v.batch(1, i, i + 2)));
  const Status status = engine->commit(1);
  EXPECT_EQ(status.code(), StatusCode::kAborted);
  EXPECT_TRUE(holds(*engine->served(), 1));
}

// Release between refits (kSeparate, staged mode): release_idle() drops the
// arena not served and returns its bytes, a view of it kept by a server
// stays valid (the shared_ptr), begin() is refused until acquire_idle(), and
// refits go on alternating; kOneRegion releases nothing. Catches: the
// served arena dropped (holds() of served() fails), a begin() into a
// released arena accepted. Tried once: resetting arenas_[served_] failed
// here.
TEST(ShadowEngineRelease, ReleaseIdleDropsOnlyTheArenaNotServedUntilAcquired) {
  testing::VersionedTensors v{kTensors, 96};
  ASSERT_OK_AND_ASSIGN(auto engine, ShadowEngine::Create(0, v.streams[0], MemoryKind::kHost, -1,
                                                         ShadowArenas::kSeparate));
  auto refit = [&](std::uint64_t version) {
    ASSERT_OK(engine->begin(version));
    for (int i = 0; i < kTensors; i += 2) ASSERT_OK(engine->apply(v.batch(version, i, i + 2)));
    ASSERT_OK(engine->commit(version));
  };
  auto holds = [&](const WeightArena& arena, std::uint64_t version) {
    for (std::size_t i = 0; i < kTensors; ++i) {
      if (!v.holds(arena.tensor(i), version, i)) return false;
    }
    return true;
  };
  refit(1);
  refit(2);
  const std::shared_ptr<WeightArena> kept = engine->landing();  // a server's view of version 1
  ASSERT_OK_AND_ASSIGN(const std::uint64_t freed, engine->release_idle());
  EXPECT_EQ(freed, engine->served()->bytes());
  EXPECT_EQ(engine->landing(), nullptr);
  EXPECT_TRUE(holds(*engine->served(), 2));
  EXPECT_TRUE(holds(*kept, 1)) << "a view a server holds must stay valid";
  EXPECT_FALSE(engine->begin(3).ok());
  ASSERT_OK(engine->acquire_idle());
  refit(3);
  EXPECT_TRUE(holds(*engine->served(), 3));

  ASSERT_OK_AND_ASSIGN(auto one_region, ShadowEngine::Create(0, v.streams[0], MemoryKind::kHost, -1));
  ASSERT_OK_AND_ASSIGN(const std::uint64_t none, one_region->release_idle());
  EXPECT_EQ(none, 0u);
  EXPECT_NE(one_region->landing(), nullptr);
}

}  // namespace
}  // namespace refit
