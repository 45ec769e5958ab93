// Partial refits' scope and selection: see refit/partial.h (the subset
// plan is in plan.cc, beside make_plan, whose layout it shares).
#include "refit/partial.h"

#include <algorithm>

#include "refit/checkpoint.h"

namespace refit {

StatusOr<RefitScope> canonical_scope(std::vector<std::string> globs) {
  for (std::size_t i = 0; i < globs.size(); ++i) {
    if (globs[i].empty()) return InvalidArgument("partial refit: glob " + std::to_string(i) + " is empty");
  }
  std::sort(globs.begin(), globs.end());
  globs.erase(std::unique(globs.begin(), globs.end()), globs.end());
  return RefitScope{std::move(globs)};
}

StatusOr<std::vector<bool>> select_tensors(const RefitScope& scope, const std::vector<TensorSpec>& specs) {
  std::vector<bool> selected(specs.size(), scope.full());
  for (const std::string& glob : scope.only) {
    bool any = false;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (!glob_match(glob, specs[i].name)) continue;
      selected[i] = true;
      any = true;
    }
    if (!any) {
      return InvalidArgument("partial refit: glob '" + glob + "' selects none of the stream's " +
                             std::to_string(specs.size()) + " tensors");
    }
  }
  return selected;
}

}  // namespace refit
