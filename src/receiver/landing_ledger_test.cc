// The ledger's rules for delta-encoded kLanded frames (issue 22): accepted
// only in a refit that offered a base, for a bucket one link writes whole,
// in fewer bytes than the bucket and at least an encoding's header; a raw
// kLanded still announces exactly the bucket's bytes. Each test names the
// mutation it catches.
#include "receiver/landing_ledger.h"

#include <gtest/gtest.h>

#include "delta/word_delta.h"
#include "testing/expect_has.h"

namespace refit {
namespace {

Plan two_buckets() {
  std::vector<TensorSpec> specs = {TensorSpec{"a", DType::kBFloat16, {4096}},
                                   TensorSpec{"b", DType::kBFloat16, {4096}}};
  return make_plan(std::move(specs), 8192).value();
}

FrameHeader landed(std::uint64_t bucket, std::uint64_t bytes, bool encoded) {
  return encode(LandedFrame{3, bucket, 0, bytes, encoded});
}

// An encoded bucket with a base offered lands, and the ledger keeps its
// encoded size for the decode; the next refit forgets it. Catches: the
// encoded size not recorded (the receiver would read the slot as raw
// bytes), a stale size kept into the next refit.
TEST(LandingLedgerDelta, AnEncodedBucketLandsWhenABaseWasOffered) {
  const Plan plan = two_buckets();
  LandingLedger ledger(&plan, "engine rank 0");
  ledger.set_links({"trainer link 0"}, round_robin_feeders(plan, 1));
  ledger.begin(3, /*direct=*/false, /*delta_base=*/2);
  ledger.grant(0, 0);
  auto landing = ledger.land(0, landed(0, 100, true));
  ASSERT_TRUE(landing.ok()) << landing.status().ToString();
  EXPECT_TRUE(landing->complete);
  EXPECT_TRUE(landing->encoded);
  EXPECT_EQ(landing->announced, 100u);
  EXPECT_EQ(ledger.encoded_bytes(0), 100u);
  EXPECT_EQ(ledger.encoded_bytes(1), 0u);
  ledger.begin(4, false, 3);
  EXPECT_EQ(ledger.encoded_bytes(0), 0u);
}

// Out of protocol, each named: encoded with no base offered; encoded in as
// many bytes as the bucket or fewer than a header; a raw kLanded of another
// size; encoded by one of a bucket's several writers. Catches: any of the
// checks dropped (an encoding would be
// decoded over a base the engine never offered, or a slot overrun).
TEST(LandingLedgerDelta, EncodingsOutsideTheRulesAreRefusedNamingWhy) {
  const Plan plan = two_buckets();
  const std::uint64_t bucket = plan.buckets[0].bytes;
  struct Case {
    std::uint64_t base, bytes;
    bool encoded;
    const char* says;
  } cases[] = {
      {0, 100, true, "no base was offered in refit 3"},
      {2, bucket, true, "fewer than the bucket's"},
      {2, kDeltaHeaderBytes - 1, true, "fewer than the bucket's"},
      {2, 100, false, "the plan's bucket holds"},
  };
  for (const Case& c : cases) {
    LandingLedger ledger(&plan, "engine rank 0");
    ledger.set_links({"trainer link 0"}, round_robin_feeders(plan, 1));
    ledger.begin(3, false, c.base);
    ledger.grant(0, 0);
    auto landing = ledger.land(0, landed(0, c.bytes, c.encoded));
    ASSERT_FALSE(landing.ok()) << c.bytes;
    EXPECT_EQ(landing.status().code(), StatusCode::kDataLoss);
    EXPECT_HAS(landing.status().message(), c.says);
  }
  // A bucket two links write in parts cannot be encoded: neither holds it whole.
  LandingLedger ledger(&plan, "engine rank 0");
  BucketFeeders parts = round_robin_feeders(plan, 1);
  parts[0] = {{0, bucket / 2}, {1, bucket - bucket / 2}};
  ledger.set_links({"trainer link 0", "trainer link 1"}, parts);
  ledger.begin(3, false, 2);
  ledger.grant(0, 0);
  auto landing = ledger.land(1, landed(0, 100, true));
  ASSERT_FALSE(landing.ok());
  EXPECT_HAS(landing.status().message(), "the bucket is written in parts");
}

}  // namespace
}  // namespace refit
