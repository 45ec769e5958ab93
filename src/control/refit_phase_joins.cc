// The phase machine's rules for engines joining a running job (refit_
// phases.h, PhaseOptions::max_engines). Every rank of a new engine joined
// and the shell checked them (EngineJoined): at the next refit boundary
// (idle, or after a commit, before the next start)
//
//   admit: AdmitEngine (the shell sends its ranks their Setup), the other
//     live engine ranks relink (recovery, no abort; the parent links its
//     relay to the joiner) --linked x every live engine rank, the joiner's
//     included-->
//   catch-up, v = the last committed version (none yet: it is live at once):
//     catch_up(v, k) to the parent's ranks, start(v) to the joiner's
//     --ready x joiner--> go(v) to the joiner --sent x parent, done x
//     joiner--> commit(v) to the joiner --committed x joiner--> RecordJoin:
//     it is live, and the job goes on (the next refit, or idle).
//
// The trainer ranks take no part: their requests wait. A joining engine
// counts for nothing until it is live. Any failure, loss or missed deadline
// of its ranks, or of the parent's, refuses the joiner alone (DropEngine
// names why; the engines relink without it); the parent lost is dropped as
// any engine (refit_phase_engines.cc).
#include <algorithm>

#include "control/refit_phases.h"
#include "control/relay_topology.h"
#include "refit/format.h"

namespace refit {

void RefitPhases::on_engine_joined(int engine, PhaseTime now) {
  if (engine < options_.engines || engine >= engine_slots() || !dropped(engine_members(engine).front()) ||
      engine == joining_ || std::find(pending_joins_.begin(), pending_joins_.end(), engine) != pending_joins_.end()) {
    return end(Internal("engine " + std::to_string(engine) + " joined, but its slot is not free"));
  }
  pending_joins_.push_back(engine);
  if (phase_ == Phase::kIdle) begin_catch_up(now);
}

// Admits the first pending engine: its Setup, then every live engine rank
// links again (the joiner's from its Setup).
void RefitPhases::begin_catch_up(PhaseTime now) {
  joining_ = pending_joins_.front();
  pending_joins_.erase(pending_joins_.begin());
  engine_dropped_[static_cast<std::size_t>(joining_)] = false;
  for (int i : engine_members(joining_)) {
    members_[static_cast<std::size_t>(i)] = Member{};
    heard_[static_cast<std::size_t>(i)] = options_.heartbeats ? now : PhaseTime::max();
  }
  out_.push_back(AdmitEngine{static_cast<std::uint64_t>(joining_), decided_});
  out_.push_back(Note{"engine " + std::to_string(joining_) + " joins the job; it first receives refit " +
                      std::to_string(decided_) + " from a live engine"});
  reroute_engines(now, Aborted("engine " + std::to_string(joining_) + " joins the job").message());
}

// Every live engine rank linked with the joiner: it catches up to the last
// committed version, sent by its parent in the tree of the live engines.
void RefitPhases::start_catch_up(PhaseTime now) {
  std::vector<bool> live;
  for (bool d : engine_dropped_) live.push_back(!d);
  parent_ = static_cast<int>(live_relay_parent(live, static_cast<std::uint64_t>(joining_),
                                               static_cast<std::uint64_t>(std::max(options_.relay_fanout, 1))));
  held_version_ = version_;
  if (decided_ == 0) {  // nothing committed yet: the next refit brings it every byte
    out_.push_back(RecordJoin{static_cast<std::uint64_t>(joining_), 0, static_cast<std::uint64_t>(parent_), true, {}});
    end_catch_up();
    return next_refit(now);
  }
  version_ = decided_;
  for (int i : engine_members(joining_)) members_[static_cast<std::size_t>(i)].step = Step::kNone;
  for (int i : engine_members(parent_)) members_[static_cast<std::size_t>(i)].step = Step::kNone;
  SendAll feed{CatchUp{version_, static_cast<std::uint64_t>(joining_)}, Audience::kEngines, engine_members(parent_)};
  SendAll start{Start{version_, 0}, Audience::kEngines, engine_members(joining_)};
  out_.emplace_back(std::move(feed));
  out_.emplace_back(std::move(start));
  deadline_ = now + std::chrono::duration_cast<PhaseClock::duration>(
                        std::chrono::duration<double>(options_.refit_timeout_s));
  enter(Phase::kCatchUp, Step::kReady);
}

// A message of an engine rank during catch-up: the joiner's ready, sent,
// done and committed in order; the parent's sent; a failed from either
// refuses the joiner. Anything else is a protocol error.
void RefitPhases::on_catch_up(int member, const RankMessage& message, PhaseTime now) {
  Member& m = members_[static_cast<std::size_t>(member)];
  const int k = engine_of(member);
  if (const auto* failed = std::get_if<Failed>(&message); failed != nullptr && (k == joining_ || k == parent_)) {
    return refuse_joiner(member_name(member) + " failed during " + phase_name() + ": " + failed->error.message(), now);
  }
  const bool joiner = k == joining_;
  Step step = Step::kNone, before = Step::kNone;
  std::uint64_t version = 0;
  if (const auto* r = std::get_if<Ready>(&message); r != nullptr && joiner) {
    step = Step::kReady, before = Step::kNone, version = r->version;
  } else if (const auto* s = std::get_if<Sent>(&message); s != nullptr && (joiner || k == parent_)) {
    step = Step::kSent, before = joiner ? Step::kReady : Step::kNone, version = s->version;
  } else if (const auto* d = std::get_if<Done>(&message); d != nullptr && joiner) {
    step = Step::kDone, before = Step::kSent, version = d->version;
    m.done = *d;
  } else if (const auto* c = std::get_if<Committed>(&message); c != nullptr && joiner) {
    step = Step::kCommitted, before = Step::kDone, version = c->version;
  }
  const bool after_go = step != Step::kSent || !joiner || awaited_ != Step::kReady;
  const bool after_commit = step != Step::kCommitted || awaited_ == Step::kCommitted;
  if (step == Step::kNone || m.step != before || version != version_ || !after_go || !after_commit) {
    return end(InvalidArgument("protocol error: " + member_name(member) + " sent '" + message_name(message) +
                               "' during " + phase_name()));
  }
  // The parent's sent is all it owes: it counts as through.
  m.step = joiner ? step : Step::kCommitted;
}

// Member `i` is still awaited at `step`: a joiner's rank short of it; from
// done on, also a parent's rank that has not said sent.
bool RefitPhases::catch_up_awaits(int i, Step step) const {
  const Step at = members_[static_cast<std::size_t>(i)].step;
  if (engine_of(i) == joining_) return at < step;
  return engine_of(i) == parent_ && step >= Step::kDone && at < Step::kCommitted;
}

bool RefitPhases::catch_up_reached(Step step) const {
  for (int i = 0; i < static_cast<int>(members_.size()); ++i) {
    if (catch_up_awaits(i, step)) return false;
  }
  return true;
}

void RefitPhases::advance_catch_up(PhaseTime now) {
  const std::vector<int> joiner = engine_members(joining_);
  if (awaited_ == Step::kReady && catch_up_reached(Step::kReady)) {
    out_.push_back(SendAll{Go{version_}, Audience::kEngines, joiner});
    awaited_ = Step::kDone;
  }
  if (awaited_ == Step::kDone && catch_up_reached(Step::kDone)) {
    out_.push_back(SendAll{Commit{version_}, Audience::kEngines, joiner});
    awaited_ = Step::kCommitted;
  }
  if (awaited_ != Step::kCommitted || !catch_up_reached(Step::kCommitted)) return;
  RecordJoin record{static_cast<std::uint64_t>(joining_), version_, static_cast<std::uint64_t>(parent_), true, {}};
  for (int i : joiner) {
    const Done& done = members_[static_cast<std::size_t>(i)].done.value();
    record.verified = record.verified && done.verified;
    record.done.push_back(done);
  }
  out_.push_back(Note{"engine " + std::to_string(joining_) + " caught up to refit " + std::to_string(version_) +
                      " from engine " + std::to_string(parent_) + (record.verified ? ", verified" : "") +
                      "; it is live"});
  out_.push_back(std::move(record));
  version_ = held_version_;
  end_catch_up();
  next_refit(now);
}

// An engine rank lost while a joiner is admitted or catches up: the joiner
// is refused; any other engine is dropped as always (and the tree rerouted
// once, without the joiner).
void RefitPhases::catch_up_lost(int member, const std::string& why, PhaseTime now) {
  const int k = engine_of(member);
  if (k == joining_) return refuse_joiner("lost " + member_name(member) + ": " + why, now);
  const int joiner = joining_;
  refuse_joiner("lost " + member_name(member) + " during " + phase_name() + ": " + why, now, /*relink=*/false);
  phase_ = Phase::kIdle;  // between refits: drop_engines relinks the rest, once
  if (!drop_engines({k}, member_name(member), why, now)) {
    end(Aborted("lost " + member_name(member) + " while engine " + std::to_string(joiner) + " joined: " + why));
  }
}

// The joining engine is refused (`why`): dropped like a lost engine (the
// shell shuts its ranks down and reports it), and (`relink`) the live
// engines relink without it. The job goes on at its committed version.
void RefitPhases::refuse_joiner(const std::string& why, PhaseTime now, bool relink) {
  const int k = joining_;
  refused_ = {parent_, version_};  // the parent may still report its catch-up failed
  const Status cause = Aborted("engine " + std::to_string(k) + " could not join: " + why);
  engine_dropped_[static_cast<std::size_t>(k)] = true;
  for (int i : engine_members(k)) heard_[static_cast<std::size_t>(i)] = PhaseTime::max();
  if (phase_ == Phase::kCatchUp) version_ = held_version_;
  out_.emplace_back(std::in_place_type<DropEngine>, DropEngine{static_cast<std::uint64_t>(k), decided_, cause, true});
  out_.push_back(Note{cause.message()});
  end_catch_up();
  if (relink) reroute_engines(now, cause.message());
}

void RefitPhases::end_catch_up() {
  joining_ = -1;
  parent_ = -1;
}

std::string RefitPhases::catch_up_waiting_for() const {
  std::string names;
  for (int i = 0; i < static_cast<int>(members_.size()); ++i) {
    if (!catch_up_awaits(i, awaited_)) continue;
    const bool parent = engine_of(i) == parent_;
    names += (names.empty() ? "" : ", ") + member_name(i) + (parent ? " ('sent')" : " ('" + awaited_name() + "')");
  }
  return names;
}

}  // namespace refit
