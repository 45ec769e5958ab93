// Control messages: one JSON object per kControl frame on a Link.
//
// Every message has a string field "type". Receivers bound the size (the
// caller's cap, kMaxControlBytes by default), parse, and validate the message
// against the schema of its type (validate_control_message) before anything
// uses it; malformed input is kInvalidArgument naming the peer, the message
// type and the field. A validated message can be read with nlohmann's
// value()/get() on its schema's fields without any exception.
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
// Receives one control message of at most `max_bytes` (a larger frame is
// refused before its payload is read). A frame of another type is a protocol
// error. The message is parsed and validated (parse_control_message).
StatusOr<Json> recv_control(Link& link, Deadline deadline, std::uint64_t max_bytes = kMaxControlBytes);

// Parses one message's text and validates it; errors name `peer`.
StatusOr<Json> parse_control_message(std::string_view text, const std::string& peer);

// Checks `message` against the schema of its type: an object with a string
// "type" (at most 64 bytes); for every type refit sends, each known field,
// when present, has the right JSON kind and is within its bounds, and the
// fields every receiver relies on are present. Unknown types pass (their
// receiver's protocol state refuses them), and so do unknown fields.
Status validate_control_message(const Json& message);

// Typed field access with errors naming the message type and field.
StatusOr<std::string> json_string(const Json& message, const char* field);
StatusOr<std::int64_t> json_int(const Json& message, const char* field);
StatusOr<std::uint64_t> json_uint(const Json& message, const char* field);
StatusOr<bool> json_bool(const Json& message, const char* field);

// Status <-> JSON {"code": "...", "message": "..."} for failures that cross
// processes. status_from_json never throws: a malformed status becomes
// kInternal saying so.
Json status_to_json(const Status& status);
Status status_from_json(const Json& json);

}  // namespace refit
