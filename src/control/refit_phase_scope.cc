// The phase machine's partial-refit rules (refit_phases.h, PhaseOptions::
// only; refit/partial.h):
//
//   what a refit moves: scheduled, `only` from `only_from` on; on demand,
//     the globs every trainer rank's request names (ranks that ask for
//     different globs end the job, naming both lists);
//   whole engines first: a partial refit leaves the tensors outside its
//     globs as they are, so it runs only while every live engine holds a
//     committed version's every byte; the first refit, and the next one after
//     a recovery in which an engine rank said its weights are incomplete, run
//     full, with a note;
//   one plan per stream: before go, every rank's ready carries the digest of
//     the plan it moves the refit by; the trainer rank feeding engine rank r
//     and every engine's rank r must agree, else the refit fails (aborted and
//     recovered from), naming both ranks and both digests.
#include <map>

#include "control/refit_phases.h"

namespace refit {

namespace {

std::string list(const std::vector<std::string>& globs) {
  if (globs.empty()) return "every tensor";
  std::string out = "[";
  for (const std::string& g : globs) out += (out.size() > 1 ? ", " : "") + g;
  return out + "]";
}

}  // namespace

std::vector<std::string> RefitPhases::scope_of(std::uint64_t version, const std::vector<std::string>& asked) {
  std::vector<std::string> only = asked;
  if (options_.refits != 0) only = version >= options_.only_from ? options_.only : std::vector<std::string>();
  if (only.empty() || engines_whole_) return only;
  out_.push_back(Note{"refit " + std::to_string(version) + " moves every tensor, not only " + list(only) + ": " +
                      (decided_ == 0 ? "the engines hold no committed version yet"
                                     : "an engine's weights are incomplete after a failed refit")});
  return {};
}

bool RefitPhases::asks_agree(const std::vector<std::string>& first, const Request& request, int member) {
  if (!request.only.empty() && !options_.partial_refused.empty()) {
    end(FailedPrecondition(member_name(member) + " asks for a partial refit " + std::to_string(request.version) +
                           " (" + list(request.only) + "): " + options_.partial_refused));
    return false;
  }
  if (!request.only.empty() && options_.max_engines > options_.engines) {
    end(FailedPrecondition(member_name(member) + " asks for a partial refit " + std::to_string(request.version) +
                           " (" + list(request.only) + ") in a job that engines may join (--max-engines): a " +
                           "joiner's catch-up cannot tell which version each tensor holds; not built yet"));
    return false;
  }
  if (request.only == first) return true;
  end(InvalidArgument("the trainer ranks ask for different tensors of refit " + std::to_string(request.version) +
                      ": " + list(first) + " and " + list(request.only) + " (" + member_name(member) + ")"));
  return false;
}

bool RefitPhases::plans_agree(PhaseTime now) {
  const int ranks = std::max(ranks_per_engine(), 1);
  std::map<int, int> first;  // engine rank r -> the first member whose plan is r's stream's
  for (int i = 0; i < static_cast<int>(members_.size()); ++i) {
    const std::string& digest = members_[static_cast<std::size_t>(i)].plan_digest;
    if (dropped(i) || digest.empty()) continue;  // a sharded trainer rank plans no stream of its own
    const int stream = is_trainer(i) ? i % ranks : (i - options_.trainer_ranks) % ranks;
    auto [at, inserted] = first.emplace(stream, i);
    const std::string& theirs = members_[static_cast<std::size_t>(at->second)].plan_digest;
    if (inserted || theirs == digest) continue;
    fail(FailedPrecondition("refit " + std::to_string(version_) + " (" + list(only_) + "): " +
                            member_name(at->second) + " planned " + theirs + " for engine rank " +
                            std::to_string(stream) + "'s stream, " + member_name(i) + " planned " + digest),
         now);
    return false;
  }
  return true;
}

void RefitPhases::note_engines_whole() {
  for (int e = 0; e < options_.engine_ranks; ++e) {
    const int member = options_.trainer_ranks + e;
    const std::optional<Linked>& linked = members_[static_cast<std::size_t>(member)].linked;
    if (!dropped(member) && linked && linked->weights_complete == false) engines_whole_ = false;
  }
}

}  // namespace refit
