// What a relay sends a child for a bucket (relay_forwarder.h relay_payload;
// the whole relay runs in tests/many_engines_test.cc).
#include "runtime/relay_forwarder.h"

#include <gtest/gtest.h>

#include <vector>

namespace refit {
namespace {

// An encoding goes only to a child whose credit offers the base it was
// encoded against; a child at another base, or with none (a new engine,
// one whose weights a failed refit left incomplete), gets the bytes, and
// so does every child of a bucket that arrived raw. Catches: an encoding
// sent to a child at another base (it would decode over the wrong bytes:
// its verification fails, or worse, on an engine without verification,
// serves them), an encoding "matched" against base 0.
TEST(RelayPayload, AnEncodingGoesOnlyToAChildAtItsBase) {
  const std::vector<std::byte> raw(64, std::byte{1}), encoding(8, std::byte{2});
  const RelayPayload same = relay_payload(raw, encoding, 5, 5);
  EXPECT_TRUE(same.encoded);
  EXPECT_EQ(same.bytes.data(), encoding.data());
  EXPECT_EQ(same.bytes.size(), encoding.size());
  for (std::uint64_t child : {0u, 4u, 6u}) {
    const RelayPayload other = relay_payload(raw, encoding, 5, child);
    EXPECT_FALSE(other.encoded) << child;
    EXPECT_EQ(other.bytes.data(), raw.data());
    EXPECT_EQ(other.bytes.size(), raw.size());
  }
  EXPECT_FALSE(relay_payload(raw, {}, 5, 5).encoded);
  EXPECT_FALSE(relay_payload(raw, encoding, 0, 0).encoded);
}

}  // namespace
}  // namespace refit
