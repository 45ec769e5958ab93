// Fuzz target: decoding a delta-encoded bucket (src/delta/word_delta.cc)
// from a hostile peer. Input: bytes 0..1 the bucket's size (little-endian,
// at most 64 KiB), the rest the encoded bucket. The base is a fixed pattern
// of that size at version 5. A decode must never read or write outside its
// buffers (ASan), and one that succeeds must be re-encodable: decoding the
// result's own encoding gives the same bytes (a trap otherwise).
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "delta/word_delta.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t n = static_cast<std::size_t>(data[0]) | (static_cast<std::size_t>(data[1]) << 8);
  std::vector<std::byte> base(n), out(n);
  for (std::size_t i = 0; i < n; ++i) base[i] = static_cast<std::byte>(i * 131 + 7);
  const auto* encoded = reinterpret_cast<const std::byte*>(data + 2);
  if (!refit::decode_delta(std::span(encoded, size - 2), base, 5, out).ok()) return 0;
  std::vector<std::byte> wire(refit::max_encoded_bytes(n)), again(n);
  auto e = refit::encode_delta(out, base, 5, wire);
  if (!e.ok()) __builtin_trap();
  wire.resize(e->bytes);
  if (!refit::decode_delta(wire, base, 5, again).ok() || again != out) __builtin_trap();
  return 0;
}
