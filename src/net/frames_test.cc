// The typed data-plane frames (net/frames.h): each field where the table
// says, and the flags a type does not define refused. Each test names the
// mutation it catches.
#include "net/frames.h"

#include <gtest/gtest.h>

#include "testing/expect_has.h"

namespace refit {
namespace {

// A credit's base and a kLanded's encoded flag survive the round trip.
// Catches: the base left out of field d (every engine then looks baseless,
// delta never used), the flag not written or not read (an encoded bucket
// taken for its bytes). Tried once: decode_credit without h.d failed here.
TEST(Frames, CreditBaseAndLandedEncodingRoundTrip) {
  auto credit = decode_credit(encode(CreditFrame{7, 3, 1, 6}), "peer");
  ASSERT_TRUE(credit.ok()) << credit.status().ToString();
  EXPECT_EQ(credit->version, 7u);
  EXPECT_EQ(credit->bucket, 3u);
  EXPECT_EQ(credit->slot, 1u);
  EXPECT_EQ(credit->base, 6u);
  for (bool encoded : {false, true}) {
    auto landed = decode_landed(encode(LandedFrame{7, 3, 1, 4096, encoded}), "peer");
    ASSERT_TRUE(landed.ok()) << landed.status().ToString();
    EXPECT_EQ(landed->bytes, 4096u);
    EXPECT_EQ(landed->encoded, encoded);
  }
}

// A kLanded with an undefined flag bit is out of protocol, named. Catches:
// unknown bits ignored (a newer peer's meaning silently dropped).
TEST(Frames, LandedWithUnknownFlagsIsRefused) {
  FrameHeader h = encode(LandedFrame{1, 0, 0, 64, false});
  h.flags = 2;
  auto landed = decode_landed(h, "trainer 0");
  ASSERT_FALSE(landed.ok());
  EXPECT_EQ(landed.status().code(), StatusCode::kDataLoss);
  EXPECT_HAS(landed.status().message(), "kLanded with flags 2");
}

}  // namespace
}  // namespace refit
