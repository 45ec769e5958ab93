// Control messages: one JSON object per kControl frame on a Link.
//
// Every message has a string field "type". Receivers bound the size
// (kMaxControlBytes), parse, and check the type and required fields before
// using anything; malformed input is kInvalidArgument naming the peer.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "refit/deadline.h"
#include "refit/link.h"
#include "refit/status.h"

namespace refit {

using Json = nlohmann::json;

// Large enough for the spec lists of a 10k-tensor model on several ranks.
inline constexpr std::uint64_t kMaxControlBytes = 64ull << 20;

Status send_control(Link& link, const Json& message, Deadline deadline);
// Receives one control message. A frame of another type is a protocol error.
StatusOr<Json> recv_control(Link& link, Deadline deadline);

// Typed field access with errors naming the message type and field.
StatusOr<std::string> json_string(const Json& message, const char* field);
StatusOr<std::int64_t> json_int(const Json& message, const char* field);
StatusOr<std::uint64_t> json_uint(const Json& message, const char* field);

// Status <-> JSON {"code": "...", "message": "..."} for failures that cross processes.
Json status_to_json(const Status& status);
Status status_from_json(const Json& json);

}  // namespace refit
