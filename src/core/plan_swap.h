// PlanSwap: a partial refit's plans in place of the setup's, for one refit.
//
// A rank's links, senders, receiver and relay keep pointers to its plan
// members. For a partial refit (refit/partial.h) the rank swaps each member
// with the subset plan it cached for the refit's globs (an O(1) exchange of
// the two Plans' buffers), and swaps back when the PlanSwap goes, on success
// or failure: between refits a rank's plans are always the setup's, so
// relinks, acquires, catch-ups and staging sizes never see a subset.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "refit/plan.h"

namespace refit {

class PlanSwap {
 public:
  PlanSwap() = default;
  // Swaps each pair's plans now, and back at destruction; `after` (if any)
  // runs after each of the two swaps (a receiver deals its buckets again).
  explicit PlanSwap(std::vector<std::pair<Plan*, Plan*>> pairs, std::function<void()> after = {})
      : pairs_(std::move(pairs)), after_(std::move(after)) {
    swap_all();
  }
  PlanSwap(PlanSwap&& other) noexcept
      : pairs_(std::exchange(other.pairs_, {})), after_(std::exchange(other.after_, {})) {}
  PlanSwap& operator=(PlanSwap&&) = delete;
  PlanSwap(const PlanSwap&) = delete;
  PlanSwap& operator=(const PlanSwap&) = delete;
  ~PlanSwap() { swap_all(); }

 private:
  void swap_all() {
    for (auto& [a, b] : pairs_) std::swap(*a, *b);
    if (!pairs_.empty() && after_) after_();
  }
  std::vector<std::pair<Plan*, Plan*>> pairs_;
  std::function<void()> after_;
};

}  // namespace refit
