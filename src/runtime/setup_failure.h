// A rank that fails during setup tells the coordinator why, so every
// process stops at once naming that rank and its reason, instead of the
// coordinator and the other ranks waiting out the setup deadline for it
// (issue 17). Two cases:
//   - before it joined (its own checks, its model, its device): it connects
//     just to report, a SetupFailed in place of a join;
//   - after it joined (linking with its peers): a Failed on its control
//     link, which the phase machine turns into the end of setup.
//
// Thread safety: free functions.
#pragma once

#include <string>

#include "control/protocol.h"
#include "refit/roles.h"
#include "refit/status.h"

namespace refit {

// Where a rank's setup stopped: what the coordinator already knows of it.
enum class SetupStage {
  kLocal,    // before connecting: the coordinator knows nothing of it
  kJoining,  // connecting, authenticating, joining: the coordinator decides
  kJoined,   // it has its Setup: its control link carries a Failed
};

// Reports `error` (a rank's setup failure before joining) to the coordinator
// of `options`, as `role` rank options.rank; best effort, within a few
// seconds (never past the setup deadline). Nothing happens without a
// coordinator address.
void report_setup_failure(const RankOptions& options, Role role, const Status& error, int engine = 0);

// report_rank_setup_failure (refit/roles.h), the public form of this one
// (the role as validate_rank_settings takes it), is defined in
// setup_failure.cc.

}  // namespace refit
