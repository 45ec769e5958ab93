// Many engines: an engine or trainer rank's Route (protocol.h: its place in
// the relay tree after the tree changed) as JSON, the `route` of a relink:
// {"feeders": [...], "relay": [targets], "targets": [targets], "parts":
// [[[index, bytes], ...], ...]}, the last two only when not empty. Parsing
// names the bad field ("'relink' field 'route': 'feeders' must hold
// integers >= 0").
#pragma once

#include <string>

#include "control/control_message.h"
#include "control/protocol.h"

namespace refit {

Json route_to_json(const Route& route);
StatusOr<Route> route_from_json(const Json& json, const std::string& what);

}  // namespace refit
