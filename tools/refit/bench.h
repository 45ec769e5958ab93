// `refit bench`: runs the demo's multi-process refit and, in the same run,
// measures the ceiling it is judged against (this machine's memcpy bandwidth
// over the same number of bytes as one refit), then reports each refit's
// throughput and its ratio to that ceiling.
#pragma once

#include <cstdint>
#include <string>

#include "refit/demo.h"

namespace refit {

// Returns the process exit status: 0 when every refit verified.
int run_bench(const DemoOptions& options);

// `refit ceiling`: measures one ceiling over `bytes` bytes now and prints
// {"ceiling", "bytes", "gbps"} as JSON: "memcpy" (one host thread), "h2d"
// (pinned host to device 0), "d2d" (device 0 to device 0). Scripts that
// benchmark several processes (bench/push_bench.sh) call it in the same run.
int run_ceiling(const std::string& kind, std::uint64_t bytes);

}  // namespace refit
