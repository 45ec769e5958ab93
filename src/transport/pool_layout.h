// Helpers every transport uses to check a receive pool's shape and to parse
// its descriptor text (private to src/transport).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "refit/status.h"
#include "transport/transport.h"

namespace refit {

// The pool's owner as errors name it ("receiver" when unnamed).
std::string pool_owner(const PoolOptions& options);

// slots * slot_bytes when both are positive, slots fits an int, and the
// product is at most max_bytes; std::nullopt otherwise.
std::optional<std::uint64_t> checked_pool_size(std::uint64_t slots, std::uint64_t slot_bytes, std::uint64_t max_bytes);

// checked_pool_size of `options`, or kInvalidArgument naming the owner and
// both values.
StatusOr<std::uint64_t> validated_pool_bytes(const PoolOptions& options, std::uint64_t max_bytes);

// Descriptor parsing: a whole decimal string (digits only) into *out.
bool parse_u64(std::string_view s, std::uint64_t* out);
// Removes `prefix` from the front of *s; false (and *s unchanged) if absent.
bool consume_prefix(std::string_view* s, std::string_view prefix);

}  // namespace refit
