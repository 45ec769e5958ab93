// Control frames: one JSON object per kControl frame on a Link.
//
// This is the wire layer under the typed protocol (control/protocol.h, the
// only reader and writer of messages): receivers bound the size (the
// caller's cap, kMaxControlBytes by default) and the nesting depth, and
// parse the text into a JSON object; protocol.h checks the object against
// its type's schema and decodes it. Malformed input is kInvalidArgument
// naming the peer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "refit/deadline.h"
#include "net/link.h"
#include "refit/status.h"

namespace refit {

using Json = nlohmann::json;

// Large enough for the spec lists of a 10k-tensor model on several ranks.
inline constexpr std::uint64_t kMaxControlBytes = 64ull << 20;

// Deepest nesting of arrays/objects accepted (the deepest message refit
// sends, a setup's streams, is 5).
inline constexpr std::size_t kMaxControlDepth = 16;

// Bounds of the join fields the coordinator computes with, chosen so that
// pool_slots * bucket_size cannot overflow 64 bits.
inline constexpr std::uint64_t kMaxRanks = 1u << 20;
inline constexpr std::uint64_t kMaxBucketSize = 1ull << 48;
inline constexpr std::uint64_t kMaxPoolSlots = 1u << 12;

Status send_control(Link& link, const Json& message, Deadline deadline);
// Receives one control frame of at most `max_bytes` (a larger frame is
// refused before its payload is read) and parses it (parse_control_message).
// A frame of another type is a protocol error.
StatusOr<Json> recv_control(Link& link, Deadline deadline, std::uint64_t max_bytes = kMaxControlBytes);

// Parses one message's text into a JSON object (bounded nesting); errors
// name `peer`. The schema check is decode's (protocol.h).
StatusOr<Json> parse_control_message(std::string_view text, const std::string& peer);

}  // namespace refit
