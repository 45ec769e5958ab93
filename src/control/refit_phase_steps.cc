// The phase machine's helpers (refit_phases.h): what each phase awaits,
// how members and phases are named in its errors, when it wants a tick.
#include <algorithm>

#include "control/refit_phases.h"

namespace refit {

// Out of line: GCC 12 inlining a SendAll into the action vector's push
// warns (maybe-uninitialized) about the variant's other alternatives.
void RefitPhases::send_to(CoordinatorMessage message, Audience audience) {
  SendAll send;
  send.message = std::move(message);
  send.audience = audience;
  out_.emplace_back(std::move(send));
}

void RefitPhases::enter(Phase phase, Step awaited) {
  phase_ = phase;
  awaited_ = awaited;
}

// Dropped engines' ranks (many engines) are awaited no more.
bool RefitPhases::all_reached(Step step) const {
  for (int i = 0; i < static_cast<int>(members_.size()); ++i) {
    if (members_[static_cast<std::size_t>(i)].step < step && !dropped(i)) return false;
  }
  return true;
}

bool RefitPhases::all_trainers_reached(Step step) const {
  return std::all_of(members_.begin(), members_.begin() + options_.trainer_ranks,
                     [&](const Member& m) { return m.step >= step; });
}

// The furthest step `member` may report in the current phase: what the
// coordinator has asked of it so far.
RefitPhases::Step RefitPhases::furthest_step(int member) const {
  switch (phase_) {
    case Phase::kSetup:
    case Phase::kRecovery: return Step::kLinked;
    case Phase::kPrepare: return Step::kReady;
    case Phase::kTransfer:
    case Phase::kVerify: return Step::kDone;
    case Phase::kCommit: return Step::kCommitted;
    // Trainers release first; the engines once asked.
    case Phase::kRelease: return is_trainer(member) || second_stage_ ? Step::kReleased : Step::kCommitted;
    // Engines acquire; every rank links once the trainers have the descriptors.
    case Phase::kAcquire: return second_stage_ ? Step::kLinked : Step::kAcquired;
    case Phase::kCatchUp: return Step::kCommitted;  // on_catch_up checks its own order
    case Phase::kIdle:
    case Phase::kBlame:
    case Phase::kEnded: break;
  }
  return Step::kNone;
}

// Whether the current phase waits for `member` (before it reached the
// awaited step): in release's first stage only the trainers.
bool RefitPhases::awaits(int member) const {
  if (members_[static_cast<std::size_t>(member)].step >= awaited_ || dropped(member)) return false;
  return !(phase_ == Phase::kRelease && !second_stage_ && !is_trainer(member));
}

PhaseTime RefitPhases::phase_deadline() const { return phase_ == Phase::kBlame ? blame_until_ : deadline_; }

PhaseTime RefitPhases::wake_at() const {
  if (phase_ == Phase::kEnded) return PhaseTime::max();
  PhaseTime at = std::min(phase_deadline(), next_beat_);
  if (options_.heartbeats) {
    for (PhaseTime heard : heard_) {
      if (heard != PhaseTime::max()) at = std::min(at, heard + options_.heartbeats->timeout);
    }
  }
  return at;
}

std::string RefitPhases::member_name(int member) const {
  if (is_trainer(member)) return "trainer rank " + std::to_string(member);
  const int g = member - options_.trainer_ranks;
  if (engine_slots() <= 1) return "engine rank " + std::to_string(g);
  const int ranks = ranks_per_engine();
  return "engine " + std::to_string(g / ranks) + " rank " + std::to_string(g % ranks);
}

std::string RefitPhases::waiting_for() const {
  std::string names;
  for (int i = 0; i < static_cast<int>(members_.size()); ++i) {
    if (!awaits(i)) continue;
    names += (names.empty() ? "" : ", ") + member_name(i);
  }
  return names;
}

std::string RefitPhases::phase_name() const {
  const Phase phase = phase_ == Phase::kBlame ? blamed_phase_ : phase_;
  const char* step = "";
  switch (phase) {
    case Phase::kSetup: return "setup";
    case Phase::kIdle: step = "request"; break;
    case Phase::kPrepare: step = "prepare"; break;
    case Phase::kTransfer: step = "transfer"; break;
    case Phase::kVerify: step = "verify"; break;
    case Phase::kCommit: step = "commit"; break;
    case Phase::kRelease: step = "release"; break;
    case Phase::kAcquire: step = "acquire"; break;
    case Phase::kRecovery: step = "recovery"; break;
    case Phase::kCatchUp:
      return "catch-up of engine " + std::to_string(joining_) + " to refit " + std::to_string(version_);
    case Phase::kBlame:
    case Phase::kEnded: step = "ended"; break;
  }
  return "refit " + std::to_string(version_) + " (" + step + ")";
}

std::string RefitPhases::awaited_name() const {
  switch (awaited_) {
    case Step::kNone: return "request";
    case Step::kAcquired: return "acquired";
    case Step::kLinked: return "linked";
    case Step::kReady: return "ready";
    case Step::kSent: return "sent";
    case Step::kDone: return "done";
    case Step::kCommitted: return "committed";
    case Step::kReleased: return "released";
  }
  return "?";
}

}  // namespace refit
