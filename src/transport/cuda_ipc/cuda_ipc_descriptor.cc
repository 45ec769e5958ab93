#include "transport/cuda_ipc/cuda_ipc_descriptor.h"

#include <charconv>
#include <limits>

namespace refit {
namespace {

constexpr std::string_view kUsage =
    "expected cuda_ipc:dev=<pci bus id>:slots=<S>:slot_bytes=<B>:offset=<O>:handle=<128 lowercase hex digits>"
    "[:events=<S x 128 lowercase hex digits>]";

bool parse_u64(std::string_view s, std::uint64_t* out) {
  if (s.empty() || s.front() < '0' || s.front() > '9') return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

bool consume(std::string_view* s, std::string_view prefix) {
  if (s->substr(0, prefix.size()) != prefix) return false;
  s->remove_prefix(prefix.size());
  return true;
}

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

bool all_hex(std::string_view s) {
  for (char c : s) {
    if (!is_hex(c)) return false;
  }
  return true;
}

int lower_hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Reads 64 bytes from 128 lowercase hex digits at the start of `s`.
bool take_handle(std::string_view s, std::array<unsigned char, kCudaIpcHandleBytes>* out) {
  for (std::size_t i = 0; i < kCudaIpcHandleBytes; ++i) {
    const int hi = lower_hex_value(s[2 * i]), lo = lower_hex_value(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

// Takes the decimal field up to the next ':' (or the end when `last`).
bool take_field(std::string_view* s, std::string_view name, bool last, std::uint64_t* out) {
  if (!consume(s, name)) return false;
  const auto end = last ? s->size() : s->find(':');
  if (end == std::string_view::npos) return false;
  if (!parse_u64(s->substr(0, end), out)) return false;
  s->remove_prefix(end);
  return true;
}

}  // namespace

bool is_pci_bus_id(std::string_view s) {
  const auto c1 = s.find(':');
  if (c1 == std::string_view::npos || c1 < 4 || c1 > 8 || !all_hex(s.substr(0, c1))) return false;
  s.remove_prefix(c1 + 1);
  // "<bus>:<device>.<function>"
  return s.size() == 7 && is_hex(s[0]) && is_hex(s[1]) && s[2] == ':' && is_hex(s[3]) && is_hex(s[4]) &&
         s[5] == '.' && is_hex(s[6]);
}

std::string cuda_ipc_handle_hex(const std::array<unsigned char, kCudaIpcHandleBytes>& handle) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * handle.size());
  for (unsigned char b : handle) {
    out += kDigits[b >> 4];
    out += kDigits[b & 0xf];
  }
  return out;
}

std::string format_cuda_ipc_descriptor(const CudaIpcDescriptor& d) {
  std::string events;
  if (!d.events.empty()) {
    events = ":events=";
    for (const auto& e : d.events) events += cuda_ipc_handle_hex(e);
  }
  return "cuda_ipc:dev=" + d.pci_bus_id + ":slots=" + std::to_string(d.slots) +
         ":slot_bytes=" + std::to_string(d.slot_bytes) + ":offset=" + std::to_string(d.offset) +
         ":handle=" + cuda_ipc_handle_hex(d.handle) + events;
}

StatusOr<CudaIpcDescriptor> parse_cuda_ipc_descriptor(const std::string& text) {
  auto bad = [&](std::string_view why) {
    return InvalidArgument("bad cuda_ipc descriptor \"" + text + "\": " + std::string(why) + "; " +
                           std::string(kUsage));
  };
  std::string_view s = text;
  CudaIpcDescriptor d;
  if (!consume(&s, "cuda_ipc:dev=")) return bad("does not start with cuda_ipc:dev=");
  // The bus id itself holds colons: it ends where ":slots=" begins.
  const auto slots_at = s.find(":slots=");
  if (slots_at == std::string_view::npos) return bad("missing :slots=");
  const std::string_view bus = s.substr(0, slots_at);
  if (!is_pci_bus_id(bus)) return bad("dev is not a PCI bus id like 0000:3B:00.0");
  d.pci_bus_id = std::string(bus);
  s.remove_prefix(slots_at);
  std::uint64_t slots = 0;
  if (!take_field(&s, ":slots=", false, &slots)) return bad("bad slots");
  if (!take_field(&s, ":slot_bytes=", false, &d.slot_bytes)) return bad("bad slot_bytes");
  if (!take_field(&s, ":offset=", false, &d.offset)) return bad("bad offset");
  if (!consume(&s, ":handle=")) return bad("missing :handle=");
  const auto events_at = s.find(":events=");
  const std::string_view handle = s.substr(0, events_at);
  if (handle.size() != 2 * kCudaIpcHandleBytes) {
    return bad("handle has " + std::to_string(handle.size()) + " characters, not " +
               std::to_string(2 * kCudaIpcHandleBytes));
  }
  if (!take_handle(handle, &d.handle)) return bad("handle is not lowercase hex");
  std::string_view events;
  if (events_at != std::string_view::npos) {
    events = s.substr(events_at + 8);
    if (events.empty() || events.size() % (2 * kCudaIpcHandleBytes) != 0) {
      return bad("events has " + std::to_string(events.size()) + " characters, not a positive multiple of " +
                 std::to_string(2 * kCudaIpcHandleBytes));
    }
  }
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  if (slots == 0 || d.slot_bytes == 0 || slots > static_cast<std::uint64_t>(std::numeric_limits<int>::max()) ||
      d.slot_bytes > kMax / slots || d.offset > kMax - slots * d.slot_bytes) {
    return bad("slots and slot_bytes must be positive and offset + slots * slot_bytes must fit");
  }
  d.slots = static_cast<int>(slots);
  if (!events.empty()) {
    const std::size_t n = events.size() / (2 * kCudaIpcHandleBytes);
    if (n != slots) {
      return bad("events holds " + std::to_string(n) + " handles for " + std::to_string(slots) + " slots");
    }
    d.events.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (!take_handle(events.substr(i * 2 * kCudaIpcHandleBytes), &d.events[i])) {
        return bad("event handle " + std::to_string(i) + " is not lowercase hex");
      }
    }
  }
  return d;
}

}  // namespace refit
