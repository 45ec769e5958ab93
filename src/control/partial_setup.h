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
// the running job (--max-engines above --engines). `engines`: every engine
// rank's join (each must take partial refits; `engines[0]`'s specs are
// the stream the globs select from).
Status check_partial_refits(const std::vector<std::string>& only, const Join& trainer,
                            const std::vector<Join>& engines, bool joins_possible);

// The first engine rank whose engine does not take partial refits, named
// with why ("engine rank 1's engine does not take partial refits
// (Engine::begin_partial)"), or "" when every one does.
std::string engine_without_partial(const std::vector<Join>& engines);

}  // namespace refit
