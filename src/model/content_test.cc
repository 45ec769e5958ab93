#include <cstring>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "refit/content.h"

namespace refit {
namespace {

std::vector<std::byte> fill(std::uint64_t key, std::uint64_t offset, std::size_t n) {
  std::vector<std::byte> out(n);
  fill_content(key, offset, out);
  return out;
}

// The documented format, written out independently: byte b is byte (b % 8),
// little-endian, of splitmix64's output for counter key + (b / 8 + 1) * golden.
std::byte reference_byte(std::uint64_t key, std::uint64_t b) {
  std::uint64_t z = key + (b / 8 + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<std::byte>(z >> (8 * (b % 8)));
}

// Catches: a format change (another process regenerating the bytes would
// disagree), big-endian word order, word index off by one.
TEST(ContentTest, MatchesTheDocumentedFormat) {
  const std::uint64_t key = content_key(1, 2, "model.norm.weight");
  const std::vector<std::byte> got = fill(key, 3, 77);
  for (std::uint64_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], reference_byte(key, 3 + i)) << i;
}

// Catches: content_key ignoring the seed, the version or the name (a stale
// version or a misplaced tensor would then verify as correct).
TEST(ContentTest, DeterministicAndKeyedBySeedVersionAndName) {
  const std::uint64_t k = content_key(7, 3, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(k, content_key(7, 3, "model.layers.0.self_attn.q_proj.weight"));
  EXPECT_EQ(fill(k, 0, 256), fill(k, 0, 256));
  const std::uint64_t others[] = {
      content_key(8, 3, "model.layers.0.self_attn.q_proj.weight"),  // seed
      content_key(7, 4, "model.layers.0.self_attn.q_proj.weight"),  // version
      content_key(7, 3, "model.layers.0.self_attn.k_proj.weight"),  // name
      content_key(7, 3, "model.layers.1.self_attn.q_proj.weight"),  // layer
      content_key(3, 7, "model.layers.0.self_attn.q_proj.weight"),  // seed and version swapped
  };
  std::set<std::uint64_t> keys = {k};
  for (std::uint64_t o : others) {
    keys.insert(o);
    EXPECT_NE(fill(o, 0, 64), fill(k, 0, 64));
  }
  EXPECT_EQ(keys.size(), 6u);
}

// Catches: content that ignores the offset (every word equal, so a chunk
// landing at the wrong offset would verify), or content that is constant.
TEST(ContentTest, DiffersByOffsetAndLooksRandom) {
  const std::uint64_t k = content_key(0, 0, "w");
  const std::vector<std::byte> a = fill(k, 0, 4096);
  EXPECT_NE(fill(k, 8, 64), std::vector<std::byte>(a.begin(), a.begin() + 64));
  EXPECT_NE(fill(k, 1, 64), std::vector<std::byte>(a.begin(), a.begin() + 64));
  std::set<std::byte> distinct(a.begin(), a.end());
  EXPECT_GT(distinct.size(), 200u);
  // No two 8-byte words of the first 4 KiB are equal.
  std::set<std::uint64_t> words;
  for (std::size_t i = 0; i < a.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, a.data() + i, 8);
    words.insert(w);
  }
  EXPECT_EQ(words.size(), a.size() / 8);
}

// Catches: a head that ignores offset % 8 (copies from byte 0 of the word),
// a tail that drops or over-writes bytes, and ranges inside one word.
TEST(ContentTest, UnalignedRangesEqualTheWholeTensorFill) {
  const std::uint64_t k = content_key(42, 9, "lm_head.weight");
  const std::vector<std::byte> whole = fill(k, 0, 512);
  for (std::uint64_t off = 0; off < 24; ++off) {
    for (std::size_t len = 0; off + len <= 200; len += (len < 20 ? 1 : 13)) {
      // Guard bytes on both sides: fill must write exactly out.size() bytes.
      std::vector<std::byte> buf(len + 16, std::byte{0xA5});
      fill_content(k, off, std::span<std::byte>(buf).subspan(8, len));
      for (std::size_t g = 0; g < 8; ++g) {
        ASSERT_EQ(buf[g], std::byte{0xA5});
        ASSERT_EQ(buf[8 + len + g], std::byte{0xA5});
      }
      ASSERT_TRUE(std::equal(buf.begin() + 8, buf.begin() + 8 + static_cast<std::ptrdiff_t>(len),
                             whole.begin() + static_cast<std::ptrdiff_t>(off)))
          << "offset " << off << " length " << len;
    }
  }
  // Large offsets (a chunk deep inside a multi-GB tensor).
  const std::uint64_t deep = (1ULL << 33) + 5;
  const std::vector<std::byte> near = fill(k, deep - 5, 40);
  EXPECT_EQ(fill(k, deep, 19), std::vector<std::byte>(near.begin() + 5, near.begin() + 24));
}

// Catches: returning the word's offset instead of the byte's, an offset
// relative to the tensor instead of the span, a check that skips the partial
// head or tail word, or one that stops before the last byte.
TEST(ContentTest, FirstMismatchFindsEveryFlippedByte) {
  const std::uint64_t k = content_key(5, 1, "model.embed_tokens.weight");
  for (std::uint64_t off : {0ULL, 1ULL, 3ULL, 7ULL, 8ULL, 13ULL, 1000003ULL}) {
    for (std::size_t len : {1u, 5u, 8u, 9u, 64u, 203u}) {
      std::vector<std::byte> data = fill(k, off, len);
      ASSERT_EQ(first_content_mismatch(k, off, data), -1) << off << " " << len;
      for (std::size_t pos = 0; pos < len; ++pos) {
        data[pos] ^= std::byte{0x10};
        ASSERT_EQ(first_content_mismatch(k, off, data), static_cast<std::int64_t>(pos))
            << "offset " << off << " length " << len;
        // A second flip later does not move the answer.
        if (pos + 1 < len) {
          data[len - 1] ^= std::byte{0x01};
          ASSERT_EQ(first_content_mismatch(k, off, data), static_cast<std::int64_t>(pos));
          data[len - 1] ^= std::byte{0x01};
        }
        data[pos] ^= std::byte{0x10};
      }
      // Right bytes checked at the wrong offset or with the wrong key fail.
      if (len >= 8) {
        EXPECT_NE(first_content_mismatch(k, off + 8, data), -1);
        EXPECT_NE(first_content_mismatch(k + 1, off, data), -1);
      }
    }
  }
  EXPECT_EQ(first_content_mismatch(k, 3, {}), -1);
}

// Catches: clearing the wrong bit or byte (bf16 and fp32 keep their sign
// and mantissa; only the top exponent bit goes), or touching other dtypes.
TEST(ContentTest, MakeFiniteClearsTheTopExponentBitOfEachElement) {
  // bf16 +Inf 0x7F80, NaN 0xFFC0, 1.5 0x3FC0, little-endian.
  std::vector<std::byte> bf16 = {std::byte{0x80}, std::byte{0x7F}, std::byte{0xC0}, std::byte{0xFF},
                                 std::byte{0xC0}, std::byte{0x3F}};
  make_finite_content(DType::kBFloat16, bf16);
  EXPECT_EQ(bf16, (std::vector<std::byte>{std::byte{0x80}, std::byte{0x3F}, std::byte{0xC0}, std::byte{0xBF},
                                          std::byte{0xC0}, std::byte{0x3F}}));
  // fp32 NaN 0x7FC00001: only byte 3 changes.
  std::vector<std::byte> fp32 = {std::byte{0x01}, std::byte{0x00}, std::byte{0xC0}, std::byte{0x7F}};
  make_finite_content(DType::kFloat32, fp32);
  EXPECT_EQ(fp32, (std::vector<std::byte>{std::byte{0x01}, std::byte{0x00}, std::byte{0xC0}, std::byte{0x3F}}));
  std::vector<std::byte> int8 = {std::byte{0xFF}, std::byte{0xFF}};
  make_finite_content(DType::kInt8, int8);
  EXPECT_EQ(int8, (std::vector<std::byte>{std::byte{0xFF}, std::byte{0xFF}}));
}

}  // namespace
}  // namespace refit
