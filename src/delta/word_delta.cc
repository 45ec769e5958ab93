// The delta encodings of one bucket: see word_delta.h.
#include "delta/word_delta.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

namespace refit {
namespace {

constexpr std::uint64_t kWord = 8;

std::uint64_t words_of(std::uint64_t bytes) { return (bytes + kWord - 1) / kWord; }

void put32(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put64(std::byte* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
std::uint32_t get32(const std::byte* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(p[i]) << (8 * i);
  return v;
}
std::uint64_t get64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

void put_header(std::byte* out, DeltaEncoding encoding, std::uint64_t base_version, std::uint64_t bytes,
                std::uint64_t changed) {
  put32(out, kDeltaMagic);
  put32(out + 4, static_cast<std::uint32_t>(encoding));
  put64(out + 8, base_version);
  put64(out + 16, bytes);
  put64(out + 24, changed);
}

// Word w's bytes: 8, or fewer for a partial last word.
std::uint64_t word_bytes(std::uint64_t bytes, std::uint64_t w) { return std::min(kWord, bytes - w * kWord); }

std::uint64_t count_changed(std::span<const std::byte> now, std::span<const std::byte> base) {
  std::uint64_t changed = 0;
  const std::uint64_t n = now.size();
  for (std::uint64_t w = 0; w * kWord < n; ++w) {
    changed += std::memcmp(now.data() + w * kWord, base.data() + w * kWord, word_bytes(n, w)) != 0;
  }
  return changed;
}

}  // namespace

StatusOr<EncodedDelta> encode_delta(std::span<const std::byte> now, std::span<const std::byte> base,
                                    std::uint64_t base_version, std::span<std::byte> out) {
  const std::uint64_t n = now.size();
  if (out.size() < max_encoded_bytes(n)) {
    return InvalidArgument("encode_delta: " + std::to_string(out.size()) + " bytes of output for a bucket of " +
                           std::to_string(n) + " (needs " + std::to_string(max_encoded_bytes(n)) + ")");
  }
  if (!base.empty() && base.size() != n) {
    return InvalidArgument("encode_delta: a base of " + std::to_string(base.size()) + " bytes for a bucket of " +
                           std::to_string(n));
  }
  EncodedDelta result;
  if (!base.empty()) {
    result.changed_words = count_changed(now, base);
    const std::uint64_t words = words_of(n);
    const bool tail_set = n % kWord != 0 && std::memcmp(now.data() + (words - 1) * kWord,
                                                        base.data() + (words - 1) * kWord, n % kWord) != 0;
    const std::uint64_t payload = result.changed_words * kWord - (tail_set ? kWord - n % kWord : 0);
    const std::uint64_t size = kDeltaHeaderBytes + (words + 7) / 8 + payload;
    if (size < kDeltaHeaderBytes + n) {
      std::byte* bitmap = out.data() + kDeltaHeaderBytes;
      std::memset(bitmap, 0, (words + 7) / 8);
      std::byte* p = bitmap + (words + 7) / 8;
      for (std::uint64_t w = 0; w < words; ++w) {
        const std::uint64_t b = word_bytes(n, w);
        if (std::memcmp(now.data() + w * kWord, base.data() + w * kWord, b) == 0) continue;
        bitmap[w / 8] |= static_cast<std::byte>(1u << (w % 8));
        std::memcpy(p, now.data() + w * kWord, b);
        p += b;
      }
      put_header(out.data(), DeltaEncoding::kWords, base_version, n, result.changed_words);
      result.encoding = DeltaEncoding::kWords;
      result.bytes = size;
      return result;
    }
  }
  put_header(out.data(), DeltaEncoding::kFull, 0, n, 0);
  if (n > 0) std::memcpy(out.data() + kDeltaHeaderBytes, now.data(), n);
  result.encoding = DeltaEncoding::kFull;
  result.bytes = kDeltaHeaderBytes + n;
  return result;
}

Status decode_delta(std::span<const std::byte> encoded, std::span<const std::byte> base, std::uint64_t base_version,
                    std::span<std::byte> out) {
  auto bad = [](const std::string& what) { return InvalidArgument("delta-encoded bucket: " + what); };
  if (encoded.size() < kDeltaHeaderBytes) {
    return bad(std::to_string(encoded.size()) + " bytes, shorter than its " + std::to_string(kDeltaHeaderBytes) +
               "-byte header");
  }
  const std::byte* h = encoded.data();
  if (get32(h) != kDeltaMagic) return bad("no RFD1 magic (got 0x" + std::to_string(get32(h)) + ")");
  const std::uint32_t encoding = get32(h + 4);
  const std::uint64_t from = get64(h + 8), n = get64(h + 16), changed = get64(h + 24);
  if (n != out.size()) {
    return bad("decodes to " + std::to_string(n) + " bytes, the bucket has " + std::to_string(out.size()));
  }
  const std::span<const std::byte> body = encoded.subspan(kDeltaHeaderBytes);
  if (encoding == static_cast<std::uint32_t>(DeltaEncoding::kFull)) {
    if (body.size() != n) {
      return bad("full encoding of " + std::to_string(n) + " bytes carries " + std::to_string(body.size()));
    }
    if (n > 0) std::memmove(out.data(), body.data(), n);
    return Status::Ok();
  }
  if (encoding != static_cast<std::uint32_t>(DeltaEncoding::kWords)) {
    return bad("unknown encoding " + std::to_string(encoding));
  }
  if (from != base_version) {
    return DataLoss("delta-encoded bucket: encoded against version " + std::to_string(from) +
                    ", the engine holds version " + std::to_string(base_version));
  }
  if (base.size() != n) {
    return bad("a base of " + std::to_string(base.size()) + " bytes for a bucket of " + std::to_string(n));
  }
  const std::uint64_t words = words_of(n), bitmap_bytes = (words + 7) / 8;
  if (body.size() < bitmap_bytes) return bad("shorter than its bitmap of " + std::to_string(bitmap_bytes) + " bytes");
  const std::byte* bitmap = body.data();
  std::uint64_t set = 0;
  for (std::uint64_t i = 0; i < bitmap_bytes; ++i) set += std::popcount(static_cast<unsigned>(bitmap[i]));
  // Bits past the last word must be clear: they would name words that do not exist.
  if (words % 8 != 0 && (static_cast<unsigned>(bitmap[bitmap_bytes - 1]) >> (words % 8)) != 0) {
    return bad("its bitmap sets bits past word " + std::to_string(words - 1));
  }
  if (set != changed) {
    return bad("its header says " + std::to_string(changed) + " changed words, its bitmap sets " + std::to_string(set));
  }
  const bool tail_set = n % kWord != 0 && (static_cast<unsigned>(bitmap[(words - 1) / 8]) >> ((words - 1) % 8)) & 1u;
  const std::uint64_t payload = set * kWord - (tail_set ? kWord - n % kWord : 0);
  if (body.size() != bitmap_bytes + payload) {
    return bad(std::to_string(set) + " changed words need " + std::to_string(payload) + " bytes after the bitmap, it "
               "carries " + std::to_string(body.size() - bitmap_bytes));
  }
  if (base.data() != out.data() && n > 0) std::memmove(out.data(), base.data(), n);
  const std::byte* p = body.data() + bitmap_bytes;
  for (std::uint64_t w = 0; w < words; ++w) {
    if (!((static_cast<unsigned>(bitmap[w / 8]) >> (w % 8)) & 1u)) continue;
    const std::uint64_t b = word_bytes(n, w);
    std::memcpy(out.data() + w * kWord, p, b);
    p += b;
  }
  return Status::Ok();
}

}  // namespace refit
