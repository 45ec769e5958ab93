// Deterministic content: byte b of a tensor is byte (b % 8), little-endian, of
// word w = b / 8, where word w = mix64(key + (w + 1) * kGolden) (splitmix64's
// output function). The format is fixed: other processes (and other
// languages) regenerate the same bytes to verify a transfer.
#include <bit>
#include <cstring>

#include <xxhash.h>

#include "refit/content.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "model/content_change.h"

namespace refit {
namespace {

using content_math::content_word;
using content_math::kGolden;
using content_math::mix64;

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
  return content_math::key_at(mix64(seed + kGolden), XXH3_64bits(name.data(), name.size()), version);
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

StatusOr<std::uint64_t> change_parts(double fraction) {
  if (!(fraction > 0 && fraction <= 1)) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", fraction);
    return InvalidArgument("--change-fraction " + std::string(text) + " is not a fraction of the elements in (0, 1]");
  }
  const double parts = std::nearbyint(fraction * static_cast<double>(kEveryElement));
  return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(parts));
}

ContentKey make_content_key(std::uint64_t seed, std::uint64_t version, std::string_view name, std::uint64_t change,
                            std::uint32_t element_bytes) {
  ContentKey k;
  k.seed_key = mix64(seed + kGolden);
  k.name_hash = XXH3_64bits(name.data(), name.size());
  k.key = content_math::key_at(k.seed_key, k.name_hash, version);
  k.version = version;
  k.change = std::min(change, kEveryElement);
  k.phase_key = mix64(content_math::key_at(k.seed_key, k.name_hash, 0) ^ 0xD1B54A32D192ED03ULL);
  k.element_bytes = element_bytes == 0 ? 1 : element_bytes;
  return k;
}

ContentKey ContentSeed::key(std::uint64_t version, std::string_view name, DType dtype) const {
  return make_content_key(seed, version, name, change, static_cast<std::uint32_t>(dtype_size(dtype)));
}

namespace {

// The bytes of changing content one after another: each element's version
// and word are worked out once (an element of at most 8 bytes lies in one
// word), not once per byte.
class ChangingBytes {
 public:
  explicit ChangingBytes(const ContentKey& key) : key_(key) {}
  std::byte at(std::uint64_t b) {
    const std::uint64_t e = b / key_.element_bytes;
    if (e != element_) {
      element_ = e;
      const std::uint64_t u = content_math::element_version(key_, e);
      const std::uint64_t k = u == key_.version ? key_.key : content_math::key_at(key_.seed_key, key_.name_hash, u);
      word_ = content_word(k, b / 8);
    }
    return static_cast<std::byte>(word_ >> (8 * (b % 8)));
  }

 private:
  const ContentKey& key_;
  std::uint64_t element_ = ~std::uint64_t{0};
  std::uint64_t word_ = 0;
};

}  // namespace

void fill_content(const ContentKey& key, std::uint64_t offset, std::span<std::byte> out) {
  if (key.change >= kEveryElement) return fill_content(key.key, offset, out);
  ChangingBytes content(key);
  for (std::uint64_t i = 0; i < out.size(); ++i) out[i] = content.at(offset + i);
}

std::int64_t first_content_mismatch(const ContentKey& key, std::uint64_t offset, std::span<const std::byte> bytes) {
  if (key.change >= kEveryElement) return first_content_mismatch(key.key, offset, bytes);
  ChangingBytes content(key);
  for (std::uint64_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != content.at(offset + i)) return static_cast<std::int64_t>(i);
  }
  return -1;
}

void make_finite_content(DType dtype, std::span<std::byte> bytes) {
  if (dtype != DType::kBFloat16 && dtype != DType::kFloat32) return;
  const std::size_t size = dtype_size(dtype);
  for (std::size_t i = size - 1; i < bytes.size(); i += size) bytes[i] &= std::byte{0xBF};
}

}  // namespace refit
