// Ranks placed on one physical GPU, found from the GPU UUIDs in their joins.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace refit {

// One rank and the UUID of the GPU it uses ("" when it uses none).
struct RankGpu {
  std::string rank;  // "trainer rank 1"
  std::string gpu;   // "GPU-4c2a46b8-..." or ""
};

// The GPUs that two or more ranks of a job use (over a transport whose
// ranks serialize on a shared GPU, TransportTopology), one warning line per
// such GPU naming its ranks, in the order the GPUs first appear. Over nccl
// the kernels of two processes on one GPU take turns, and each spins until
// its peer on another GPU runs: refits measured 0.03-0.41x of the copy
// ceiling (docs/PERF.md, "Several GPUs"). Ranks without a GPU are ignored.
std::vector<std::string> shared_gpu_warnings(const std::vector<RankGpu>& ranks);

}  // namespace refit
