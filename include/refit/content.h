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
