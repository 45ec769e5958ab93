#include "transport/ucx/ucx_descriptor.h"

#include <limits>

#include "transport/pool_layout.h"

namespace refit {
namespace {

constexpr std::string_view kUsage =
    "expected ucx:slots=<S>:slot_bytes=<B>:addr=<A>:mem=<host|cuda|staged>:worker=<lowercase hex>:rkey=<lowercase "
    "hex, empty for mem=staged>";

int lower_hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Takes the decimal field `name` up to the next ':'.
bool take_u64(std::string_view* s, std::string_view name, std::uint64_t* out) {
  if (!consume_prefix(s, name)) return false;
  const auto end = s->find(':');
  if (end == std::string_view::npos || !parse_u64(s->substr(0, end), out)) return false;
  s->remove_prefix(end);
  return true;
}

// Decodes `hex` into *out; empty string on success, else why not.
std::string decode_hex(std::string_view hex, std::vector<unsigned char>* out) {
  if (hex.empty()) return "is empty";
  if (hex.size() % 2 != 0) return "has an odd number of hex digits";
  if (hex.size() / 2 > kMaxUcxBlobBytes) return "is longer than " + std::to_string(kMaxUcxBlobBytes) + " bytes";
  out->resize(hex.size() / 2);
  for (std::size_t i = 0; i < out->size(); ++i) {
    const int hi = lower_hex_value(hex[2 * i]), lo = lower_hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return "is not lowercase hex";
    (*out)[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return {};
}

}  // namespace

const char* ucx_memory_name(UcxMemory memory) {
  switch (memory) {
    case UcxMemory::kHost:
      return "host";
    case UcxMemory::kCuda:
      return "cuda";
    case UcxMemory::kStaged:
      return "staged";
  }
  return "?";
}

std::string ucx_hex(const unsigned char* bytes, std::size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * size);
  for (std::size_t i = 0; i < size; ++i) {
    out += kDigits[bytes[i] >> 4];
    out += kDigits[bytes[i] & 0xf];
  }
  return out;
}

std::string format_ucx_descriptor(const UcxDescriptor& d) {
  return "ucx:slots=" + std::to_string(d.slots) + ":slot_bytes=" + std::to_string(d.slot_bytes) +
         ":addr=" + std::to_string(d.addr) + ":mem=" + ucx_memory_name(d.memory) + ":worker=" + ucx_hex(d.worker.data(), d.worker.size()) +
         ":rkey=" + ucx_hex(d.rkey.data(), d.rkey.size());
}

StatusOr<UcxDescriptor> parse_ucx_descriptor(const std::string& text) {
  auto bad = [&](std::string_view why) {
    return InvalidArgument("bad ucx descriptor \"" + text + "\": " + std::string(why) + "; " + std::string(kUsage));
  };
  std::string_view s = text;
  UcxDescriptor d;
  std::uint64_t slots = 0;
  if (!consume_prefix(&s, "ucx:")) return bad("does not start with ucx:");
  if (!take_u64(&s, "slots=", &slots)) return bad("bad slots");
  if (!take_u64(&s, ":slot_bytes=", &d.slot_bytes)) return bad("bad slot_bytes");
  if (!take_u64(&s, ":addr=", &d.addr)) return bad("bad addr");
  if (!consume_prefix(&s, ":mem=")) return bad("missing :mem=");
  const auto mem_end = s.find(':');
  const std::string_view mem = s.substr(0, mem_end == std::string_view::npos ? s.size() : mem_end);
  if (mem == "host") {
    d.memory = UcxMemory::kHost;
  } else if (mem == "cuda") {
    d.memory = UcxMemory::kCuda;
  } else if (mem == "staged") {
    d.memory = UcxMemory::kStaged;
  } else {
    return bad("mem is not one of host, cuda, staged");
  }
  s.remove_prefix(mem.size());
  if (!consume_prefix(&s, ":worker=")) return bad("missing :worker=");
  const auto rkey_at = s.find(":rkey=");
  if (rkey_at == std::string_view::npos) return bad("missing :rkey=");
  if (std::string why = decode_hex(s.substr(0, rkey_at), &d.worker); !why.empty()) return bad("worker " + why);
  s.remove_prefix(rkey_at + 6);
  if (d.memory == UcxMemory::kStaged) {
    if (!s.empty()) return bad("mem=staged has no rkey (nothing is registered)");
  } else if (std::string why = decode_hex(s, &d.rkey); !why.empty()) {
    return bad("rkey " + why);
  }
  const auto size = checked_pool_size(slots, d.slot_bytes, std::numeric_limits<std::uint64_t>::max());
  if (!size || d.addr > std::numeric_limits<std::uint64_t>::max() - *size) {
    return bad("slots and slot_bytes must be positive and addr + slots * slot_bytes must fit");
  }
  d.slots = static_cast<int>(slots);
  return d;
}

}  // namespace refit
