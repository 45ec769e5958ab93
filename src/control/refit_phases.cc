// The coordinator's phase machine (refit_phases.h). One transition function,
// on(); advance() below it moves through the phases whose condition holds.
#include "control/refit_phases.h"

#include <algorithm>
#include <cstdio>

#include "refit/format.h"

namespace refit {

RefitPhases::RefitPhases(const PhaseOptions& options)
    : options_(options), members_(static_cast<std::size_t>(options.trainer_ranks + options.engine_ranks)) {
  // Engine slots past the engines of the setup are empty until one joins.
  for (int k = 0; k < engine_slots(); ++k) engine_dropped_.push_back(k >= options_.engines);
}

std::vector<PhaseAction> RefitPhases::start(PhaseTime now) {
  return start(now, now + std::chrono::duration_cast<PhaseClock::duration>(
                              std::chrono::duration<double>(options_.setup_timeout_s)));
}

std::vector<PhaseAction> RefitPhases::start(PhaseTime now, PhaseTime linked_by) {
  enter(Phase::kSetup, Step::kLinked);
  deadline_ = linked_by;
  // Every rank has its Setup: from now on each one heartbeats.
  heard_.assign(members_.size(), options_.heartbeats ? now : PhaseTime::max());
  for (std::size_t i = 0; i < heard_.size(); ++i) {
    if (dropped(static_cast<int>(i))) heard_[i] = PhaseTime::max();  // an empty engine slot
  }
  if (options_.heartbeats) next_beat_ = now;
  out_.clear();
  beat(now);
  return std::move(out_);
}

// ---- the transition function -----------------------------------------------------

std::vector<PhaseAction> RefitPhases::on(const PhaseEvent& event, PhaseTime now) {
  out_.clear();
  if (phase_ == Phase::kEnded) return {};
  if (stalled_itself(now)) return std::move(out_);
  const PhaseEvent* live_event = &event;  // what a dropped engine's rank still sends is dropped with it
  if (const auto* r = std::get_if<Received>(&event); r != nullptr && dropped(r->member)) live_event = nullptr;
  if (const auto* l = std::get_if<Lost>(&event); l != nullptr && dropped(l->member)) live_event = nullptr;
  if (live_event == nullptr) {
    advance(now);
    return std::move(out_);
  }
  if (const auto* received = std::get_if<Received>(&event)) {
    // Any message proves its sender alive.
    auto& heard = heard_[static_cast<std::size_t>(received->member)];
    if (heard != PhaseTime::max()) heard = std::max(heard, now);
    on_message(received->member, received->message, now);
  }
  if (const auto* lost = std::get_if<Lost>(&event)) {
    heard_[static_cast<std::size_t>(lost->member)] = PhaseTime::max();
    on_lost(lost->member, lost->why, now);
  }
  if (const auto* replaced = std::get_if<Replaced>(&event)) on_replaced(replaced->member, now);
  if (const auto* joined = std::get_if<EngineJoined>(&event)) on_engine_joined(joined->engine, now);
  if (phase_ != Phase::kEnded) check_silence(now);
  if (phase_ != Phase::kEnded && now >= phase_deadline()) on_deadline(now);
  advance(now);
  if (phase_ != Phase::kEnded) beat(now);
  return std::move(out_);
}

// Moves on while the current phase's condition holds: every rank reached
// the awaited step (or, on demand, every trainer rank asked).
void RefitPhases::advance(PhaseTime now) {
  for (;;) {
    const Phase before = phase_;
    switch (phase_) {
      case Phase::kSetup:
        if (all_reached(Step::kLinked)) next_refit(now);
        break;
      case Phase::kIdle:
        decide_idle(now);
        break;
      case Phase::kPrepare:
        if (all_reached(Step::kReady) && plans_agree(now)) {
          go_time_ = last_sent_ = now;
          out_.push_back(SendAll{Go{version_}});
          enter(Phase::kTransfer, Step::kSent);
        }
        break;
      case Phase::kTransfer:
        if (all_reached(Step::kSent)) {
          out_.push_back(ShowProgress{version_, 0, /*final=*/true});
          enter(Phase::kVerify, Step::kDone);
        }
        break;
      case Phase::kVerify:
        if (all_reached(Step::kDone)) decide_commit(now);
        break;
      case Phase::kCommit:
        if (!all_reached(Step::kCommitted)) break;
        if (reroute_pending_) {
          reroute_engines(now, "an engine was dropped", reroute_trainers_);
        } else if (options_.release_between_refits) {
          begin_release(now);
        } else {
          next_refit(now);
        }
        break;
      case Phase::kRelease:
        advance_release(now);
        break;
      case Phase::kAcquire:
        advance_acquire(now);
        break;
      case Phase::kRecovery:
        if (all_reached(Step::kLinked)) finish_recovery(now);
        break;
      case Phase::kCatchUp:
        advance_catch_up(now);
        break;
      case Phase::kBlame:
      case Phase::kEnded:
        break;
    }
    if (phase_ == before) return;
  }
}

// ---- events ----------------------------------------------------------------------

void RefitPhases::on_message(int member, const RankMessage& message, PhaseTime now) {
  Member& m = members_[static_cast<std::size_t>(member)];
  if (std::holds_alternative<Heartbeat>(message)) return;  // on() noted it
  if (const auto* progress = std::get_if<Progress>(&message)) {
    if (phase_ != Phase::kTransfer) return;
    m.progress = progress->bytes;
    std::uint64_t bytes = 0;
    for (const Member& x : members_) bytes += x.progress;
    out_.push_back(ShowProgress{version_, bytes, false});
  } else if (phase_ == Phase::kCatchUp && !is_trainer(member) &&
             !std::holds_alternative<Request>(message) && !std::holds_alternative<Finish>(message)) {
    on_catch_up(member, message, now);
  } else if (const auto* failed = std::get_if<Failed>(&message)) {
    on_failed(member, *failed, now);
  } else if (const auto* share = std::get_if<AmaxShare>(&message)) {
    on_amax(member, *share, now);
  } else if (std::holds_alternative<Request>(message) || std::holds_alternative<Finish>(message)) {
    on_ask(member, message, now);
  } else if (std::holds_alternative<Linked>(message)) {
    on_report(member, Step::kLinked, message, now);
  } else if (std::holds_alternative<Ready>(message)) {
    on_report(member, Step::kReady, message, now);
  } else if (std::holds_alternative<Sent>(message)) {
    on_report(member, Step::kSent, message, now);
  } else if (std::holds_alternative<Done>(message)) {
    on_report(member, Step::kDone, message, now);
  } else if (std::holds_alternative<Committed>(message)) {
    on_report(member, Step::kCommitted, message, now);
  } else if (std::holds_alternative<Released>(message)) {
    on_report(member, Step::kReleased, message, now);
  } else if (std::holds_alternative<Acquired>(message)) {
    on_report(member, Step::kAcquired, message, now);
  } else {
    fail(InvalidArgument("protocol error: " + member_name(member) + " sent '" + message_name(message) + "' during " +
                         phase_name() + " (expected '" + awaited_name() + "')"),
         now);
  }
}

namespace {

std::uint64_t version_of(const RankMessage& message) {
  if (const auto* m = std::get_if<Ready>(&message)) return m->version;
  if (const auto* m = std::get_if<Sent>(&message)) return m->version;
  if (const auto* m = std::get_if<Done>(&message)) return m->version;
  if (const auto* m = std::get_if<Committed>(&message)) return m->version;
  if (const auto* m = std::get_if<Released>(&message)) return m->version;
  if (const auto* m = std::get_if<Acquired>(&message)) return m->version;
  return 0;
}

}  // namespace

// A rank reports that it reached `step`. Ranks move through the steps in
// order; one may run ahead of the phase (a trainer's done while engines
// still send), but none may skip a step, repeat one or report what the
// coordinator has not yet asked for.
void RefitPhases::on_report(int member, Step step, const RankMessage& message, PhaseTime now) {
  Member& m = members_[static_cast<std::size_t>(member)];
  // Recovery drops what the aborted refit still had in flight; a cause is
  // sought only in lost connections.
  if (phase_ == Phase::kBlame || (phase_ == Phase::kRecovery && step != Step::kLinked)) return;
  const std::string what = "'" + message_name(message) + "'";
  if (m.step == step) {
    return fail(InvalidArgument("protocol error: " + member_name(member) + " sent " + what + " twice during " +
                                phase_name()),
                now);
  }
  // Linked follows a (re)start of the links (after acquired in kAcquire),
  // ready and acquired a start: all from kNone.
  const Step before = step == Step::kLinked && phase_ == Phase::kAcquire ? Step::kAcquired
                      : step == Step::kLinked || step == Step::kReady   ? Step::kNone
                                                                        : static_cast<Step>(static_cast<int>(step) - 1);
  const bool in_order = m.step == before;
  // Linked only while linking; acquired only while the engines acquire.
  const bool linking = phase_ == Phase::kSetup || phase_ == Phase::kRecovery ||
                       (phase_ == Phase::kAcquire && second_stage_);
  const bool acquiring = phase_ == Phase::kAcquire && !second_stage_;
  if (!in_order || step > furthest_step(member) || (step == Step::kLinked) != linking ||
      (step == Step::kAcquired) != acquiring) {
    return fail(InvalidArgument("protocol error: " + member_name(member) + " sent " + what + " during " +
                                phase_name() + " (expected '" + awaited_name() + "')"),
                now);
  }
  if (step == Step::kCommitted && version_of(message) != version_) {
    return fail(Internal(member_name(member) + " committed version " + std::to_string(version_of(message)) +
                         ", expected " + std::to_string(version_)),
                now);
  }
  if (step != Step::kLinked && version_of(message) != version_) {
    return fail(InvalidArgument("protocol error: " + member_name(member) + " sent " + what + " of refit " +
                                std::to_string(version_of(message)) + " during " + phase_name()),
                now);
  }
  m.step = step;
  if (step == Step::kSent) last_sent_ = std::max(last_sent_, now);
  if (const auto* done = std::get_if<Done>(&message)) m.done = *done;
  if (const auto* ready = std::get_if<Ready>(&message)) m.plan_digest = ready->plan_digest;
  if (const auto* linked = std::get_if<Linked>(&message)) m.linked = *linked;
  if (const auto* released = std::get_if<Released>(&message)) m.released_bytes = released->bytes;
  if (const auto* acquired = std::get_if<Acquired>(&message)) m.descriptor = acquired->descriptor;
}

// A rank's own failure. It usually comes from a peer that died: the machine
// first looks for a lost connection to blame (kBlame) for a short grace.
void RefitPhases::on_failed(int member, const Failed& failed, PhaseTime now) {
  members_[static_cast<std::size_t>(member)].reported_failure = true;
  if (phase_ == Phase::kRecovery && refused_ == std::pair<int, std::uint64_t>{engine_of(member), failed.version}) {
    return;  // the refused joiner's parent reports its catch-up failed: already settled
  }
  if (phase_ == Phase::kRecovery && joining_ >= 0) {  // linking with a joining engine failed: it is refused
    return refuse_joiner(member_name(member) + " failed while the engines linked with it: " + failed.error.message(),
                         now);
  }
  if (phase_ == Phase::kRecovery && rerouting_) {  // an engine rank could not link around a dropped engine
    return end(Status(failed.error.code(), member_name(member) + " failed during " + phase_name() + ": " +
                                               failed.error.message()));
  }
  if (phase_ == Phase::kBlame || phase_ == Phase::kRecovery) return;
  blamed_ = Status(failed.error.code(),
                   member_name(member) + " failed during " + phase_name() + ": " + failed.error.message());
  blamed_phase_ = phase_;
  blame_until_ = now + options_.blame_grace;
  phase_ = Phase::kBlame;
}

void RefitPhases::on_lost(int member, const std::string& why, PhaseTime now) {
  const std::string who = member_name(member);
  if (phase_ == Phase::kCatchUp || (phase_ == Phase::kRecovery && joining_ >= 0)) {
    if (!is_trainer(member)) return catch_up_lost(member, why, now);
  }
  if (replace_lost_trainer(member, why, now)) return;
  if (!is_trainer(member) && drop_engines({engine_of(member)}, who, why, now)) return;
  if (phase_ == Phase::kBlame) {
    // A rank that reported its own failure and then exited is not the cause.
    Member& m = members_[static_cast<std::size_t>(member)];
    if (m.reported_failure) {
      m.gone = why;
      return;
    }
    phase_ = blamed_phase_;
    return end(Aborted("lost " + who + " during " + phase_name() + " (" + blamed_.message() + ")"));
  }
  if (phase_ == Phase::kRecovery) {
    return end(Status(recovering_.code(), recovering_.message() + "; recovery failed: lost " + who + " during " +
                                              phase_name() + ": " + why));
  }
  if (phase_ == Phase::kCommit || phase_ == Phase::kRelease) {
    return end(Aborted("lost " + who + " after refit " + std::to_string(version_) + " was committed (waiting for '" +
                       awaited_name() + "'): " + why));
  }
  end(Aborted("lost " + who + " during " + phase_name() + ": " + why));
}

// On demand, with trainer_replace_timeout_s: a trainer rank lost before the
// commit decision aborts the refit in flight (as a failure would) and
// recovery waits for a new process of that rank. False: not this case.
bool RefitPhases::replace_lost_trainer(int member, const std::string& why, PhaseTime now) {
  Member& m = members_[static_cast<std::size_t>(member)];
  const Phase phase = phase_ == Phase::kBlame ? blamed_phase_ : phase_;
  const bool before_decision = phase == Phase::kPrepare || phase == Phase::kTransfer || phase == Phase::kVerify;
  if (options_.refits != 0 || options_.trainer_replace_timeout_s <= 0 || !is_trainer(member) || !in_flight_ ||
      !before_decision || (phase_ == Phase::kBlame && m.reported_failure)) {
    return false;
  }
  phase_ = phase;
  fail(Aborted("lost " + member_name(member) + " during " + phase_name() + ": " + why), now);
  if (phase_ != Phase::kRecovery) return true;  // fail() ended the job (another rank is gone)
  members_[static_cast<std::size_t>(member)].replacing = true;
  deadline_ = now + std::chrono::duration_cast<PhaseClock::duration>(
                        std::chrono::duration<double>(options_.trainer_replace_timeout_s));
  out_.push_back(Note{"waiting up to " + format_seconds(options_.trainer_replace_timeout_s) + " for a replacement " +
                      member_name(member) + " (start it again with the same rank)"});
  return true;
}

void RefitPhases::on_replaced(int member, PhaseTime now) {
  Member& m = members_[static_cast<std::size_t>(member)];
  if (!awaits_replacement(member)) return end(Internal("a replacement for " + member_name(member) + " nobody awaited"));
  m.replacing = false;
  heard_[static_cast<std::size_t>(member)] = options_.heartbeats ? now : PhaseTime::max();
  out_.push_back(Note{"a replacement " + member_name(member) + " joined; recovery waits for its linked"});
}

bool RefitPhases::awaits_replacement(int member) const {
  return member >= 0 && member < static_cast<int>(members_.size()) &&
         members_[static_cast<std::size_t>(member)].replacing && phase_ == Phase::kRecovery;
}

void RefitPhases::on_ask(int member, const RankMessage& ask, PhaseTime now) {
  Member& m = members_[static_cast<std::size_t>(member)];
  if (options_.refits != 0 || !is_trainer(member) || m.ask) {
    return fail(InvalidArgument("protocol error: " + member_name(member) + " sent '" + message_name(ask) + "' during " +
                                phase_name() + (m.ask ? " (it already asked)" : " (expected '" + awaited_name() + "')")),
                now);
  }
  if (phase_ != Phase::kBlame) m.ask = ask;  // what a failing refit had in flight is dropped
}

// Sharded trainers under --quantize: a trainer rank's partial amax of the
// blocks it shares. Once every trainer rank shared, the combined table goes
// to the trainer ranks; each quantizes with it (quant/fp8_part.h).
void RefitPhases::on_amax(int member, const AmaxShare& share, PhaseTime now) {
  if (phase_ == Phase::kBlame || phase_ == Phase::kRecovery) return;  // dropped with the refit
  Member& m = members_[static_cast<std::size_t>(member)];
  const char* why = !options_.amax_exchange       ? " (this job exchanges no amax)"
                    : !is_trainer(member)         ? " (only trainer ranks share amax)"
                    : phase_ != Phase::kTransfer  ? " (expected during transfer)"
                    : m.amax                      ? " (it already shared)"
                    : share.version != version_   ? " (the refit in flight is another)"
                                                  : nullptr;
  if (why != nullptr) {
    return fail(InvalidArgument("protocol error: " + member_name(member) + " sent 'amax_share' of refit " +
                                std::to_string(share.version) + " during " + phase_name() + why),
                now);
  }
  m.amax = share.entries;
  std::vector<std::vector<AmaxEntry>> shares;
  for (int t = 0; t < options_.trainer_ranks; ++t) {
    const auto& amax = members_[static_cast<std::size_t>(t)].amax;
    if (!amax) return;
    shares.push_back(*amax);
  }
  StatusOr<std::vector<AmaxEntry>> table = combine_amax(shares);
  if (!table.ok()) {
    return fail(InvalidArgument("the amax exchange of refit " + std::to_string(version_) + " (share N is trainer rank N): " +
                                table.status().message()),
                now);
  }
  out_.push_back(SendAll{AmaxTable{version_, std::move(*table)}, Audience::kTrainers});
}

// The trainer ranks whose amax_share of the refit in flight has not come.
std::string RefitPhases::missing_amax() const {
  std::string out;
  for (int t = 0; t < options_.trainer_ranks; ++t) {
    if (members_[static_cast<std::size_t>(t)].amax) continue;
    out += (out.empty() ? "" : ", ") + member_name(t);
  }
  return out;
}

void RefitPhases::on_deadline(PhaseTime now) {
  if (phase_ == Phase::kBlame) {
    // No lost connection explains the failure: it stands.
    phase_ = blamed_phase_;
    return fail(blamed_, now);
  }
  const std::string unshared = phase_ == Phase::kTransfer && options_.amax_exchange ? missing_amax() : "";
  const std::string late = unshared.empty()
                               ? phase_name() + " timed out waiting for '" + awaited_name() + "' from " + waiting_for()
                               : phase_name() + " timed out waiting for 'amax_share' from " + unshared;
  if (joining_ >= 0 && (phase_ == Phase::kRecovery || phase_ == Phase::kCatchUp)) {
    return refuse_joiner(phase_ == Phase::kCatchUp ? phase_name() + " timed out waiting for " + catch_up_waiting_for()
                                                   : "the engines did not link with it in time: " + late,
                         now);
  }
  if (phase_ == Phase::kRecovery) {
    for (int i = 0; i < static_cast<int>(members_.size()); ++i) {
      if (!members_[static_cast<std::size_t>(i)].replacing) continue;
      const std::string within = format_seconds(options_.trainer_replace_timeout_s);
      return end(Status(recovering_.code(),
                        recovering_.message() + "; no replacement " + member_name(i) + " joined within " + within));
    }
    return end(Status(recovering_.code(), recovering_.message() + "; recovery failed: " + late));
  }
  if (phase_ == Phase::kCommit || phase_ == Phase::kRelease) {
    return end(DeadlineExceeded("refit " + std::to_string(version_) + " was committed, but " + late));
  }
  if (drop_late_engines(now)) return;
  fail(DeadlineExceeded(late), now);
}

// A rank heard nothing from for the heartbeat deadline is lost: stalled
// (SIGSTOP), dead without a closed connection, or cut off.
void RefitPhases::check_silence(PhaseTime now) {
  if (!options_.heartbeats) return;
  for (std::size_t i = 0; i < heard_.size() && phase_ != Phase::kEnded; ++i) {
    if (heard_[i] == PhaseTime::max() || now - heard_[i] < options_.heartbeats->timeout) continue;
    heard_[i] = PhaseTime::max();
    char limit[32];
    std::snprintf(limit, sizeof limit, "%g s", static_cast<double>(options_.heartbeats->timeout.count()) / 1000);
    on_lost(static_cast<int>(i),
            std::string("heard nothing from it for ") + limit +
                " (the heartbeat deadline, --heartbeat-timeout): it stalled, died or is cut off",
            now);
  }
}

// Every interval, a heartbeat to every rank (the shell skips lost ones).
void RefitPhases::beat(PhaseTime now) {
  if (!options_.heartbeats || now < next_beat_) return;
  out_.push_back(SendAll{Heartbeat{}});
  last_beat_ = now;
  next_beat_ = now + options_.heartbeats->interval;
}

// The coordinator itself was stopped (SIGSTOP) or starved past the
// heartbeat deadline: its heartbeats stopped, so every rank has given it up
// by now. Whatever arrived meanwhile (a rank's done, queued in its socket)
// must not lead to a decision: the job ends at once, keeping the last
// committed version (a refit in flight is aborted).
bool RefitPhases::stalled_itself(PhaseTime now) {
  if (!options_.heartbeats || now - last_beat_ <= options_.heartbeats->timeout) return false;
  char text[160];
  std::snprintf(text, sizeof text,
                "the coordinator itself was stalled: it sent nothing for %.1f s, past the heartbeat deadline (%g s), "
                "so every rank has treated it as lost",
                std::chrono::duration<double>(now - last_beat_).count(),
                static_cast<double>(options_.heartbeats->timeout.count()) / 1000);
  const std::string v = std::to_string(version_);
  const bool committed = phase_ == Phase::kCommit || phase_ == Phase::kRelease;
  end(committed    ? Unavailable("refit " + v + " was committed, but " + text)
      : in_flight_ ? Unavailable(std::string(text) + "; refit " + v + " aborted")
                   : Unavailable(text));
  return true;
}

// ---- decisions -------------------------------------------------------------------

// On demand: once every trainer rank asked, start the refit they agree on,
// or end the job when every one finished.
void RefitPhases::decide_idle(PhaseTime now) {
  int finished = 0, asked = 0;
  std::optional<std::uint64_t> version;
  std::vector<std::string> only;  // the first request's globs; every other must ask the same
  for (int t = 0; t < options_.trainer_ranks; ++t) {
    const std::optional<RankMessage>& ask = members_[static_cast<std::size_t>(t)].ask;
    if (!ask) continue;
    ++asked;
    const auto* request = std::get_if<Request>(&*ask);
    if (request == nullptr) {
      ++finished;
      continue;
    }
    if (request->version <= decided_) {
      return end(InvalidArgument(member_name(t) + " asked for refit " + std::to_string(request->version) +
                                 ", not above the last committed version " + std::to_string(decided_)));
    }
    if (version && *version != request->version) {
      return end(InvalidArgument("the trainer ranks ask for different versions: " + std::to_string(*version) +
                                 " and " + std::to_string(request->version) + " (" + member_name(t) + ")"));
    }
    if (!asks_agree(version ? only : request->only, *request, t)) return;
    version = request->version;
    only = request->only;
  }
  if (asked < options_.trainer_ranks) return;
  if (finished == options_.trainer_ranks) return end(Status::Ok());
  if (finished > 0) {
    return end(InvalidArgument(std::to_string(finished) + " trainer ranks finished while the others asked for refit " +
                               std::to_string(*version)));
  }
  only_ = scope_of(*version, only);
  begin_refit(*version, now);
}

// Every rank is done: the one commit decision. From here `version_` is
// committed for the job, whatever happens while the acks come in.
void RefitPhases::decide_commit(PhaseTime) {
  RecordCommit commit;
  commit.version = version_;
  commit.only = only_;
  if (only_.empty()) engines_whole_ = true;  // every live engine took every byte
  commit.seconds = std::chrono::duration<double>(last_sent_ - go_time_).count();
  for (int i = 0; i < static_cast<int>(members_.size()); ++i) {
    if (dropped(i)) {  // its engine was dropped: nothing of it counts
      commit.engines.push_back(Done{version_, false, Json{{"dropped", true}}, ""});
      continue;
    }
    const Done& done = members_[static_cast<std::size_t>(i)].done.value();
    if (!is_trainer(i)) commit.verified = commit.verified && done.verified;
    (is_trainer(i) ? commit.trainers : commit.engines).push_back(done);
  }
  decided_ = version_;
  if (options_.alternate_arenas) landing_ = 1 - landing_;  // the engines serve what landed
  in_flight_ = false;
  out_.push_back(std::move(commit));
  out_.push_back(SendAll{Commit{version_}});
  enter(Phase::kCommit, Step::kCommitted);
}

// Refit `version` begins: after a release, with acquire (release_phases.cc).
void RefitPhases::begin_refit(std::uint64_t version, PhaseTime now) {
  if (released_) return begin_acquire(version, now);
  start_refit(version, now);
}

void RefitPhases::start_refit(std::uint64_t version, PhaseTime now) {
  version_ = version;
  in_flight_ = true;
  for (Member& m : members_) m = Member{};
  deadline_ = now + std::chrono::duration_cast<PhaseClock::duration>(
                        std::chrono::duration<double>(options_.refit_timeout_s));
  out_.push_back(SendAll{Start{version, options_.alternate_arenas ? landing_ : 0, only_}});
  enter(Phase::kPrepare, Step::kReady);
}

void RefitPhases::next_refit(PhaseTime now) {
  in_flight_ = false;
  deadline_ = PhaseTime::max();
  const bool last = options_.refits != 0 && version_ >= static_cast<std::uint64_t>(options_.refits);
  if (!pending_joins_.empty() && !last) return begin_catch_up(now);  // a refit boundary: admit a joiner first
  if (options_.refits == 0) {
    // Asks kept through the refit (a trainer asks as soon as it committed).
    for (Member& m : members_) m.step = Step::kNone;
    return enter(Phase::kIdle, Step::kNone);
  }
  if (version_ >= static_cast<std::uint64_t>(options_.refits)) return end(Status::Ok());
  only_ = scope_of(version_ + 1, {});
  begin_refit(version_ + 1, now);
}

// A failure of refit version_ before its commit decision: abort it on every
// rank and relink them, so that the job goes on. In setup, or once nothing
// is in flight, it ends the job.
void RefitPhases::fail(const Status& failure, PhaseTime now) {
  if (phase_ == Phase::kSetup || !in_flight_) return end(failure);
  for (int i = 0; i < static_cast<int>(members_.size()); ++i) {
    if (const auto& gone = members_[static_cast<std::size_t>(i)].gone) {
      return end(Status(failure.code(), failure.message() + "; recovery failed: lost " + member_name(i) +
                                            " during refit " + std::to_string(version_) + " (recovery): " + *gone));
    }
  }
  out_.push_back(RecordFailure{version_, failure});
  out_.push_back(SendAll{Abort{version_, failure}});
  out_.push_back(SendAll{Relink{version_, std::nullopt}});
  failure_recovery_ = true;
  retry_ = false;
  for (Member& m : members_) m = Member{};  // a request sent before the abort is dropped with it
  recovering_ = failure;
  deadline_ = now + std::chrono::duration_cast<PhaseClock::duration>(
                        std::chrono::duration<double>(options_.setup_timeout_s));
  enter(Phase::kRecovery, Step::kLinked);
}

// The job's end. An error while a refit (or setup) is undecided aborts it;
// otherwise the ranks keep the last committed version and hear the error
// with the shutdown.
void RefitPhases::end(const Status& status) {
  if (status.ok()) {
    out_.push_back(SendAll{Shutdown{std::nullopt, decided_}});
  } else if (in_flight_) {
    out_.push_back(SendAll{Abort{version_, status}});
  } else {
    out_.push_back(SendAll{Shutdown{status, decided_}});
  }
  out_.push_back(EndJob{status});
  phase_ = Phase::kEnded;
  deadline_ = PhaseTime::max();
}

}  // namespace refit
