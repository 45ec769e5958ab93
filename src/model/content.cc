// Deterministic content: byte b of a tensor is byte (b % 8), little-endian, of
// word w = b / 8, where word w = mix64(key + (w + 1) * kGolden) (splitmix64's
// output function). The format is fixed: other processes (and other
// languages) regenerate the same bytes to verify a transfer.
#include <bit>
#include <cstring>

#include <xxhash.h>

#include "refit/content.h"

namespace refit {
namespace {

constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

// splitmix64's finalizer (Steele, Lea, Flood 2014).
inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

inline std::uint64_t content_word(std::uint64_t key, std::uint64_t w) { return mix64(key + (w + 1) * kGolden); }

inline std::uint64_t to_le(std::uint64_t v) {
  if constexpr (std::endian::native == std::endian::big) return __builtin_bswap64(v);
  return v;
}

inline void store_le(std::byte* p, std::uint64_t v) {
  v = to_le(v);
  std::memcpy(p, &v, 8);
}

inline std::uint64_t load_le(const std::byte* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return to_le(v);
}

// Offset of the first differing byte of two little-endian words; REQUIRES a != b.
inline int first_diff_byte(std::uint64_t a, std::uint64_t b) { return std::countr_zero(a ^ b) / 8; }

}  // namespace

std::uint64_t content_key(std::uint64_t seed, std::uint64_t version, std::string_view name) {
  std::uint64_t k = mix64(seed + kGolden);
  k = mix64(k ^ (version * kGolden + 1));
  return mix64(k ^ XXH3_64bits(name.data(), name.size()));
}

void fill_content(std::uint64_t key, std::uint64_t offset, std::span<std::byte> out) {
  std::byte* p = out.data();
  std::uint64_t n = out.size();
  std::uint64_t w = offset / 8;
  const unsigned head = static_cast<unsigned>(offset % 8);
  if (head != 0 && n > 0) {  // the partial first word
    std::byte word[8];
    store_le(word, content_word(key, w));
    const std::uint64_t take = n < 8 - head ? n : 8 - head;
    std::memcpy(p, word + head, take);
    p += take;
    n -= take;
    ++w;
  }
  for (; n >= 8; n -= 8, p += 8, ++w) store_le(p, content_word(key, w));
  if (n > 0) {  // the partial last word
    std::byte word[8];
    store_le(word, content_word(key, w));
    std::memcpy(p, word, n);
  }
}

std::int64_t first_content_mismatch(std::uint64_t key, std::uint64_t offset, std::span<const std::byte> bytes) {
  const std::byte* p = bytes.data();
  const std::uint64_t n = bytes.size();
  std::uint64_t i = 0;  // bytes checked so far
  std::uint64_t w = offset / 8;
  const unsigned head = static_cast<unsigned>(offset % 8);
  if (head != 0 && n > 0) {  // the partial first word
    std::byte word[8];
    store_le(word, content_word(key, w));
    const std::uint64_t take = n < 8 - head ? n : 8 - head;
    for (; i < take; ++i) {
      if (p[i] != word[head + i]) return static_cast<std::int64_t>(i);
    }
    ++w;
  }
  for (; n - i >= 8; i += 8, ++w) {
    const std::uint64_t got = load_le(p + i);
    const std::uint64_t want = content_word(key, w);
    if (got != want) return static_cast<std::int64_t>(i) + first_diff_byte(got, want);
  }
  if (i < n) {  // the partial last word
    std::byte word[8];
    store_le(word, content_word(key, w));
    for (std::uint64_t j = 0; i + j < n; ++j) {
      if (p[i + j] != word[j]) return static_cast<std::int64_t>(i + j);
    }
  }
  return -1;
}

void make_finite_content(DType dtype, std::span<std::byte> bytes) {
  if (dtype != DType::kBFloat16 && dtype != DType::kFloat32) return;
  const std::size_t size = dtype_size(dtype);
  for (std::size_t i = size - 1; i < bytes.size(); i += size) bytes[i] &= std::byte{0xBF};
}

}  // namespace refit
