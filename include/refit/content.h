// Deterministic weight content for tests, the demo and benchmarks.
//
// Byte b of full tensor `name` at weight version v with seed s is a pure
// function of (s, v, name, b): a different seed, version, tensor or offset
// gives different bytes, so a stale, recycled, misplaced or transposed byte is
// caught by verify_content. Generation runs at several GB/s (splitmix64 per
// 8-byte word).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "refit/dtype.h"
#include "refit/status.h"

namespace refit {

// Key of one tensor at one version.
std::uint64_t content_key(std::uint64_t seed, std::uint64_t version, std::string_view name);

// Content that changes like an optimizer step (--change-fraction F, issue
// 22): F as parts of 2^32, kEveryElement (2^32) meaning every element.
inline constexpr std::uint64_t kEveryElement = std::uint64_t{1} << 32;
// F in (0, 1] as parts of 2^32 (nearest, at least 1); an error names F
// outside (0, 1].
StatusOr<std::uint64_t> change_parts(double fraction);

// The content of one tensor at one version. Element e (element_bytes
// bytes: the dtype's, 1, 2, 4 or 8) holds the bytes it had at version u(e),
// the last version <= `version` at which it changed, so that any process
// regenerates the content of any version without history. With phase
// h(e) = the top 32 bits of mix64(phase_key + (e + 1) * golden) and
// k(v) = floor((v * change + h(e)) / 2^32), e changes at v iff k(v) >
// k(v - 1): a fraction change / 2^32 of the elements each version, spread
// evenly over every tensor, each element once every 2^32 / change versions.
// u(e) = 0 when k(version) == 0, else the least v with k(v) == k(version).
// The element's bytes are those of content_key(seed, u(e), name) at its
// offset. With change == kEveryElement u(e) == version: the content is
// content_key's, byte for byte.
struct ContentKey {
  std::uint64_t key = 0;  // content_key(seed, version, name)
  std::uint64_t version = 0;
  std::uint64_t change = kEveryElement;
  std::uint64_t seed_key = 0, name_hash = 0, phase_key = 0;  // content_key's parts; the phases'
  std::uint32_t element_bytes = 1;
};
ContentKey make_content_key(std::uint64_t seed, std::uint64_t version, std::string_view name,
                            std::uint64_t change = kEveryElement, std::uint32_t element_bytes = 1);
void fill_content(const ContentKey& key, std::uint64_t offset, std::span<std::byte> out);

// A job's synthetic content: the coordinator's seed and the parts of 2^32
// of the elements that change per version. Built from a seed alone (every
// element changes), as the checks that take one were called before.
struct ContentSeed {
  // NOLINTNEXTLINE(google-explicit-constructor): a seed alone is every element changing
  ContentSeed(std::uint64_t s, std::uint64_t c = kEveryElement) : seed(s), change(c) {}
  std::uint64_t seed;
  std::uint64_t change;
  ContentKey key(std::uint64_t version, std::string_view name, DType dtype) const;
};
std::int64_t first_content_mismatch(const ContentKey& key, std::uint64_t offset, std::span<const std::byte> bytes);

// Writes the bytes [offset, offset + out.size()) of the tensor with `key`.
void fill_content(std::uint64_t key, std::uint64_t offset, std::span<std::byte> out);

// Offset (relative to out's start) of the first byte of `bytes` that differs
// from the content at [offset, ...), or -1 when all match.
std::int64_t first_content_mismatch(std::uint64_t key, std::uint64_t offset,
                                    std::span<const std::byte> bytes);

// Synthetic weights the FP8 format can quantize (`--quantize`, quantize.h):
// random bytes are NaN or Inf for one bf16 element in 256, and the format
// refuses those. Clears the top exponent bit (0x40 of an element's last,
// most significant byte) of every bf16 or fp32 element of `bytes` (C order,
// starting at an element), so that each is finite with |x| < 2. Trainers
// apply it to the content of the weights they quantize and engines to the
// content they verify those weights' codes and scales against. Other
// dtypes: unchanged.
void make_finite_content(DType dtype, std::span<std::byte> bytes);

}  // namespace refit
