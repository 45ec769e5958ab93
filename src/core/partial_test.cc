// Partial refits' selection and plan (refit/partial.h): globs select by
// whole name and a glob that selects nothing is refused; a subset plan
// keeps the full stream's specs, carries every selected byte exactly once
// and nothing else, and every bucket fits the full plan's slot. Each test
// names the mutation it catches.
#include "refit/partial.h"

#include <gtest/gtest.h>

#include <vector>

#include "refit/transfer_defaults.h"
#include "testing/expect_has.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

TensorSpec mib(const std::string& name, std::int64_t mebibytes) {
  return TensorSpec{name, DType::kUInt8, {mebibytes, static_cast<std::int64_t>(kMiB)}};
}

// Catches: a glob matched as a substring (lora_A would select base weights
// named like it), duplicates kept (two scopes of one subset would differ),
// a glob that selects nothing accepted (a misspelt subset refits nothing).
TEST(PartialScope, GlobsSelectWholeNamesAndOneThatSelectsNothingIsRefused) {
  const std::vector<TensorSpec> specs = {mib("layers.0.q.lora_A", 1), mib("layers.0.q.weight", 1),
                                         mib("layers.1.q.lora_A", 1)};
  ASSERT_OK_AND_ASSIGN(const RefitScope scope, canonical_scope({"*.lora_A", "*.lora_A"}));
  EXPECT_EQ(scope.only, std::vector<std::string>{"*.lora_A"});
  ASSERT_OK_AND_ASSIGN(const std::vector<bool> selected, select_tensors(scope, specs));
  EXPECT_EQ(selected, (std::vector<bool>{true, false, true}));
  ASSERT_OK_AND_ASSIGN(const std::vector<bool> all, select_tensors(RefitScope{}, specs));
  EXPECT_EQ(all, (std::vector<bool>{true, true, true}));
  ASSERT_OK_AND_ASSIGN(const RefitScope missing, canonical_scope({"*.lora_B"}));
  auto none = select_tensors(missing, specs);
  ASSERT_FALSE(none.ok());
  EXPECT_HAS(none.status().message(), "glob '*.lora_B' selects none of the stream's 3 tensors");
  EXPECT_FALSE(canonical_scope({""}).ok());
}

// Buckets of 64 MiB over A 30, B 40, C 30 MiB: the full plan is [A] [B] [C]
// (its slot: 40 MiB). The subset {A, C} packed at 64 MiB would be one
// 60 MiB bucket no slot holds; closed at the slot it is [A] [C]. Specs stay
// the full stream's; every selected byte is in exactly one entry. Catches:
// closing at the bucket size (a bucket past the slot), specs filtered (the
// indices would no longer name the full stream's tensors), an unselected
// tensor packed. Tried once: closing at the bucket size failed here.
TEST(PartialPlan, ASubsetKeepsTheFullSpecsAndEveryBucketFitsTheSlot) {
  ASSERT_OK_AND_ASSIGN(const Plan full, make_plan({mib("A", 30), mib("B", 40), mib("C", 30)}, 64 * kMiB));
  ASSERT_EQ(full.buckets.size(), 3u);
  ASSERT_EQ(pool_slot_bytes(full), 40 * kMiB);
  ASSERT_OK_AND_ASSIGN(const Plan subset, make_subset_plan(full, {true, false, true}));
  EXPECT_EQ(subset.specs, full.specs);
  EXPECT_EQ(subset.total_bytes, 60 * kMiB);
  ASSERT_EQ(subset.buckets.size(), 2u);
  std::vector<std::uint64_t> covered(full.specs.size(), 0);
  for (const Bucket& b : subset.buckets) {
    EXPECT_LE(b.bytes, pool_slot_bytes(full));
    for (const PlanEntry& e : b.entries) covered[e.tensor] += e.bytes;
  }
  EXPECT_EQ(covered, (std::vector<std::uint64_t>{30 * kMiB, 0, 30 * kMiB}));
  EXPECT_NE(subset.digest, full.digest);
}

// A tensor above the bucket size is cut as the full plan cuts it; all
// selected is the full plan itself (same digest); the same selection gives
// the same digest (trainer and engine compute it apart); an empty or
// mis-sized selection is refused. Catches: chunks of another size (the
// engine's reassembly would not match), a subset digest that depends on
// anything but the full plan and the selection.
TEST(PartialPlan, ChunksFollowTheFullPlanAndTheDigestIsAPureFunction) {
  ASSERT_OK_AND_ASSIGN(const Plan full, make_plan({mib("big", 150), mib("x", 10), mib("y", 20)}, 64 * kMiB));
  ASSERT_OK_AND_ASSIGN(const Plan same, make_subset_plan(full, {true, true, true}));
  EXPECT_EQ(same.digest, full.digest);
  ASSERT_OK_AND_ASSIGN(const Plan a, make_subset_plan(full, {true, false, true}));
  ASSERT_OK_AND_ASSIGN(const Plan b, make_subset_plan(full, {true, false, true}));
  EXPECT_EQ(a.digest, b.digest);
  EXPECT_EQ(a.largest_chunked_tensor, 150 * kMiB);
  std::vector<std::uint64_t> chunks;
  for (const Bucket& bucket : a.buckets) {
    for (const PlanEntry& e : bucket.entries) {
      if (e.tensor == 0) chunks.push_back(e.bytes);
    }
  }
  EXPECT_EQ(chunks, (std::vector<std::uint64_t>{64 * kMiB, 64 * kMiB, 22 * kMiB}));
  EXPECT_FALSE(make_subset_plan(full, {false, false, false}).ok());
  EXPECT_FALSE(make_subset_plan(full, {true, false}).ok());
}

}  // namespace
}  // namespace refit
