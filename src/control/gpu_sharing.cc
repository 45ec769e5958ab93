#include "control/gpu_sharing.h"

namespace refit {

std::vector<std::string> shared_gpu_warnings(const std::vector<RankGpu>& ranks) {
  // (gpu, its ranks), in first-seen order; a job has at most a few hundred
  // ranks, so a linear search per rank is enough.
  std::vector<std::pair<std::string, std::vector<std::string>>> by_gpu;
  for (const RankGpu& r : ranks) {
    if (r.gpu.empty()) continue;
    auto it = by_gpu.begin();
    while (it != by_gpu.end() && it->first != r.gpu) ++it;
    if (it == by_gpu.end()) {
      by_gpu.push_back({r.gpu, {r.rank}});
    } else {
      it->second.push_back(r.rank);
    }
  }
  std::vector<std::string> warnings;
  for (const auto& [gpu, names] : by_gpu) {
    if (names.size() < 2) continue;
    std::string list;
    for (std::size_t i = 0; i < names.size(); ++i) {
      list += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
    }
    warnings.push_back("warning: " + list + " share GPU " + gpu +
                       ": over nccl the kernels of two processes on one GPU take turns, each spinning until its "
                       "peer runs, so refits run at a small fraction of the link's speed; give every rank a GPU "
                       "of its own, or use --transport cuda_ipc for ranks on one host");
  }
  return warnings;
}

}  // namespace refit
