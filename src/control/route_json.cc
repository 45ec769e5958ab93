#include "control/route_json.h"

#include "control/shard_json.h"

namespace refit {

Json route_to_json(const Route& route) {
  Json out{{"feeders", route.feeders}, {"relay", targets_to_json(route.relay)}};
  if (!route.targets.empty()) out["targets"] = targets_to_json(route.targets);
  if (!route.parts.empty()) out["parts"] = bucket_parts_to_json(route.parts);
  return out;
}

StatusOr<Route> route_from_json(const Json& json, const std::string& what) {
  Route route;
  for (const Json& f : json.value("feeders", Json::array())) {
    if (!f.is_number_unsigned()) return InvalidArgument(what + ": 'feeders' must hold integers >= 0");
    route.feeders.push_back(f.get<std::uint64_t>());
  }
  ASSIGN_OR_RETURN(route.relay, targets_from_json(json.value("relay", Json::array()), what));
  ASSIGN_OR_RETURN(route.targets, targets_from_json(json.value("targets", Json::array()), what + " 'targets'"));
  ASSIGN_OR_RETURN(route.parts, bucket_parts_from_json(json.value("parts", Json::array()), what + " 'parts'"));
  return route;
}

}  // namespace refit
