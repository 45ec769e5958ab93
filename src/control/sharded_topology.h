// Sharded trainers at setup (issue 19): the coordinator's checks of their
// joins and what each rank is told. Private to src/control/ (topology.cc is
// the one caller).
//
// A sharded trainer rank's join carries its layout, the transfer plan's
// digest and, per engine rank it writes into, its plan digest of that
// engine rank's stream and its parts: (bucket, bytes) of that plan. The
// coordinator has no model and computes no transfer plan: it checks that
// every trainer rank computed the same transfer plan (layout and digest),
// that each fed engine rank planned the same stream, and that the parts of
// each bucket add up to exactly the bucket's entries; then tells each engine
// rank its feeders and who writes which part of each bucket, and each
// trainer rank how to reach every engine rank it feeds.
#pragma once

#include <vector>

#include "control/protocol.h"
#include "control/topology.h"

namespace refit {

// kFailedPrecondition naming the ranks and the value: layouts or transfer
// digests that differ, a feed of an engine rank out of range, a plan digest
// other than the engine rank's, a dtype the engine does not support, parts
// of a bucket that do not add up to it (or of a bucket the plan lacks), an
// engine rank nobody feeds.
Status check_sharded_trainers(const std::vector<Join>& trainers, const std::vector<Join>& engines);

// Fills topology.engine_setups (feeders, parts) and topology.trainer_setups
// (targets). REQUIRES: check_sharded_trainers passed; both setup vectors
// sized to the ranks.
void sharded_setups(const std::vector<Join>& trainers, const std::vector<Join>& engines, Topology& topology);

}  // namespace refit
