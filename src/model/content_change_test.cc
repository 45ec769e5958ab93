// Content that changes like an optimizer step (refit/content.h ContentKey,
// --change-fraction): the fraction of elements that change per version,
// whole elements, each element's version as the documented rule says, and
// F = 1 equal to the old content byte for byte. Each test names the
// mutation it catches.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "refit/content.h"

namespace refit {
namespace {

std::vector<std::byte> fill(const ContentKey& key, std::uint64_t offset, std::size_t n) {
  std::vector<std::byte> out(n);
  fill_content(key, offset, out);
  return out;
}

// The rule of content.h written out independently (long division, no
// 128-bit arithmetic): the last version <= v at which element e changed.
std::uint64_t reference_version(const ContentKey& k, std::uint64_t e) {
  std::uint64_t z = k.phase_key + (e + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  const std::uint64_t h = (z ^ (z >> 31)) >> 32;
  auto steps = [&](std::uint64_t v) { return static_cast<std::uint64_t>((static_cast<long double>(v) * k.change + h) /
                                                                        4294967296.0L); };
  std::uint64_t u = k.version;
  while (u > 0 && steps(u - 1) == steps(k.version)) --u;
  return steps(k.version) == 0 ? 0 : u;
}

// Catches: F = 1 taking another path than the word function (every test of
// the old content, and every process regenerating it, would disagree).
TEST(ContentChange, EveryElementIsTheOldContentByteForByte) {
  const ContentKey k = make_content_key(7, 5, "w", kEveryElement, 2);
  for (std::uint64_t offset : {0ull, 3ull, 1000ull}) {
    std::vector<std::byte> old(777);
    fill_content(content_key(7, 5, "w"), offset, old);
    EXPECT_EQ(fill(k, offset, old.size()), old) << offset;
  }
}

// A fraction F of the elements changes each version, spread over every
// tensor, and each element holds the bytes of the version the rule names,
// as a whole (both bytes of a bf16 element from one version). Catches: the
// phase taken per byte instead of per element (elements split across
// versions), a change test off by one version, a fraction far from F.
// Tried once: the phase per byte failed here.
TEST(ContentChange, AFractionOfWholeElementsChangesEachVersion) {
  const std::uint64_t change = *change_parts(0.05);
  const std::size_t elements = 40000;
  for (const char* name : {"a", "layers.3.mlp.up_proj.weight"}) {
    for (std::uint64_t v : {1ull, 2ull, 9ull}) {
      const ContentKey now = make_content_key(3, v, name, change, 2);
      const ContentKey before = make_content_key(3, v - 1, name, change, 2);
      const std::vector<std::byte> a = fill(now, 0, 2 * elements), b = fill(before, 0, 2 * elements);
      std::size_t changed = 0;
      for (std::size_t e = 0; e < elements; ++e) {
        const std::uint64_t u = reference_version(now, e);
        std::vector<std::byte> want(2);
        fill_content(content_key(3, u, name), 2 * e, want);
        ASSERT_EQ(a[2 * e], want[0]) << name << " v" << v << " element " << e << " of version " << u;
        ASSERT_EQ(a[2 * e + 1], want[1]) << name << " v" << v << " element " << e << " of version " << u;
        changed += std::memcmp(&a[2 * e], &b[2 * e], 2) != 0;
      }
      // 5% of 40000 = 2000 (a standard deviation of about 44).
      EXPECT_NEAR(static_cast<double>(changed), 0.05 * elements, 250) << name << " version " << v;
    }
  }
}

// Each element changes exactly once every 1/F versions (F = 1/4: twice in
// versions 1..8), and never between its changes. Catches: a rule that
// changes elements at random (some twice, some never).
TEST(ContentChange, EachElementChangesOnceEveryOneOverFVersions) {
  const std::uint64_t change = *change_parts(0.25);
  for (std::uint64_t e = 0; e < 2000; ++e) {
    int changes = 0;
    for (std::uint64_t v = 1; v <= 8; ++v) {
      const std::uint64_t u = reference_version(make_content_key(1, v, "t", change, 4), e);
      ASSERT_LE(u, v);
      changes += u == v;
    }
    EXPECT_EQ(changes, 2) << "element " << e;
  }
}

// Unaligned ranges equal the whole fill, and the mismatch search finds a
// flipped byte. Catches: an offset not carried into the element index.
TEST(ContentChange, RangesAndMismatchesAgreeWithTheWholeFill) {
  const ContentKey k = make_content_key(2, 4, "x", *change_parts(0.1), 4);
  const std::vector<std::byte> whole = fill(k, 0, 4096);
  for (std::uint64_t offset : {1ull, 6ull, 1021ull}) {
    const std::vector<std::byte> part = fill(k, offset, 333);
    EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + static_cast<std::ptrdiff_t>(offset))) << offset;
  }
  std::vector<std::byte> got = whole;
  EXPECT_EQ(first_content_mismatch(k, 0, got), -1);
  got[2049] ^= std::byte{0x10};
  EXPECT_EQ(first_content_mismatch(k, 0, got), 2049);
}

// Catches: a fraction outside (0, 1] accepted, 1 not mapped to every element.
TEST(ContentChange, ChangePartsRefusesFractionsOutsideZeroToOne) {
  EXPECT_EQ(*change_parts(1.0), kEveryElement);
  EXPECT_EQ(*change_parts(1e-12), 1u);
  for (double bad : {0.0, -0.1, 1.5}) EXPECT_FALSE(change_parts(bad).ok()) << bad;
}

}  // namespace
}  // namespace refit
