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

namespace refit {

class PlanSwap {
 public:
  PlanSwap() = default;
  // Runs `swap` (which exchanges the plans; running it again swaps them
  // back) now, and again at destruction.
  explicit PlanSwap(std::function<void()> swap) : swap_(std::move(swap)) { swap_(); }
  PlanSwap(PlanSwap&& other) noexcept : swap_(std::exchange(other.swap_, {})) {}
  PlanSwap& operator=(PlanSwap&&) = delete;
  PlanSwap(const PlanSwap&) = delete;
  PlanSwap& operator=(const PlanSwap&) = delete;
  ~PlanSwap() {
    if (swap_) swap_();
  }

 private:
  std::function<void()> swap_;
};

}  // namespace refit
