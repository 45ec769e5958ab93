// `refit bench`: runs the demo's multi-process refit and, in the same run,
// measures the ceiling it is judged against (this machine's memcpy bandwidth
// over the same number of bytes as one refit), then reports each refit's
// throughput and its ratio to that ceiling.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "refit/demo.h"

namespace refit {

// Returns the process exit status: 0 when every refit verified.
int run_bench(const DemoOptions& options);

// `refit ceiling`: what to measure.
struct CeilingOptions {
  std::string kind = "memcpy";  // memcpy, h2d, d2d or peer
  std::uint64_t bytes = 1ull << 30;
  // peer only: local CUDA devices (inside CUDA_VISIBLE_DEVICES) copied from
  // and to; with both_ways, half the bytes go from -> to and the other half
  // to -> from at the same time (what a TP job whose trainers feed the other
  // GPU's engine rank moves over the link).
  int from = 0, to = 1;
  bool both_ways = false;
  // peer only, instead of from/to: copies over several (from, to) device
  // pairs at the same time, bytes / pairs each (what trainers on some GPUs
  // feeding engine ranks on others move at once).
  std::vector<std::pair<int, int>> pairs;
};

// `refit ceiling`: measures one ceiling over `bytes` bytes now and prints
// {"ceiling", "bytes", "gbps"} as JSON: "memcpy" (one host thread), "h2d"
// (pinned host to device 0), "d2d" (device 0 to device 0), "peer"
// (cudaMemcpyPeerAsync from device `from` to device `to`, timed with CUDA
// events; also "from", "to", "both_ways", "peer_access"). The best of 5
// after a warm-up. Scripts that benchmark several processes
// (bench/push_bench.sh, bench/multi_gpu.sh) call it in the same run.
// Returns the exit status: 1 (with the reason on stderr) when the kind cannot
// be measured here, e.g. peer with fewer than two visible devices.
int run_ceiling(const CeilingOptions& options);

}  // namespace refit
