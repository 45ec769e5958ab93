// JSON parsing that refuses what nlohmann::json accepts silently.
//
// nlohmann keeps the last of two equal keys in an object without a word; a
// safetensors header or a checkpoint index with a duplicate key is ambiguous
// (two readers may pick different entries), so the format forbids it and we
// refuse it. nlohmann also stops at a NUL byte and ignores the rest of the
// text; a NUL is refused here (JSON has no place for one). Nesting is bounded (kMaxJsonDepth) so that a hostile header of
// "[[[[..." cannot make the parser build millions of nested values.
//
// Internal to refit_core: nlohmann stays out of the public headers.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "refit/status.h"

namespace refit {

// Deeper than any safetensors header (object, tensor object, shape array: 3)
// or checkpoint index (object, weight_map: 2) needs.
inline constexpr int kMaxJsonDepth = 32;

// Parses `text` as one JSON value (surrounding whitespace allowed). Errors
// are kInvalidArgument: "not valid JSON: <parser's reason and byte offset>",
// "duplicate key \"k\" at the top level" / "duplicate key \"k\" inside
// \"outer\"", or "nested deeper than 32 levels".
StatusOr<nlohmann::json> parse_json_strict(std::string_view text);

}  // namespace refit
