// A trainer rank's delta bases (delta/bucket_bases.h): after each commit
// every base is the bucket as sent; a failed refit keeps the old bases; a
// bucket not sent loses its base; an encoding that does not decode clears
// them all. Each test names the mutation it catches.
#include "delta/bucket_bases.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "delta/word_delta.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

std::vector<std::byte> encoded(const std::vector<std::byte>& now, std::span<const std::byte> base,
                               std::uint64_t version) {
  std::vector<std::byte> out(max_encoded_bytes(now.size()));
  auto e = encode_delta(now, base, version, out);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  out.resize(e.ok() ? e->bytes : 0);
  return out;
}

// Five versions of two buckets, each changing a few bytes, sent as the
// codec chooses against the bases: after each commit both bases equal what
// was sent. Catches: a commit that keeps the old base, a words encoding
// applied to a zeroed base, the base version not advanced. Tried once: a
// commit that keeps an existing base failed both tests.
TEST(BucketBases, EachCommitMakesWhatWasSentTheBase) {
  BucketBases bases({1000, 0, 4096});
  std::mt19937_64 rng(3);
  std::vector<std::byte> a(1000), c(4096);
  for (std::uint64_t v = 1; v <= 5; ++v) {
    for (int k = 0; k < 5; ++k) {
      a[rng() % a.size()] = static_cast<std::byte>(rng());
      c[rng() % c.size()] = static_cast<std::byte>(rng());
    }
    ASSERT_OK(bases.set_pending(0, encoded(a, bases.base(0), bases.base_version())));
    ASSERT_OK(bases.set_pending(2, encoded(c, bases.base(2), bases.base_version())));
    ASSERT_OK(bases.commit(v));
    EXPECT_EQ(bases.base_version(), v);
    ASSERT_EQ(std::vector<std::byte>(bases.base(0).begin(), bases.base(0).end()), a) << "version " << v;
    ASSERT_EQ(std::vector<std::byte>(bases.base(2).begin(), bases.base(2).end()), c) << "version " << v;
    EXPECT_TRUE(bases.base(1).empty());
  }
  EXPECT_EQ(bases.bytes_held(), 1000u + 4096u);
  EXPECT_FALSE(bases.set_pending(1, {}).ok()) << "bucket 1 is not this rank's";
}

// A failed refit keeps the bases at the last commit; a bucket left out of
// a committed refit loses its base; an encoding against another version
// clears every base. Catches: pending bytes applied without a commit, a
// stale base kept, a failed decode leaving half the bases advanced.
TEST(BucketBases, FailuresNeverLeaveAStaleBase) {
  BucketBases bases({64, 64});
  std::vector<std::byte> x(64, std::byte{1}), y(64, std::byte{2});
  ASSERT_OK(bases.set_pending(0, encoded(x, {}, 0)));
  ASSERT_OK(bases.set_pending(1, encoded(y, {}, 0)));
  ASSERT_OK(bases.commit(1));
  auto x2 = x;
  x2[5] = std::byte{9};
  ASSERT_OK(bases.set_pending(0, encoded(x2, bases.base(0), 1)));
  bases.drop_pending();  // refit 2 failed
  EXPECT_EQ(std::vector<std::byte>(bases.base(0).begin(), bases.base(0).end()), x);
  ASSERT_OK(bases.set_pending(0, encoded(x2, bases.base(0), 1)));
  ASSERT_OK(bases.commit(3));  // bucket 1 was not sent in refit 3
  EXPECT_TRUE(bases.base(1).empty());
  EXPECT_EQ(std::vector<std::byte>(bases.base(0).begin(), bases.base(0).end()), x2);
  auto x3 = x2;
  x3[6] = std::byte{7};
  ASSERT_OK(bases.set_pending(0, encoded(x3, bases.base(0), 2)));  // against a version it does not hold
  EXPECT_FALSE(bases.commit(4).ok());
  EXPECT_TRUE(bases.base(0).empty());
  EXPECT_EQ(bases.base_version(), 0u);
}

// Raw pending bytes (a bucket sent as it is) become the base at the commit,
// mixed with words encodings of other buckets; a raw pending of the wrong
// size is refused. Catches: a raw pending decoded as an encoding (no RFD1
// magic: the commit fails), the swap forgotten (the base stays the old
// bytes). Tried once: decoding raw pendings failed the commit.
TEST(BucketBases, RawPendingBytesBecomeTheBase) {
  BucketBases bases({96, 96});
  std::vector<std::byte> x(96, std::byte{1}), y(96, std::byte{2});
  ASSERT_OK(bases.set_pending_raw(0, x));
  ASSERT_OK(bases.set_pending(1, encoded(y, {}, 0)));
  ASSERT_OK(bases.commit(1));
  x[40] = std::byte{5};
  y[41] = std::byte{6};
  ASSERT_OK(bases.set_pending_raw(0, x));
  ASSERT_OK(bases.set_pending(1, encoded(y, bases.base(1), 1)));
  ASSERT_OK(bases.commit(2));
  EXPECT_EQ(std::vector<std::byte>(bases.base(0).begin(), bases.base(0).end()), x);
  EXPECT_EQ(std::vector<std::byte>(bases.base(1).begin(), bases.base(1).end()), y);
  EXPECT_EQ(bases.base_version(), 2u);
  EXPECT_FALSE(bases.set_pending_raw(0, std::vector<std::byte>(95)).ok()) << "95 bytes for a bucket of 96";
}

// A committed partial refit (sent by another plan, through none of the
// bases) keeps the bases of the buckets it did not touch, at its version,
// and drops the others; the next refit's pending encodings then decode
// over the kept ones. Catches: a partial commit that keeps a touched
// bucket's base (the engines hold other bytes there), one that drops every
// base, or one that leaves the version (the next refit's credits name the
// partial refit's version: nothing would be encoded). Tried once: a
// commit_partial that clears no base failed this test.
TEST(BucketBases, APartialCommitKeepsOnlyTheUntouchedBasesAtItsVersion) {
  BucketBases bases({64, 64, 64});
  std::vector<std::byte> x(64, std::byte{1}), y(64, std::byte{2}), z(64, std::byte{3});
  ASSERT_OK(bases.set_pending_raw(0, x));
  ASSERT_OK(bases.set_pending_raw(1, y));
  ASSERT_OK(bases.set_pending_raw(2, z));
  ASSERT_OK(bases.commit(1));
  bases.commit_partial(2, {false, true, false});
  EXPECT_EQ(bases.base_version(), 2u);
  EXPECT_EQ(std::vector<std::byte>(bases.base(0).begin(), bases.base(0).end()), x);
  EXPECT_TRUE(bases.base(1).empty()) << "bucket 1 holds a tensor the partial refit moved";
  EXPECT_EQ(std::vector<std::byte>(bases.base(2).begin(), bases.base(2).end()), z);
  x[5] = std::byte{9};
  ASSERT_OK(bases.set_pending(0, encoded(x, bases.base(0), 2)));
  ASSERT_OK(bases.set_pending_raw(1, y));
  ASSERT_OK(bases.set_pending(2, encoded(z, bases.base(2), 2)));
  ASSERT_OK(bases.commit(3));
  EXPECT_EQ(std::vector<std::byte>(bases.base(0).begin(), bases.base(0).end()), x);
  EXPECT_EQ(std::vector<std::byte>(bases.base(1).begin(), bases.base(1).end()), y);
  EXPECT_EQ(std::vector<std::byte>(bases.base(2).begin(), bases.base(2).end()), z);
}

}  // namespace
}  // namespace refit
