// The transports this build has, by the names --transport takes.
#pragma once

#include <string>
#include <vector>

namespace refit {

// Names of the transports built into this binary ("shm", "tcp", ...).
std::vector<std::string> transport_names();

}  // namespace refit
