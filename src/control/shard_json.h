// The sharded trainers' fields of a join and a setup (protocol.h: Part,
// Feed, EngineTarget) as JSON. Parsing validates every element and names
// the bad one ("'join' field 'feeds': element 1: field 'parts': element 0:
// expected [index, bytes] with bytes > 0").
#pragma once

#include <string>
#include <vector>

#include "control/control_message.h"
#include "control/protocol.h"

namespace refit {

// [[index, bytes], ...]
Json parts_to_json(const std::vector<Part>& parts);
StatusOr<std::vector<Part>> parts_from_json(const Json& json, const std::string& what);

// Per bucket of a plan, its parts: [[[index, bytes], ...], ...] (a setup's
// and a relink route's `parts`; errors name "<what>: bucket j").
Json bucket_parts_to_json(const std::vector<std::vector<Part>>& buckets);
StatusOr<std::vector<std::vector<Part>>> bucket_parts_from_json(const Json& json, const std::string& what);

// [{"engine_rank": e, "plan_digest": "...", "parts": [[bucket, bytes], ...]}, ...]
Json feeds_to_json(const std::vector<Feed>& feeds);
StatusOr<std::vector<Feed>> feeds_from_json(const Json& json, const std::string& what);

// [{"engine_rank": e, "address": "...", "descriptor": "...", "device": "cpu"}, ...]
Json targets_to_json(const std::vector<EngineTarget>& targets);
StatusOr<std::vector<EngineTarget>> targets_from_json(const Json& json, const std::string& what);

}  // namespace refit
