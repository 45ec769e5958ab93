// The coordinator's check of a scheduled job's partial refits
// (CoordinatorOptions::only, refit/partial.h), at setup: every glob selects
// a tensor of engine rank 0's stream, and the job's settings are ones
// partial refits are built for. Each refusal names the setting.
#pragma once

#include <vector>

#include "control/protocol.h"
#include "refit/status.h"

namespace refit {

// `only` is canonical (canonical_scope). `joins_possible`: engines may join
// the running job (--max-engines above --engines).
Status check_partial_refits(const std::vector<std::string>& only, const Join& trainer, const Join& engine,
                            bool joins_possible);

}  // namespace refit
