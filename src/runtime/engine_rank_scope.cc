// An engine rank's partial refits (refit/partial.h): see engine_rank_impl.h
// use_scope. Every rank of the engine selects the same names of its own
// stream (every stream lists every tensor in model order), so the peers'
// subset plans replay their batch boundaries as the full ones do.
#include "runtime/engine_rank_impl.h"

namespace refit {

Status EngineRank::Impl::check_partial(std::uint64_t version) const {
  const std::string what = name() + ": partial refit " + std::to_string(version);
  // Each refusal: a setting whose partial refit is not built yet.
  if (options_.quantize != "none") return FailedPrecondition(what + " with --quantize: not built yet");
  if (!parts_.empty()) return FailedPrecondition(what + " from sharded trainers: not built yet");
  return Status::Ok();
}

StatusOr<PlanSwap> EngineRank::Impl::use_scope(std::uint64_t version, const std::vector<std::string>& only) {
  moving_.clear();
  if (only.empty()) return PlanSwap();
  RETURN_IF_ERROR(check_partial(version));
  auto cached = subset_plans_.find(only);
  if (cached == subset_plans_.end()) {
    if (subset_plans_.size() >= kSubsetPlansKept) subset_plans_.clear();  // a job whose globs keep changing
    const RefitScope scope{only};
    SubsetPlans plans;
    ASSIGN_OR_RETURN(plans.selected, select_tensors(scope, plan_.specs));
    ASSIGN_OR_RETURN(plans.own, make_subset_plan(plan_, plans.selected));
    plans.peers.resize(peer_plans_.size());
    for (std::size_t r = 0; r < peer_plans_.size(); ++r) {
      if (static_cast<int>(r) == rank()) continue;
      ASSIGN_OR_RETURN(const std::vector<bool> theirs, select_tensors(scope, peer_plans_[r].specs));
      ASSIGN_OR_RETURN(plans.peers[r], make_subset_plan(peer_plans_[r], theirs));
    }
    cached = subset_plans_.emplace(only, std::move(plans)).first;
  }
  SubsetPlans* plans = &cached->second;
  moving_ = plans->selected;
  // The receiver's I/O thread reads plan_ under the receiver's lock: the
  // swap runs there (check_partial refused the feeders replan refuses).
  auto swap = [this, plans] {
    const Status dealt = receiver_->replan([&] {
      std::swap(plan_, plans->own);
      for (std::size_t r = 0; r < peer_plans_.size(); ++r) {
        if (static_cast<int>(r) != rank()) std::swap(peer_plans_[r], plans->peers[r]);
      }
    });
    if (!dealt.ok()) log(LogLevel::kError, name(), dealt.ToString());
  };
  return PlanSwap(swap);
}

Status EngineRank::Impl::begin_engine(std::uint64_t version, const std::vector<std::string>& only) {
  if (only.empty()) return engine_->begin(version);
  return engine_->begin_partial(version, RefitScope{only}).WithContext(name());
}

}  // namespace refit
