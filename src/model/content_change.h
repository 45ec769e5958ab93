// The arithmetic of content that changes like an optimizer step
// (refit/content.h ContentKey, --change-fraction), shared by the host
// (content.cc) and the device kernels (cuda/device_content.cu) so that both
// compute the same bytes. Integer arithmetic only.
#pragma once

#include <cstdint>

#include "refit/content.h"

#if defined(__CUDACC__)
#define REFIT_CONTENT_HD __host__ __device__ __forceinline__
#else
#define REFIT_CONTENT_HD inline
#endif

namespace refit::content_math {

inline constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
__extension__ typedef unsigned __int128 U128;  // GCC, Clang and nvcc; __extension__: no -Wpedantic

// splitmix64's finalizer (Steele, Lea, Flood 2014).
REFIT_CONTENT_HD std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Word w of the tensor with `key` (content.cc's format).
REFIT_CONTENT_HD std::uint64_t content_word(std::uint64_t key, std::uint64_t w) { return mix64(key + (w + 1) * kGolden); }

// content_key(seed, version, name) from its parts: seed_key = mix64(seed +
// golden), name_hash = XXH3 of the name.
REFIT_CONTENT_HD std::uint64_t key_at(std::uint64_t seed_key, std::uint64_t name_hash, std::uint64_t version) {
  return mix64(mix64(seed_key ^ (version * kGolden + 1)) ^ name_hash);
}

// The version whose bytes element e holds at k.version: the last version
// u <= k.version at which e changed (ContentKey's rule). 128-bit products:
// no version is out of range.
REFIT_CONTENT_HD std::uint64_t element_version(const ContentKey& k, std::uint64_t e) {
  if (k.change >= kEveryElement) return k.version;
  const U128 phase = mix64(k.phase_key + (e + 1) * kGolden) >> 32;
  const U128 steps = (static_cast<U128>(k.version) * k.change + phase) >> 32;
  if (steps == 0) return 0;
  return static_cast<std::uint64_t>(((steps << 32) - phase + k.change - 1) / k.change);
}

// Byte b of the tensor of k.
REFIT_CONTENT_HD unsigned char content_byte(const ContentKey& k, std::uint64_t b) {
  const std::uint64_t u = element_version(k, b / k.element_bytes);
  const std::uint64_t key = u == k.version ? k.key : key_at(k.seed_key, k.name_hash, u);
  return static_cast<unsigned char>(content_word(key, b / 8) >> (8 * (b % 8)));
}

}  // namespace refit::content_math
