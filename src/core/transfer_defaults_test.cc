#include "refit/transfer_defaults.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "refit/roles.h"
#include "refit/transports.h"

namespace refit {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kGiB = 1ull << 30;

TensorSpec U8(std::string name, std::int64_t n) { return TensorSpec{std::move(name), DType::kUInt8, {n}}; }

Plan MustPlan(std::vector<TensorSpec> specs, std::uint64_t bucket_size) {
  auto plan = make_plan(std::move(specs), bucket_size);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  return plan.ok() ? std::move(plan).value() : Plan{};
}

// Catches: a default that is not auto (the library, the CLI and Python all
// read these two fields).
TEST(TransferDefaults, RankOptionsLeaveBucketAndSlotsToRefit) {
  EXPECT_EQ(RankOptions{}.bucket_size, kAutoBucketSize);
  EXPECT_EQ(EngineOptions{}.pool_slots, kAutoPoolSlots);
}

// Catches: a GPU transport left at the host size (or the reverse), and a
// transport name the table forgot (every name gets a size make_plan takes).
TEST(TransferDefaults, BucketSizeFollowsTheTransport) {
  EXPECT_EQ(default_bucket_size("cuda_ipc"), kGiB);
  EXPECT_EQ(default_bucket_size("nccl"), kGiB);
  EXPECT_EQ(default_bucket_size("shm"), 64 * kMiB);
  EXPECT_EQ(default_bucket_size("tcp"), 64 * kMiB);
  EXPECT_EQ(default_bucket_size("ucx"), 64 * kMiB);
  for (const std::string& t : transport_names()) {
    const std::uint64_t b = default_bucket_size(t);
    EXPECT_GE(b, kMinBucketSize) << t;
    EXPECT_EQ(b % kPlanAlignment, 0u) << t;
  }
}

// Catches: an explicit size overridden by the default, or auto not resolved.
TEST(TransferDefaults, EffectiveBucketSizeKeepsAnExplicitSize) {
  EXPECT_EQ(effective_bucket_size(4 * kMiB, "cuda_ipc"), 4 * kMiB);
  EXPECT_EQ(effective_bucket_size(kAutoBucketSize, "cuda_ipc"), kGiB);
  EXPECT_EQ(effective_bucket_size(kAutoBucketSize, "shm"), 64 * kMiB);
}

// Catches: slots sized by bucket_size (a 1 GiB slot for a 10 KB model), a
// slot smaller than the largest bucket, and an unaligned slot.
TEST(TransferDefaults, PoolSlotHoldsTheLargestBucketOnly) {
  const Plan small = MustPlan({U8("a", 1000), U8("b", 3000)}, kGiB);
  ASSERT_EQ(small.buckets.size(), 1u);
  EXPECT_EQ(pool_slot_bytes(small), 4096u);  // 1000 -> 1024 aligned, + 3000 = 4024 -> 4096
  EXPECT_GE(pool_slot_bytes(small), small.buckets[0].bytes);

  const Plan chunked = MustPlan({U8("big", 10 * 4096 + 5)}, 4096);
  EXPECT_EQ(pool_slot_bytes(chunked), 4096u);  // full chunks: never above bucket_size
  for (const Bucket& b : chunked.buckets) EXPECT_LE(b.bytes, pool_slot_bytes(chunked));

  const Plan mixed = MustPlan({U8("x", 100), U8("y", 7000), U8("z", 100)}, 8192);
  std::uint64_t largest = 0;
  for (const Bucket& b : mixed.buckets) largest = std::max(largest, b.bytes);
  EXPECT_GE(pool_slot_bytes(mixed), largest);
  EXPECT_EQ(pool_slot_bytes(mixed) % kPlanAlignment, 0u);
  EXPECT_LE(pool_slot_bytes(mixed), mixed.bucket_size);
}

// Catches: auto ignoring the memory limit (3 slots that do not fit where 2
// would), an explicit count changed, and 2 picked without a limit.
TEST(TransferDefaults, PoolSlotsAreThreeUnlessTheLimitHoldsFewer) {
  EXPECT_EQ(effective_pool_slots(kAutoPoolSlots, 64 * kMiB, 0), 3);
  EXPECT_EQ(effective_pool_slots(kAutoPoolSlots, 64 * kMiB, 192 * kMiB), 3);
  EXPECT_EQ(effective_pool_slots(kAutoPoolSlots, 64 * kMiB, 192 * kMiB - 1), 2);
  EXPECT_EQ(effective_pool_slots(kAutoPoolSlots, 64 * kMiB, 64 * kMiB), 2);  // too small: the caller names it
  EXPECT_EQ(effective_pool_slots(5, 64 * kMiB, 128 * kMiB), 5);
  EXPECT_EQ(effective_pool_slots(2, 64 * kMiB, 0), 2);
}

}  // namespace
}  // namespace refit
