#include "transport/pool_layout.h"

#include <charconv>
#include <limits>

namespace refit {

std::string pool_owner(const PoolOptions& options) {
  return options.owner.empty() ? std::string("receiver") : options.owner;
}

std::optional<std::uint64_t> checked_pool_size(std::uint64_t slots, std::uint64_t slot_bytes, std::uint64_t max_bytes) {
  if (slots == 0 || slot_bytes == 0) return std::nullopt;
  if (slots > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) return std::nullopt;
  if (slot_bytes > std::numeric_limits<std::uint64_t>::max() / slots) return std::nullopt;
  const std::uint64_t size = slots * slot_bytes;
  if (size > max_bytes) return std::nullopt;
  return size;
}

StatusOr<std::uint64_t> validated_pool_bytes(const PoolOptions& options, std::uint64_t max_bytes) {
  std::optional<std::uint64_t> size;
  if (options.slots > 0) size = checked_pool_size(static_cast<std::uint64_t>(options.slots), options.slot_bytes, max_bytes);
  if (!size) {
    return InvalidArgument("bad receive pool for " + pool_owner(options) + ": slots=" + std::to_string(options.slots) +
                           ", slot_bytes=" + std::to_string(options.slot_bytes) +
                           " (both must be positive and their product must fit)");
  }
  return *size;
}

bool parse_u64(std::string_view s, std::uint64_t* out) {
  if (s.empty() || s.front() < '0' || s.front() > '9') return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

bool consume_prefix(std::string_view* s, std::string_view prefix) {
  if (s->substr(0, prefix.size()) != prefix) return false;
  s->remove_prefix(prefix.size());
  return true;
}

}  // namespace refit
