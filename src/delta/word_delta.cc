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

// Word w of `a` and `b` differ. Whole words compare as one 8-byte load each.
bool word_differs(const std::byte* a, const std::byte* b, std::uint64_t n, std::uint64_t w) {
  if ((w + 1) * kWord <= n) {
    std::uint64_t x = 0, y = 0;
    std::memcpy(&x, a + w * kWord, kWord);
    std::memcpy(&y, b + w * kWord, kWord);
    return x != y;
  }
  return std::memcmp(a + w * kWord, b + w * kWord, n - w * kWord) != 0;
}

// The words encoding's size for `changed` changed words of a bucket of n
// bytes, `tail` set when its partial last word is one of them.
std::uint64_t words_size(std::uint64_t n, std::uint64_t changed, bool tail) {
  const std::uint64_t payload = changed * kWord - (tail ? kWord - n % kWord : 0);
  return kDeltaHeaderBytes + (words_of(n) + 7) / 8 + payload;
}

// The changed words of `now` against `base`, counting no further than
// `most` (then most + 1): a words encoding that cannot fit is known early.
std::uint64_t count_changed(std::span<const std::byte> now, std::span<const std::byte> base, std::uint64_t most) {
  std::uint64_t changed = 0;
  const std::uint64_t n = now.size(), words = words_of(n);
  for (std::uint64_t w = 0; w < words; ++w) {
    changed += word_differs(now.data(), base.data(), n, w);
    if (changed > most && (w & 4095) == 0) return most + 1;
  }
  return changed;
}

// Writes the words encoding of `now` against `base` (its size known: `size`).
void write_words(std::span<const std::byte> now, std::span<const std::byte> base, std::uint64_t base_version,
                 std::uint64_t changed, std::byte* out) {
  const std::uint64_t n = now.size(), words = words_of(n);
  std::byte* bitmap = out + kDeltaHeaderBytes;
  std::memset(bitmap, 0, (words + 7) / 8);
  std::byte* p = bitmap + (words + 7) / 8;
  for (std::uint64_t w = 0; w < words; ++w) {
    if (!word_differs(now.data(), base.data(), n, w)) continue;
    bitmap[w / 8] |= static_cast<std::byte>(1u << (w % 8));
    const std::uint64_t b = word_bytes(n, w);
    if (b == kWord) {
      std::memcpy(p, now.data() + w * kWord, kWord);
    } else {
      std::memcpy(p, now.data() + w * kWord, b);
    }
    p += b;
  }
  put_header(out, DeltaEncoding::kWords, base_version, n, changed);
}

Status check_sizes(const char* who, std::span<const std::byte> now, std::span<const std::byte> base,
                   std::uint64_t out_bytes, std::uint64_t needed) {
  if (out_bytes < needed) {
    return InvalidArgument(std::string(who) + ": " + std::to_string(out_bytes) + " bytes of output for a bucket of " +
                           std::to_string(now.size()) + " (needs " + std::to_string(needed) + ")");
  }
  if (!base.empty() && base.size() != now.size()) {
    return InvalidArgument(std::string(who) + ": a base of " + std::to_string(base.size()) +
                           " bytes for a bucket of " + std::to_string(now.size()));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<EncodedDelta> encode_words_below(std::span<const std::byte> now, std::span<const std::byte> base,
                                          std::uint64_t base_version, std::uint64_t limit, std::span<std::byte> out) {
  const std::uint64_t needed = std::min(limit, max_encoded_bytes(now.size()));
  RETURN_IF_ERROR(check_sizes("encode_words_below", now, base, out.size(), needed));
  EncodedDelta result;  // kFull, 0 bytes: nothing written
  const std::uint64_t n = now.size();
  if (base.empty() || n == 0) return result;
  const std::uint64_t fixed = words_size(n, 0, false);
  if (fixed >= limit) return result;
  const std::uint64_t changed = count_changed(now, base, (limit - fixed) / kWord + 1);
  const bool tail = n % kWord != 0 && word_differs(now.data(), base.data(), n, words_of(n) - 1);
  const std::uint64_t size = words_size(n, changed, tail);
  if (size >= limit) return result;
  write_words(now, base, base_version, changed, out.data());
  result.encoding = DeltaEncoding::kWords;
  result.bytes = size;
  result.changed_words = changed;
  return result;
}

StatusOr<EncodedDelta> encode_delta(std::span<const std::byte> now, std::span<const std::byte> base,
                                    std::uint64_t base_version, std::span<std::byte> out) {
  const std::uint64_t n = now.size();
  RETURN_IF_ERROR(check_sizes("encode_delta", now, base, out.size(), max_encoded_bytes(n)));
  ASSIGN_OR_RETURN(EncodedDelta result, encode_words_below(now, base, base_version, max_encoded_bytes(n), out));
  if (result.encoding == DeltaEncoding::kWords) return result;
  put_header(out.data(), DeltaEncoding::kFull, 0, n, 0);
  if (n > 0) std::memcpy(out.data() + kDeltaHeaderBytes, now.data(), n);
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
  for (std::uint64_t i = 0; i < bitmap_bytes; ++i) {
    for (unsigned bits = static_cast<unsigned>(bitmap[i]); bits != 0; bits &= bits - 1) {
      const std::uint64_t w = i * 8 + static_cast<std::uint64_t>(std::countr_zero(bits));
      const std::uint64_t b = word_bytes(n, w);
      if (b == kWord) {
        std::memcpy(out.data() + w * kWord, p, kWord);
      } else {
        std::memcpy(out.data() + w * kWord, p, b);
      }
      p += b;
    }
  }
  return Status::Ok();
}

}  // namespace refit
