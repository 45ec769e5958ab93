// Release between refits (refit_phases.h, PhaseOptions::
// release_between_refits): after every rank committed, the trainers free
// their mappings and staging, then the engines their receive pools (the
// engines only after the trainers, so that no mapping keeps a freed pool
// alive); before the next start the engines allocate again and the trainers
// open the new pools. Nothing of the next refit has begun in either phase,
// so a failure there ends the job keeping the committed version.
#include <cstdint>
#include <string>
#include <vector>

#include "control/refit_phases.h"

namespace refit {

namespace {

PhaseTime after(PhaseTime now, double seconds) {
  return now + std::chrono::duration_cast<PhaseClock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

void RefitPhases::begin_release(PhaseTime now) {
  second_stage_ = false;
  deadline_ = after(now, options_.setup_timeout_s);
  send_to(Release{version_}, Audience::kTrainers);
  enter(Phase::kRelease, Step::kReleased);
}

void RefitPhases::advance_release(PhaseTime now) {
  if (!second_stage_ && all_trainers_reached(Step::kReleased)) {
    second_stage_ = true;
    send_to(Release{version_}, Audience::kEngines);
  }
  if (!all_reached(Step::kReleased)) return;
  RecordRelease record{version_, {}, {}};
  for (int i = 0; i < static_cast<int>(members_.size()); ++i) {
    const std::uint64_t bytes = members_[static_cast<std::size_t>(i)].released_bytes;
    (is_trainer(i) ? record.trainer_bytes : record.engine_bytes).push_back(bytes);
  }
  out_.emplace_back(std::in_place_type<RecordRelease>, std::move(record));
  released_ = true;
  next_refit(now);
}

// Refit `version` is asked for while the ranks hold nothing: the engines
// acquire first. version_ names it in errors; it is not in flight.
void RefitPhases::begin_acquire(std::uint64_t version, PhaseTime now) {
  version_ = version;
  in_flight_ = false;
  second_stage_ = false;
  for (int i = 0; i < static_cast<int>(members_.size()); ++i) {
    // Trainers acquire nothing of their own: they wait for the descriptors.
    members_[static_cast<std::size_t>(i)] = Member{};
    if (is_trainer(i)) members_[static_cast<std::size_t>(i)].step = Step::kAcquired;
  }
  deadline_ = after(now, options_.setup_timeout_s);
  send_to(Acquire{version, {}}, Audience::kEngines);
  enter(Phase::kAcquire, Step::kAcquired);
}

void RefitPhases::advance_acquire(PhaseTime now) {
  if (!second_stage_ && all_reached(Step::kAcquired)) {
    second_stage_ = true;
    Acquire targets{version_, {}};
    for (int e = 0; e < options_.engine_ranks; ++e) {
      targets.descriptors.push_back(members_[static_cast<std::size_t>(options_.trainer_ranks + e)].descriptor);
    }
    send_to(std::move(targets), Audience::kTrainers);
    enter(Phase::kAcquire, Step::kLinked);
  }
  if (!second_stage_ || !all_reached(Step::kLinked)) return;
  released_ = false;
  start_refit(version_, now);
}

}  // namespace refit
