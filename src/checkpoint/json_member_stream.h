// Streams the members of a JSON object one at a time, with the strict rules
// of parse_json_strict (no duplicate key in any object, no NUL byte, at most
// kMaxJsonDepth levels), without ever building the whole document.
//
// Why: a safetensors header may be 100,000,000 bytes. Built as one
// nlohmann DOM it costs ~1.8 KB of memory per tensor entry, 30 times the
// entry's ~60 bytes of text (a 100 MB header listing 1.7 million empty
// tensors took 3.17 GB and 35 s). Here each member's value is built alone,
// handed to the caller and dropped, so memory is the largest single member
// plus what the caller keeps; and a count limit refuses an over-long object
// as soon as the member past the limit appears, before the rest is read.
//
// Internal to refit_core: nlohmann stays out of the public headers.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "refit/status.h"

namespace refit {

// Called once per member of the top-level object, in text order. A non-OK
// return stops the stream and is returned as it is.
using JsonMemberFn = std::function<Status(const std::string& key, const nlohmann::json& value)>;

// Parses `text`, which must be one JSON object (surrounding whitespace
// allowed), calling `on_member` for each member. Errors: on_member's error
// unchanged; otherwise kInvalidArgument, `prefix` followed by what broke
// ("not valid JSON: ...", "duplicate key \"k\" at the top level",
// "duplicate key \"k\" inside \"outer\"", "nested deeper than 32 levels",
// "it is not a JSON object", or `too_many` when a member beyond
// `max_members` appears).
Status stream_json_members(std::string_view text, std::size_t max_members, const std::string& too_many,
                           const std::string& prefix, const JsonMemberFn& on_member);

}  // namespace refit
