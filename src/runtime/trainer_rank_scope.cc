// A trainer rank's partial refits (refit/partial.h): see trainer_rank_impl.h
// check_partial and use_scope.
#include "refit/partial.h"
#include "runtime/trainer_rank_impl.h"

namespace refit {

StatusOr<RefitScope> TrainerRank::Impl::partial_scope(std::uint64_t version,
                                                      const std::vector<std::string>& only) const {
  ASSIGN_OR_RETURN(RefitScope scope, canonical_scope(only));
  if (scope.full()) return scope;
  RETURN_IF_ERROR(check_partial(version));
  // A glob that selects nothing is refused here, before the refit is asked for.
  RETURN_IF_ERROR(select_tensors(scope, plan_.specs).status().WithContext(name()));
  return scope;
}

Status TrainerRank::Impl::check_partial(std::uint64_t version) const {
  const std::string what = name() + ": partial refit " + std::to_string(version);
  // Each refusal: a setting whose partial refit is not built yet.
  if (sharded_) {
    return FailedPrecondition(what + " with sharded trainers (--trainer-layout " + options_.trainer_layout +
                              "): not built yet");
  }
  if (options_.quantize != "none") return FailedPrecondition(what + " with --quantize: not built yet");
  return Status::Ok();
}

StatusOr<PlanSwap> TrainerRank::Impl::use_scope(std::uint64_t version, const std::vector<std::string>& only) {
  partial_touched_ = nullptr;
  if (only.empty()) return PlanSwap();
  RETURN_IF_ERROR(check_partial(version));
  auto cached = subset_plans_.find(only);
  if (cached == subset_plans_.end()) {
    if (subset_plans_.size() >= kSubsetPlansKept) subset_plans_.clear();  // a job whose globs keep changing
    ASSIGN_OR_RETURN(const std::vector<bool> selected, select_tensors(RefitScope{only}, plan_.specs));
    SubsetPlan subset;
    ASSIGN_OR_RETURN(subset.plan, make_subset_plan(plan_, selected));
    subset.touched.assign(plan_.buckets.size(), false);
    for (std::size_t j = 0; j < plan_.buckets.size(); ++j) {
      for (const PlanEntry& e : plan_.buckets[j].entries) subset.touched[j] = subset.touched[j] || selected[e.tensor];
    }
    cached = subset_plans_.emplace(only, std::move(subset)).first;
  }
  partial_touched_ = &cached->second.touched;
  Plan* subset = &cached->second.plan;
  return PlanSwap([this, subset] { std::swap(plan_, *subset); });
}

}  // namespace refit
