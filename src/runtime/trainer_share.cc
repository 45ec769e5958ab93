// A trainer rank's share of the weights: see trainer_share.h.
#include "runtime/trainer_share.h"

#include "refit/model.h"

namespace refit {

std::uint64_t payload_of_buckets(const Plan& plan, std::uint64_t first, std::uint64_t step) {
  std::uint64_t bytes = 0;
  for (std::uint64_t j = first; j < plan.buckets.size(); j += step) {
    for (const PlanEntry& e : plan.buckets[j].entries) bytes += e.bytes;
  }
  return bytes;
}

std::uint64_t gathered_bytes(const WeightSource& source) {
  if (!source.trainer_layouts().empty()) return 0;  // data(i) is the rank's own box (weight_source.h)
  std::uint64_t gathered = 0;
  for (const Weight& w : source.model().weights) gathered += w.spec.nbytes();
  return gathered;
}

void add_share_fields(Json& stats, const std::vector<EngineShare>& shares, std::uint64_t gathered) {
  Json engines = Json::array();
  for (const EngineShare& s : shares) engines.push_back(Json{{"engine_rank", s.engine_rank}, {"bytes", s.bytes}});
  stats["engines"] = std::move(engines);
  stats["gathered_bytes"] = gathered;
}

}  // namespace refit
