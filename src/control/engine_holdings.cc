// What each engine rank holds, for the report: see engine_holdings.h.
#include "control/engine_holdings.h"

namespace refit {

void EngineHoldings::committed(const RecordCommit& commit) {
  if (engines_.size() < commit.engines.size()) engines_.resize(commit.engines.size());
  for (std::size_t e = 0; e < commit.engines.size(); ++e) {
    const Done& done = commit.engines[e];
    if (done.stats.is_object() && done.stats.value("dropped", false)) continue;  // its engine left the job
    Engine& engine = engines_[e];
    engine.listed = true;
    engine.weight_version = commit.version;
    if (done.verified) engine.verified_version = commit.version;
    engine.shadow = done.stats.is_object() && done.stats.value("shadow", false);
    engine.complete = true;
  }
}

void EngineHoldings::joined(const RecordJoin& join) {
  const std::size_t first = static_cast<std::size_t>(join.engine) * ranks_;
  if (engines_.size() < first + ranks_) engines_.resize(first + ranks_);
  for (std::size_t r = 0; r < ranks_; ++r) {
    Engine& engine = engines_[first + r];
    engine.listed = true;
    engine.weight_version = join.version;
    engine.complete = true;
    if (r < join.done.size()) {
      const Done& done = join.done[r];
      if (done.verified) engine.verified_version = join.version;
      engine.shadow = done.stats.is_object() && done.stats.value("shadow", false);
    }
  }
}

void EngineHoldings::went(std::uint64_t version) {
  for (Engine& engine : engines_) {
    if (version > engine.weight_version && !engine.shadow) engine.complete = false;
  }
}

void EngineHoldings::recovered(const RecordRecovery& recovery) {
  for (std::size_t e = 0; e < recovery.engines.size() && e < engines_.size(); ++e) {
    engines_[e].complete = recovery.engines[e].weights_complete.value_or(false);
  }
}

bool EngineHoldings::all_shadow() const {
  bool any = false;
  for (const Engine& engine : engines_) {
    if (!engine.listed) continue;
    if (!engine.shadow) return false;
    any = true;
  }
  return any;
}

Json EngineHoldings::json() const {
  Json out = Json::array();
  for (std::size_t e = 0; e < engines_.size(); ++e) {
    const Engine& engine = engines_[e];
    if (!engine.listed) continue;  // a slot no engine joined
    out.push_back(Json{{"engine", e / ranks_},
                       {"rank", e % ranks_},
                       {"weight_version", engine.weight_version},
                       {"verified_version", engine.verified_version},
                       {"weights_complete", engine.complete},
                       {"shadow", engine.shadow}});
  }
  return out;
}

}  // namespace refit
