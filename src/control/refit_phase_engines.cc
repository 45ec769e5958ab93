// The phase machine's many-engine rules (refit_phases.h, PhaseOptions::
// min_engines): an engine rank lost, stalled past the heartbeat deadline or
// late past a refit's deadline drops its whole engine while at least
// min_engines stay. The root (the lowest live engine, which the trainer
// ranks feed) is dropped like any other: the trainer ranks relink too, to
// the next live engine.
//
//   in a refit (prepare, transfer, verify): abort(v) and relink every live
//     rank, the shell routing the relay around the dropped engine; a
//     scheduled job then runs v again on the others (an on-demand job goes
//     idle: the trainers' refit(v) failed and may be asked again);
//   between refits (idle, or commit once every live rank committed): relink
//     the engine ranks only (and the trainer ranks when the root moved),
//     with no abort;
//   fewer than min_engines left: the job ends, naming the lost rank and the
//     count.
#include <algorithm>

#include "control/refit_phases.h"
#include "refit/format.h"

namespace refit {

int RefitPhases::engine_of(int member) const {
  if (is_trainer(member)) return -1;
  return (member - options_.trainer_ranks) / std::max(ranks_per_engine(), 1);
}

std::vector<int> RefitPhases::engine_members(int engine) const {
  std::vector<int> out;
  const int ranks = ranks_per_engine();
  for (int r = 0; r < ranks; ++r) out.push_back(options_.trainer_ranks + engine * ranks + r);
  return out;
}

// Dropped, or a slot no engine joined (yet).
bool RefitPhases::dropped(int member) const {
  const int k = engine_of(member);
  return k >= 0 && static_cast<std::size_t>(k) < engine_dropped_.size() && engine_dropped_[static_cast<std::size_t>(k)];
}

int RefitPhases::root() const {
  for (std::size_t k = 0; k < engine_dropped_.size(); ++k) {
    if (!engine_dropped_[k]) return static_cast<int>(k);
  }
  return -1;
}

int RefitPhases::live_engines() const {
  return static_cast<int>(std::count(engine_dropped_.begin(), engine_dropped_.end(), false));
}

// Drops `engines` (lost `who`: `why`) when the job allows it; true when the
// event is handled (dropped, or the job ended for too few engines).
bool RefitPhases::drop_engines(const std::vector<int>& engines, const std::string& who, const std::string& why,
                               PhaseTime now) {
  // Without joiners, --min-engines equal to --engines drops nothing (a loss ends the job as with one engine).
  if (options_.min_engines <= 0 || (engine_slots() == options_.engines && options_.min_engines >= options_.engines)) {
    return false;
  }
  const Phase phase = phase_ == Phase::kBlame ? blamed_phase_ : phase_;
  const bool in_refit = phase == Phase::kPrepare || phase == Phase::kTransfer || phase == Phase::kVerify;
  if (!in_refit && phase != Phase::kIdle && phase != Phase::kCommit) return false;
  const bool root_lost = std::find(engines.begin(), engines.end(), root()) != engines.end();
  phase_ = phase;  // a failure awaiting blame is explained by the loss
  const int left = live_engines() - static_cast<int>(engines.size());
  if (left < options_.min_engines) {
    end(Aborted("lost " + who + " during " + phase_name() + ": " + why + "; " + std::to_string(left) + " of " +
                format_count(options_.engines, "engine") + " would be left, fewer than --min-engines " +
                std::to_string(options_.min_engines)));
    return true;
  }
  const Status cause = Aborted("lost " + who + " during " + phase_name() + ": " + why);
  for (int k : engines) {
    engine_dropped_[static_cast<std::size_t>(k)] = true;
    out_.emplace_back(std::in_place_type<DropEngine>, DropEngine{static_cast<std::uint64_t>(k), version_, cause});
  }
  for (int i = 0; i < static_cast<int>(members_.size()); ++i) {
    if (dropped(i)) heard_[static_cast<std::size_t>(i)] = PhaseTime::max();
  }
  out_.push_back(Note{"dropped engine " + std::to_string(engines.front()) + " (" + cause.message() + "); " +
                      format_count(left, "engine") + " go on"});
  if (phase == Phase::kCommit) {
    reroute_pending_ = true;  // once every live rank committed (advance)
    reroute_trainers_ = reroute_trainers_ || root_lost;
  } else if (phase == Phase::kIdle) {
    reroute_engines(now, "an engine was dropped", root_lost);
  } else {
    const Status restart = Aborted(cause.message() + "; engine " + std::to_string(engines.front()) +
                                   " was dropped and refit " + std::to_string(version_) +
                                   (options_.refits != 0 ? " runs again on the others" : " is aborted"));
    out_.push_back(SendAll{Abort{version_, restart}});
    out_.push_back(SendAll{Relink{version_, std::nullopt}});
    for (Member& m : members_) m = Member{};
    recovering_ = restart;
    failure_recovery_ = false;
    retry_ = options_.refits != 0;
    deadline_ = now + std::chrono::duration_cast<PhaseClock::duration>(
                          std::chrono::duration<double>(options_.setup_timeout_s));
    enter(Phase::kRecovery, Step::kLinked);
  }
  return true;
}

// A refit's deadline passed while only engine ranks were still awaited:
// their engines are dropped when the job allows it.
bool RefitPhases::drop_late_engines(PhaseTime now) {
  if (phase_ != Phase::kPrepare && phase_ != Phase::kTransfer && phase_ != Phase::kVerify) return false;
  std::vector<int> late;
  for (int i = 0; i < static_cast<int>(members_.size()); ++i) {
    if (!awaits(i)) continue;
    if (is_trainer(i)) return false;
    if (std::find(late.begin(), late.end(), engine_of(i)) == late.end()) late.push_back(engine_of(i));
  }
  if (late.empty()) return false;
  return drop_engines(late, waiting_for(), "it missed the refit's deadline (--timeout) waiting for '" +
                                               awaited_name() + "'", now);
}

// Between refits: the live engine ranks link again around the dropped
// engine, or with the joining one (the shell gives each its new route; the
// joining engine's ranks link from their Setup); the trainer ranks wait.
void RefitPhases::reroute_engines(PhaseTime now, const std::string& why, bool with_trainers) {
  reroute_pending_ = false;
  reroute_trainers_ = false;
  SendAll relink{Relink{version_, std::nullopt}, Audience::kEveryRank, {}};
  for (int i = 0; i < static_cast<int>(members_.size()); ++i) {
    Member& m = members_[static_cast<std::size_t>(i)];
    const bool relinks = is_trainer(i) ? with_trainers : !dropped(i) && engine_of(i) != joining_;
    m.step = is_trainer(i) && !with_trainers ? Step::kLinked : Step::kNone;  // a trainer's request is kept
    m.linked.reset();
    if (relinks) relink.members.push_back(i);
  }
  out_.emplace_back(std::move(relink));
  rerouting_ = true;
  recovering_ = Aborted(why);
  failure_recovery_ = false;
  retry_ = false;
  deadline_ = now + std::chrono::duration_cast<PhaseClock::duration>(
                        std::chrono::duration<double>(options_.setup_timeout_s));
  enter(Phase::kRecovery, Step::kLinked);
}

// Every live rank linked again: after a failure the engines' state is
// recorded; the refit dropped mid-flight runs again, or the job goes on.
void RefitPhases::finish_recovery(PhaseTime now) {
  if (failure_recovery_) {
    RecordRecovery recovered{version_, {}};
    for (int e = 0; e < options_.engine_ranks; ++e) {
      recovered.engines.push_back(
          members_[static_cast<std::size_t>(options_.trainer_ranks + e)].linked.value_or(Linked{}));
    }
    out_.emplace_back(std::in_place_type<RecordRecovery>, std::move(recovered));
  }
  note_engines_whole();
  failure_recovery_ = false;
  rerouting_ = false;
  if (joining_ >= 0) return start_catch_up(now);
  if (retry_) {
    retry_ = false;
    only_ = scope_of(version_, only_);  // the whole-engine rule again: the dropped refit may have left them torn
    return begin_refit(version_, now);
  }
  next_refit(now);
}

}  // namespace refit
