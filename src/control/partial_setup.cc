// The coordinator's check of partial refits at setup: see partial_setup.h.
#include "control/partial_setup.h"

#include "refit/partial.h"

namespace refit {

Status check_partial_refits(const std::vector<std::string>& only, const Join& trainer, const Join& engine,
                            bool joins_possible) {
  if (only.empty()) return Status::Ok();
  const std::string what = "--only (partial refits)";
  // Each refusal: a setting whose partial refit is not built yet, and why.
  if (trainer.layout != "full") {
    return FailedPrecondition(what + " with sharded trainers (--trainer-layout " + trainer.layout +
                              "): their bucket parts follow the full plan; not built yet");
  }
  if (engine.delta) return FailedPrecondition(what + " with --delta: the bases follow the full plan; not built yet");
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
