#include "transport/nccl/nccl_descriptor.h"

#include <limits>
#include <string_view>

#include "transport/pool_layout.h"

namespace refit {
namespace {

constexpr std::string_view kUsage =
    "expected nccl:version=<V>:slots=<S>:slot_bytes=<B>:id=<256 lowercase hex digits>";

int lower_hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Takes the decimal field `name` ("version=") up to the next ':'.
bool take_field(std::string_view* s, std::string_view name, std::uint64_t* out) {
  if (!consume_prefix(s, name)) return false;
  const auto end = s->find(':');
  if (end == std::string_view::npos || !parse_u64(s->substr(0, end), out)) return false;
  s->remove_prefix(end + 1);
  return true;
}

}  // namespace

std::string format_nccl_descriptor(const NcclDescriptor& d) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string id;
  id.reserve(2 * d.id.size());
  for (unsigned char b : d.id) {
    id += kDigits[b >> 4];
    id += kDigits[b & 0xf];
  }
  return "nccl:version=" + std::to_string(d.version) + ":slots=" + std::to_string(d.slots) +
         ":slot_bytes=" + std::to_string(d.slot_bytes) + ":id=" + id;
}

StatusOr<NcclDescriptor> parse_nccl_descriptor(const std::string& text) {
  auto bad = [&](std::string_view why) {
    return InvalidArgument("bad nccl descriptor \"" + text + "\": " + std::string(why) + "; " + std::string(kUsage));
  };
  std::string_view s = text;
  NcclDescriptor d;
  std::uint64_t version = 0, slots = 0;
  if (!consume_prefix(&s, "nccl:")) return bad("does not start with nccl:");
  if (!take_field(&s, "version=", &version)) return bad("bad or missing version");
  if (!take_field(&s, "slots=", &slots)) return bad("bad or missing slots");
  if (!take_field(&s, "slot_bytes=", &d.slot_bytes)) return bad("bad or missing slot_bytes");
  if (!consume_prefix(&s, "id=")) return bad("missing id");
  if (s.size() != 2 * kNcclUniqueIdBytes) {
    return bad("id has " + std::to_string(s.size()) + " characters, not " + std::to_string(2 * kNcclUniqueIdBytes));
  }
  for (std::size_t i = 0; i < kNcclUniqueIdBytes; ++i) {
    const int hi = lower_hex_value(s[2 * i]), lo = lower_hex_value(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return bad("id is not lowercase hex");
    d.id[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  if (version == 0 || version > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) {
    return bad("version must be a positive NCCL version code (e.g. 22809)");
  }
  if (!checked_pool_size(slots, d.slot_bytes, std::numeric_limits<std::uint64_t>::max())) {
    return bad("slots and slot_bytes must be positive and their product must fit");
  }
  d.version = static_cast<int>(version);
  d.slots = static_cast<int>(slots);
  return d;
}

}  // namespace refit
