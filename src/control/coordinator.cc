// The coordinator's I/O shell (coordinator_shell.h): setup, the phase
// machine's feed and its actions.
#include "control/coordinator_shell.h"

#include <arpa/inet.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "net/poll_wait.h"
#include "control/auth.h"
#include "control/engine_tree.h"
#include "control/join_gate.h"
#include "control/protocol.h"
#include "control/progress_line.h"
#include "control/refit_phases.h"
#include "control/partial_setup.h"
#include "control/relay_topology.h"
#include "control/report_builder.h"
#include "control/roster.h"
#include "control/topology.h"
#include "net/link.h"
#include "refit/format.h"
#include "refit/partial.h"
#include "refit/log.h"
#include "core/refit_tally.h"

namespace refit {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

CoordinatorShell::CoordinatorShell(const CoordinatorOptions& options)
    : options_(options), fault_(options.debug_fault), report_(options.report_path),
      progress_(options.progress, options.refits),
      roster_(options.trainer_ranks, options.engine_ranks, options.engines, slots()),
      tree_(options.engine_ranks, slots(), options.relay_fanout) {}

Json CoordinatorShell::run(const std::function<void(int)>& on_listening) {
  Status status = setup(on_listening);
  if (status.ok()) {
    status = drive();
    if (status.ok()) note(LogLevel::kInfo, summary());  // the job ended well; the ranks say theirs
  } else {
    // Setup failed before the machine ran: every rank that joined hears it.
    for (Member* m : roster_.joined()) {
      (void)send_message(*m->link, CoordinatorMessage(Abort{0, status}), Deadline::After(std::chrono::seconds(2)));
    }
    answer_latecomers(status);
  }
  return report_.finish(status);
}

std::string CoordinatorShell::summary() const {
  std::string line = tally_.summary(
      "moved", every_commit_verified_ ? "committed and verified" : "committed (not every byte verified)");
  if (recovered_failures_ > 0) line += "; " + format_count(recovered_failures_, "failed refit") + " recovered from";
  return line;
}

namespace {

// The engine counts and the partial refits' globs (made canonical).
Status check_engines_and_scope(CoordinatorOptions& o) {
  if (o.engines < 1 || o.relay_fanout < 1) {
    return InvalidArgument("coordinator: --engines (" + std::to_string(o.engines) + ") and --relay-fanout (" +
                           std::to_string(o.relay_fanout) + ") must be at least 1");
  }
  if (o.max_engines != 0 && o.max_engines < o.engines) {
    return InvalidArgument("coordinator: --max-engines " + std::to_string(o.max_engines) + " is below --engines " +
                           std::to_string(o.engines));
  }
  if (o.min_engines < 0 || o.min_engines > o.engines) {
    return InvalidArgument("coordinator: --min-engines " + std::to_string(o.min_engines) +
                           " is not a count of engines in 1.." + std::to_string(o.engines) + " (--engines)");
  }
  ASSIGN_OR_RETURN(const RefitScope scope, canonical_scope(o.only));
  o.only = scope.only;
  if (!o.only.empty() && o.only_from < 2) {
    return InvalidArgument("coordinator: --only-from " + std::to_string(o.only_from) +
                           " must be at least 2: the first refit moves every tensor");
  }
  return Status::Ok();
}

}  // namespace

Status CoordinatorShell::setup(const std::function<void(int)>& on_listening) {
  RETURN_IF_ERROR(validate_rank_counts(options_.trainer_ranks, options_.engine_ranks));
  RETURN_IF_ERROR(check_engines_and_scope(options_));
  // A report file that cannot be written fails now, before any rank joins.
  RETURN_IF_ERROR(report_.persist_running("at setup, before any refit was committed"));
  ASSIGN_OR_RETURN(heartbeats_,
                   heartbeat_timing(options_.heartbeat_interval_s, options_.heartbeat_timeout_s, "coordinator"));
  if (!(options_.trainer_replace_timeout_s >= 0 && options_.trainer_replace_timeout_s <= 86400)) {
    return InvalidArgument("coordinator: trainer replace timeout " +
                           format_seconds(options_.trainer_replace_timeout_s) +
                           " is not a number of seconds in [0, 86400]");
  }
  if (options_.trainer_replace_timeout_s > 0 && options_.refits != 0) {
    return InvalidArgument("coordinator: a trainer replace timeout needs an on-demand job (refits 0), not " +
                           std::to_string(options_.refits) + " scheduled refits");
  }
  if (!(options_.handshake_timeout_s > 0 && options_.handshake_timeout_s <= 86400)) {
    return InvalidArgument("coordinator: handshake timeout " + format_seconds(options_.handshake_timeout_s) +
                           " is not a number of seconds in (0, 86400]");
  }
  std::string host;
  int port = 0;
  RETURN_IF_ERROR(split_host_port(options_.listen, &host, &port));
  if (options_.secret.empty()) {
    if (!is_loopback_host(host)) {
      return FailedPrecondition("refusing to listen on " + options_.listen +
                                " without a secret: any host that reaches it could join and replace the weights; "
                                "give the coordinator and every rank --secret-file (or REFIT_SECRET), or listen on "
                                "a loopback address");
    }
    note(LogLevel::kWarning, "warning: no secret (--secret-file or REFIT_SECRET): ranks are not authenticated; any "
                             "local process can join");
  }
  ASSIGN_OR_RETURN(auto listener, Listener::Listen(host, port));
  const int listening_port = listener->port();
  JoinGate::Options gate;
  gate.secret = options_.secret;
  gate.handshake_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(options_.handshake_timeout_s * 1000));
  ASSIGN_OR_RETURN(gate_, JoinGate::Start(std::move(listener), std::move(gate)));
  on_listening(listening_port);
  setup_deadline_ = Deadline::AfterSeconds(options_.setup_timeout_s);
  RETURN_IF_ERROR(accept_joins(setup_deadline_));
  const std::vector<Join> trainer_joins = roster_.trainer_joins(), engine_joins = roster_.engine_joins();
  const std::vector<Join> first_engine(engine_joins.begin(), engine_joins.begin() + options_.engine_ranks);
  ASSIGN_OR_RETURN(Topology topology,
                   plan_topology(trainer_joins, first_engine, options_.seed, options_.refits == 0));
  RETURN_IF_ERROR(check_partial_refits(options_.refits == 0 ? std::vector<std::string>() : options_.only,
                                       trainer_joins[0], engine_joins, slots() > options_.engines));
  partial_refused_ = engine_without_partial(engine_joins);
  RETURN_IF_ERROR(plan_relay(engine_joins, options_.engine_ranks, static_cast<std::uint64_t>(options_.relay_fanout),
                             options_.release_between_refits, slots(), topology));
  for (const std::string& warning : topology.warnings) note(LogLevel::kWarning, warning);
  for (auto* group : {&topology.engine_setups, &topology.trainer_setups}) {
    for (Setup& setup : *group) setup.release_between_refits = options_.release_between_refits;
  }
  report_.set_topology(engine_joins[0], topology, options_.engines, options_.relay_fanout);
  tree_.start(engine_joins, topology.engine_setups);
  for (std::size_t e = 0; e < engine_joins.size(); ++e) {
    Member& m = roster_.engine_rank(e);
    RETURN_IF_ERROR(send_message(*m.link, CoordinatorMessage(topology.engine_setups[e]), setup_deadline_)
                        .WithContext("setup of " + m.name()));
  }
  trainer_setups_ = topology.trainer_setups;  // a replacement trainer rank gets its rank's again
  for (std::size_t t = 0; t < trainer_joins.size(); ++t) {
    Member& m = roster_.trainer(static_cast<int>(t));
    RETURN_IF_ERROR(send_message(*m.link, CoordinatorMessage(topology.trainer_setups[t]), setup_deadline_)
                        .WithContext("setup of " + m.name()));
  }
  return Status::Ok();
}

Status CoordinatorShell::drive() {
  PhaseOptions phase_options;
  phase_options.trainer_ranks = options_.trainer_ranks;
  phase_options.engine_ranks = options_.engine_ranks * slots();
  phase_options.engines = options_.engines;
  phase_options.max_engines = slots();
  phase_options.relay_fanout = options_.relay_fanout;
  phase_options.min_engines = options_.min_engines;
  phase_options.refits = options_.refits;
  phase_options.setup_timeout_s = options_.setup_timeout_s;
  phase_options.refit_timeout_s = options_.refit_timeout_s;
  phase_options.heartbeats = heartbeats_;
  phase_options.trainer_replace_timeout_s = options_.trainer_replace_timeout_s;
  // Sharded trainers that quantize share the amax of the blocks their
  // cuts split (they say so in their joins: an engine that declares its
  // specs, as a Python engine does, need not name the format; every
  // trainer rank agrees, or the plan digests would differ).
  const Join& trainer = roster_.trainer(0).join;
  const Join& engine = roster_.engine_rank(0).join;
  phase_options.amax_exchange = trainer.layout != "full" && trainer.quantize != "none";
  phase_options.alternate_arenas = engine.mode == "direct" && engine.shadow;
  phase_options.release_between_refits = options_.release_between_refits;
  phase_options.only = options_.only;
  phase_options.partial_refused = partial_refused_;
  phase_options.only_from = options_.only_from;
  RefitPhases phases(phase_options);
  members_ = roster_.slots();
  // Setup's linking shares the deadline the joins had.
  std::vector<Lost> lost;
  for (PhaseAction& action : phases.start(Clock::now(), setup_deadline_.at())) carry_out(action, &lost);
  for (const Lost& l : lost) feed(phases, l);
  for (JoinGate::Candidate& early : early_joiners_) admit_joiner(phases, std::move(early.link), early.join);
  early_joiners_.clear();
  while (!ended_) {
    std::vector<pollfd> fds;
    for (Member* m : members_) fds.push_back({m == nullptr || m->closed ? -1 : m->link->fd(), POLLIN, 0});
    fds.push_back({gate_->fd(), POLLIN, 0});
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(
        std::max(phases.wake_at(), Clock::now()) - Clock::now());
    const int timeout = static_cast<int>(std::min<std::int64_t>(wait.count(), 100));
    const int ready =
        poll_until(fds, Deadline::After(std::chrono::milliseconds(phases.wake_at() == PhaseTime::max() ? 100
                                                                                                 : timeout)));
    if (ready < 0) return ErrnoStatus("coordinator poll", -ready);
    // A replaced member's link is new: this round's poll results are stale.
    if (ready > 0 && (fds.back().revents & POLLIN) && refuse_latecomers(phases)) continue;
    for (std::size_t i = 0; ready > 0 && i < members_.size() && !ended_; ++i) {
      // A member dropped or refused earlier in this round (a joiner killed during its catch-up) is gone.
      if (members_[i] == nullptr || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      auto message = recv_rank_message(*members_[i]->link, Deadline::After(std::chrono::milliseconds(5000)));
      if (message.ok()) {
        fire_received_hook(*message);
        // Filled in place (clang 14 has no parenthesized aggregate init).
        PhaseEvent received(std::in_place_type<Received>);
        std::get<Received>(received).member = static_cast<int>(i);
        std::get<Received>(received).message = std::move(*message);
        feed(phases, received);
      } else {
        members_[i]->closed = true;
        feed(phases, Lost{static_cast<int>(i), message.status().message()});
      }
    }
    if (!ended_) feed(phases, Tick{});
    if (phases.phase() == RefitPhases::Phase::kSetup) progress_.setup("every rank joined, linking data paths");
  }
  tell_waiting_engines(end_status_);
  return end_status_;
}

void CoordinatorShell::feed(RefitPhases& phases, const PhaseEvent& event) {
  std::vector<Lost> lost;
  step(phases, event, &lost);
  for (std::size_t i = 0; i < lost.size() && !ended_; ++i) {
    const Lost next = lost[i];
    step(phases, PhaseEvent(next), &lost);
  }
}

void CoordinatorShell::step(RefitPhases& phases, const PhaseEvent& event, std::vector<Lost>* lost) {
  const bool was_setup = phases.phase() == RefitPhases::Phase::kSetup;
  std::vector<PhaseAction> actions = phases.on(event, Clock::now());
  if (was_setup && phases.phase() != RefitPhases::Phase::kSetup) progress_.setup_done();
  if (was_setup && phases.phase() != RefitPhases::Phase::kSetup && phases.phase() != RefitPhases::Phase::kEnded &&
      options_.log_joins) {
    note(LogLevel::kInfo, "setup complete: " + format_count(options_.trainer_ranks, "trainer rank") + ", " +
                              format_count(options_.engine_ranks * options_.engines, "engine rank") +
                              (options_.engines > 1 ? " (" + std::to_string(options_.engines) + " engines)" : "") +
                              " linked");
  }
  for (PhaseAction& action : actions) carry_out(action, lost);
}

void CoordinatorShell::carry_out(PhaseAction& action, std::vector<Lost>* lost) {
  if (auto* send = std::get_if<SendAll>(&action)) {
    fire_send_hook(send->message);
    if (const auto* acquire = std::get_if<Acquire>(&send->message)) adopt_descriptors(*acquire);
    if (const auto* go = std::get_if<Go>(&send->message)) {
      progress_.go();
      report_.record_go(go->version);
    }
    const bool ending = std::holds_alternative<Shutdown>(send->message) || std::holds_alternative<Abort>(send->message);
    // A heartbeat that cannot go out within the heartbeat deadline finds a
    // rank that reads nothing: lost, like any failed send.
    const Deadline by = ending ? Deadline::After(std::chrono::seconds(2))
                        : std::holds_alternative<Heartbeat>(send->message) ? Deadline::After(heartbeats_.timeout)
                                                                           : Deadline::After(std::chrono::seconds(30));
    const std::size_t trainers = static_cast<std::size_t>(options_.trainer_ranks);
    const std::size_t first = send->audience == Audience::kEngines ? trainers : 0;
    const std::size_t audience = send->audience == Audience::kTrainers ? trainers : members_.size();
    for (std::size_t i = first; i < audience; ++i) {
      const auto& only = send->members;
      if (!only.empty() && std::find(only.begin(), only.end(), static_cast<int>(i)) == only.end()) continue;
      if (members_[i] == nullptr || members_[i]->closed) continue;
      Status sent = send_message(*members_[i]->link, routed(send->message, i), by);
      if (!sent.ok() && !ending) {
        members_[i]->closed = true;
        lost->push_back(Lost{static_cast<int>(i), sent.message()});
      }
    }
    if (std::holds_alternative<Relink>(send->message)) tree_.relinked();
  } else if (auto* drop = std::get_if<DropEngine>(&action)) {
    drop_engine(*drop);
  } else if (auto* admit = std::get_if<AdmitEngine>(&action)) {
    admit_engine(*admit, lost);
  } else if (auto* join = std::get_if<RecordJoin>(&action)) {
    report_.record_join(*join);
  } else if (auto* commit = std::get_if<RecordCommit>(&action)) {
    report_.record_commit(*commit);
    tally_.add(commit->version, report_.refit_bytes(*commit));
    every_commit_verified_ = every_commit_verified_ && commit->verified;
    // Written before commit(v) goes out: a coordinator lost from here on
    // leaves a report that names v committed.
    Status kept = report_.persist_running("at the commit decision of refit " + std::to_string(commit->version));
    if (!kept.ok()) note(LogLevel::kWarning, "the report file is not up to date: " + kept.message());
    fire_fault_hook(fault_, ProtocolStep::kCommit, commit->version, "refit coordinator");
  } else if (auto* failure = std::get_if<RecordFailure>(&action)) {
    note(LogLevel::kWarning, "refit " + std::to_string(failure->version) + " failed: " + failure->error.message() +
                                 "; recovering");
    report_.record_failure(*failure);
    ++recovered_failures_;
  } else if (auto* recovery = std::get_if<RecordRecovery>(&action)) {
    report_.record_recovery(*recovery);
    const bool whole = std::all_of(recovery->engines.begin(), recovery->engines.end(),
                                   [](const Linked& l) { return l.weights_complete.value_or(false); });
    note(LogLevel::kInfo, "recovered from the failed refit " + std::to_string(recovery->version) +
                              ": every rank relinked, engine weights at version " +
                              std::to_string(report_.committed_version()) +
                              (whole ? " (complete: the failed refit was never served)"
                                     : " (incomplete until the next refit commits)"));
  } else if (auto* release = std::get_if<RecordRelease>(&action)) {
    report_.record_release(*release);
  } else if (auto* progress = std::get_if<ShowProgress>(&action)) {
    progress_.refit(*progress, report_.bytes_per_refit());
  } else if (auto* line = std::get_if<Note>(&action)) {
    note(LogLevel::kInfo, line->line);
  } else if (auto* end = std::get_if<EndJob>(&action)) {
    ended_ = true;
    end_status_ = end->status;
  }
}

CoordinatorMessage CoordinatorShell::routed(const CoordinatorMessage& message, std::size_t i) const {
  const std::size_t trainers = static_cast<std::size_t>(options_.trainer_ranks);
  if (i >= trainers) return tree_.routed(message, i - trainers);
  const auto* relink = std::get_if<Relink>(&message);
  if (relink == nullptr) return message;
  std::vector<EngineTarget> moved = moved_targets(trainer_setups_[i]);
  if (moved.empty()) return message;
  return CoordinatorMessage(Relink{relink->version, Route{{}, {}, std::move(moved), {}}});
}

std::vector<EngineTarget> CoordinatorShell::moved_targets(const Setup& trainer) const {
  std::vector<EngineTarget> moved;
  if (trainer.targets.empty()) {  // full weights: the one engine rank it feeds
    if (std::optional<EngineTarget> root = tree_.moved_root(trainer.engine_rank)) moved.push_back(*root);
  }
  for (const EngineTarget& target : trainer.targets) {  // sharded: every engine rank it feeds
    if (std::optional<EngineTarget> root = tree_.moved_root(target.engine_rank)) moved.push_back(*root);
  }
  return moved;
}

void CoordinatorShell::adopt_descriptors(const Acquire& acquire) {
  for (Setup& setup : trainer_setups_) {
    if (setup.engine_rank < acquire.descriptors.size()) setup.descriptor = acquire.descriptors[setup.engine_rank];
    for (EngineTarget& target : setup.targets) {
      if (target.engine_rank >= acquire.descriptors.size()) continue;
      target.descriptor = acquire.descriptors[target.engine_rank];
    }
  }
}

void CoordinatorShell::fire_send_hook(const CoordinatorMessage& message) {
  if (const auto* start = std::get_if<Start>(&message)) {
    fire_fault_hook(fault_, ProtocolStep::kStart, start->version, "refit coordinator");
  } else if (const auto* go = std::get_if<Go>(&message)) {
    fire_fault_hook(fault_, ProtocolStep::kGo, go->version, "refit coordinator");
  }
}

void CoordinatorShell::fire_received_hook(const RankMessage& message) {
  if (const auto* ready = std::get_if<Ready>(&message)) {
    fire_fault_hook(fault_, ProtocolStep::kReady, ready->version, "refit coordinator");
  } else if (const auto* sent = std::get_if<Sent>(&message)) {
    fire_fault_hook(fault_, ProtocolStep::kSent, sent->version, "refit coordinator");
  } else if (const auto* done = std::get_if<Done>(&message)) {
    fire_fault_hook(fault_, ProtocolStep::kDone, done->version, "refit coordinator");
  } else if (const auto* committed = std::get_if<Committed>(&message)) {
    fire_fault_hook(fault_, ProtocolStep::kCommitted, committed->version, "refit coordinator");
  }
}

void CoordinatorShell::note(LogLevel level, const std::string& line) {
  progress_.break_line();  // a line of its own, not the rest of a setup line
  log(level, "refit coordinator", line);
}

Status validate_rank_counts(int trainer_ranks, int engine_ranks) {
  if (trainer_ranks < 1 || engine_ranks < 1) {
    return FailedPrecondition("trainer_ranks (" + std::to_string(trainer_ranks) + ") and engine_ranks (" +
                              std::to_string(engine_ranks) + ") must be at least 1");
  }
  return Status::Ok();
}

Json coordinate_job(const CoordinatorOptions& options, const std::function<void(int port)>& on_listening) {
  CoordinatorShell coordinator(options);
  // Every message is validated before use (control_message.h), so no JSON
  // exception is expected; should one escape anyway, the job fails with a
  // report instead of the process terminating.
  try {
    return coordinator.run(on_listening);
  } catch (const std::exception& e) {
    return Json{{"verified", false}, {"refits", Json::array()}, {"error", "internal: coordinator: " + std::string(e.what())}};
  }
}

}  // namespace refit
