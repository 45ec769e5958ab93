// The coordinator's check of partial refits at setup: see partial_setup.h.
#include "control/partial_setup.h"

#include "refit/partial.h"

namespace refit {

std::string engine_without_partial(const std::vector<Join>& engines) {
  for (const Join& j : engines) {
    if (j.partial) continue;
    const std::string rank = (j.engine != 0 ? "engine " + std::to_string(j.engine) + " rank " : "engine rank ") +
                             std::to_string(j.rank);
    return rank + "'s engine does not take partial refits (Engine::begin_partial)";
  }
  return "";
}

Status check_partial_refits(const std::vector<std::string>& only, const Join& trainer,
                            const std::vector<Join>& engines, bool joins_possible) {
  if (only.empty()) return Status::Ok();
  const std::string what = "--only (partial refits)";
  const Join& engine = engines.at(0);
  if (const std::string without = engine_without_partial(engines); !without.empty()) {
    return FailedPrecondition(what + ": " + without);
  }
  // Each refusal: a setting whose partial refit is not built yet, and why.
  if (trainer.layout != "full") {
    return FailedPrecondition(what + " with sharded trainers (--trainer-layout " + trainer.layout +
                              "): their bucket parts follow the full plan; not built yet");
  }
  if (engine.quantize != "none") {
    return FailedPrecondition(what + " with --quantize " + engine.quantize + ": not built yet");
  }
  if (joins_possible) {
    return FailedPrecondition(what + " in a job that engines may join (--max-engines): a joiner's catch-up cannot "
                                     "tell which version each tensor holds; not built yet");
  }
  ASSIGN_OR_RETURN(const std::vector<bool> selected, select_tensors(RefitScope{only}, engine.specs));
  (void)selected;  // every glob selects a tensor (select_tensors names the one that does not)
  return Status::Ok();
}

}  // namespace refit
