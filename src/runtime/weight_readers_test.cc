// WeightReaders (--readers, issue 21): a reader that runs between two
// batches of a refit over live weights counts torn reads, and over shadow
// weights none; reads start with the first commit; a check that cannot look
// stops its reader and is kept.
//
// Catches (tried once, 2026-12-05): torn reads never counted (`torn_`
// never incremented: the live case fails), and passes before the first
// commit counted (the version-0 skip removed: NothingIsReadBefore... fails).
#include "runtime/weight_readers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "testing/status_matchers.h"
#include "testing/versioned_tensors.h"

namespace refit {
namespace {

constexpr int kTensors = 4;

// Four 32-byte tensors of one rank (testing/versioned_tensors.h).
struct Job : testing::VersionedTensors {
  Job() : VersionedTensors(kTensors, 32) {}
  // The readers' check: tensor `index` as served is all version's pattern.
  WeightReaders::Check check(const ReferenceEngine& engine) const {
    return [this, &engine](std::size_t index, std::uint64_t version) -> StatusOr<bool> {
      return holds(engine.weight(0, name(index)), version, index);
    };
  }
};

std::unique_ptr<ReferenceEngine> make_engine(const Job& job, bool shadow) {
  ReferenceEngineOptions options;
  options.shadow = shadow;
  return ReferenceEngine::Create(job.streams, {0}, options).value();
}

// Waits (yielding, no sleep) until the readers made `more` reads past `from`.
void await_reads(const WeightReaders& readers, std::uint64_t from, std::uint64_t more) {
  while (readers.counts().reads < from + more) std::this_thread::yield();
}

// Refit 1 whole; refit 2's first batch (tensor 0) applied; one reader reads
// every tensor at least once (round robin) before the rest is applied.
ReadCounts reads_across_a_refit(bool shadow) {
  Job job;
  auto engine = make_engine(job, shadow);
  EXPECT_OK(engine->begin(1));
  EXPECT_OK(engine->apply(job.batch(1, 0, kTensors)));
  EXPECT_OK(engine->commit(1));
  WeightReaders readers(*engine, 1, kTensors, job.check(*engine));
  EXPECT_OK(engine->begin(2));
  EXPECT_OK(engine->apply(job.batch(2, 0, 1)));
  await_reads(readers, readers.counts().reads, kTensors + 1);
  EXPECT_OK(engine->apply(job.batch(2, 1, kTensors)));
  EXPECT_OK(engine->commit(2));
  await_reads(readers, readers.counts().reads, kTensors + 1);
  EXPECT_OK(readers.error());
  return readers.counts();
}

TEST(WeightReaders, LiveWeightsReadBetweenBatchesAreTorn) {
  const ReadCounts live = reads_across_a_refit(/*shadow=*/false);
  EXPECT_GE(live.torn_reads, 1u);
  EXPECT_GE(live.reads, 2u * (kTensors + 1));
}

TEST(WeightReaders, ShadowWeightsAreNeverTorn) {
  const ReadCounts shadow = reads_across_a_refit(/*shadow=*/true);
  EXPECT_EQ(shadow.torn_reads, 0u);
  EXPECT_GE(shadow.reads, 2u * (kTensors + 1));
}

TEST(WeightReaders, NothingIsReadBeforeTheFirstCommit) {
  Job job;
  auto engine = make_engine(job, /*shadow=*/true);
  std::atomic<int> checks{0};
  {
    WeightReaders readers(*engine, 2, kTensors, [&](std::size_t, std::uint64_t) -> StatusOr<bool> {
      checks.fetch_add(1);
      return true;
    });
    EXPECT_OK(engine->begin(1));
    EXPECT_OK(engine->apply(job.batch(1, 0, kTensors)));
    while (readers.passes() < 4) std::this_thread::yield();  // passes before the commit
    EXPECT_EQ(readers.counts().reads, 0u);
    EXPECT_EQ(checks.load(), 0);
    EXPECT_OK(engine->commit(1));
    await_reads(readers, 0, 4);
  }
  EXPECT_GE(checks.load(), 4);
}

TEST(WeightReaders, ACheckThatCannotLookStopsItsReaderAndIsKept) {
  Job job;
  auto engine = make_engine(job, /*shadow=*/true);
  EXPECT_OK(engine->begin(1));
  EXPECT_OK(engine->apply(job.batch(1, 0, kTensors)));
  EXPECT_OK(engine->commit(1));
  std::atomic<int> calls{0};
  WeightReaders readers(*engine, 1, kTensors, [&](std::size_t, std::uint64_t) -> StatusOr<bool> {
    calls.fetch_add(1);
    return Internal("device copy failed");
  });
  while (readers.error().ok()) std::this_thread::yield();
  EXPECT_NE(readers.error().message().find("device copy failed"), std::string::npos);
  EXPECT_EQ(readers.counts().reads, 0u);
}

}  // namespace
}  // namespace refit
