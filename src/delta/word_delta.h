// Delta encoding of one bucket (issue 22, --delta: docs/DESIGN.md "Delta
// refits"). A trainer keeps the bytes of each bucket
// as the engines committed them (the base) and sends, per bucket, the
// smaller of two encodings of the new bytes:
//
//   full    the new bytes as they are
//   words   a bitmap with one bit per 8-byte word of the bucket (bit w % 8
//           of byte w / 8: word w differs from the base; the bucket's last
//           word may be partial), then the new bytes of every set word, in
//           order (a partial last word: only its bytes)
//
// Both behind one header (little-endian):
//
//   u32 magic "RFD1"   u32 encoding (0 full, 1 words)
//   u64 base_version   (the version the words are relative to; full: 0)
//   u64 bytes          (the bucket's decoded size)
//   u64 changed_words  (words: the bitmap's set bits; full: 0)
//
// At RL learning rates about 1% of bf16 elements change per step: 4% of
// 8-byte words, so a words encoding is about 1/16 (the bitmap) + 4% of the
// bucket. The decoder checks everything it reads (magic, encoding, sizes,
// the bitmap's count, the base's version and size) and names what is wrong:
// an encoded bucket is data from another process.
//
// Thread safety: pure functions on the caller's buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "refit/status.h"

namespace refit {

enum class DeltaEncoding : std::uint32_t { kFull = 0, kWords = 1 };

inline constexpr std::uint32_t kDeltaMagic = 0x31444652;  // "RFD1" little-endian
inline constexpr std::uint64_t kDeltaHeaderBytes = 32;

// The most bytes encode_delta writes for a bucket of `bytes`: the header
// and the full bytes (a delta is chosen only when smaller).
constexpr std::uint64_t max_encoded_bytes(std::uint64_t bytes) { return kDeltaHeaderBytes + bytes; }

struct EncodedDelta {
  DeltaEncoding encoding = DeltaEncoding::kFull;
  std::uint64_t bytes = 0;  // written to out, header included
  std::uint64_t changed_words = 0;
};

// Encodes `now` against `base` (the same size: the bucket as version
// `base_version` held it) into `out` (at least max_encoded_bytes(now.size())),
// choosing the smaller encoding (full on a tie). An empty `base` means no
// base (an engine without the committed version): full.
StatusOr<EncodedDelta> encode_delta(std::span<const std::byte> now, std::span<const std::byte> base,
                                    std::uint64_t base_version, std::span<std::byte> out);

// The words encoding alone, when it takes fewer than `limit` bytes (then
// written to `out`, which holds at least min(limit, max_encoded_bytes)):
// otherwise nothing is written and the result says kFull with 0 bytes, and
// the caller sends the bytes as they are. Stops comparing once the words
// cannot fit, so a bucket that changed everywhere costs one partial pass.
StatusOr<EncodedDelta> encode_words_below(std::span<const std::byte> now, std::span<const std::byte> base,
                                          std::uint64_t base_version, std::uint64_t limit, std::span<std::byte> out);

// Decodes `encoded` into `out` (the bucket's bytes): a full encoding is
// copied; a words encoding needs `base` (the bucket's bytes at
// `base_version`, the version the engine committed; it may be `out` itself,
// decoded in place) and is refused when it was encoded against another
// version. Errors (InvalidArgument, DataLoss for a mismatch with the base)
// name the field and the values.
Status decode_delta(std::span<const std::byte> encoded, std::span<const std::byte> base, std::uint64_t base_version,
                    std::span<std::byte> out);

}  // namespace refit
