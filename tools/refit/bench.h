// `refit bench`: runs the demo's multi-process refit and, in the same run,
// measures the ceiling it is judged against (this machine's memcpy bandwidth
// over the same number of bytes as one refit), then reports each refit's
// throughput and its ratio to that ceiling.
#pragma once

#include "refit/demo.h"

namespace refit {

// Returns the process exit status: 0 when every refit verified.
int run_bench(const DemoOptions& options);

}  // namespace refit
