// The actions a RefitPhases machine returned so far (control/refit_phases.h),
// for the phase machine's tests: every action in order, those of one type,
// the last message of one type sent to the ranks.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "control/refit_phases.h"

namespace refit::testing {

class PhaseActions {
 public:
  void take(std::vector<PhaseAction> actions) {
    for (auto& a : actions) actions_.push_back(std::move(a));
  }
  void clear() { actions_.clear(); }
  const std::vector<PhaseAction>& all() const { return actions_; }

  // Every action of type T, in order.
  template <class T>
  std::vector<T> of() const {
    std::vector<T> out;
    for (const PhaseAction& a : actions_) {
      if (const auto* x = std::get_if<T>(&a)) out.push_back(*x);
    }
    return out;
  }
  // The last message of type T sent to the ranks.
  template <class T>
  std::optional<T> last_sent() const {
    std::optional<T> out;
    for (const PhaseAction& a : actions_) {
      if (const auto* s = std::get_if<SendAll>(&a); s && std::holds_alternative<T>(s->message)) {
        out = std::get<T>(s->message);
      }
    }
    return out;
  }
  // The job's end, once it ended.
  std::optional<Status> ended() const {
    auto ends = of<EndJob>();
    return ends.empty() ? std::nullopt : std::optional<Status>(ends.back().status);
  }

 private:
  std::vector<PhaseAction> actions_;
};

}  // namespace refit::testing
