// The coordinator's I/O shell: it listens, admits the ranks' joins (through
// the join gate), checks the topology (topology.h), sends each rank its
// Setup, and then feeds the phase machine (refit_phases.h) with what the
// ranks send, carrying out the actions it returns and writing the report.
// The protocol's decisions are the machine's; this file only moves bytes.
#include "control/coordinate.h"

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
#include "control/join_gate.h"
#include "control/protocol.h"
#include "control/progress_line.h"
#include "control/refit_phases.h"
#include "control/relay_topology.h"
#include "control/report_builder.h"
#include "control/roster.h"
#include "control/topology.h"
#include "net/link.h"
#include "refit/format.h"
#include "refit/log.h"
#include "core/refit_tally.h"

namespace refit {
namespace {

using Clock = std::chrono::steady_clock;

// How long the coordinator keeps answering ranks that arrive after another
// rank reported its setup failure.
constexpr std::chrono::seconds kLatecomerWindow{5};

class Coordinator {
 public:
  explicit Coordinator(const CoordinatorOptions& options)
      : options_(options), fault_(options.debug_fault), report_(options.report_path),
        progress_(options.progress, options.refits),
        roster_(options.trainer_ranks, options.engine_ranks, options.engines) {}

  Json run(const std::function<void(int)>& on_listening) {
    Status status = setup(on_listening);
    if (status.ok()) {
      status = drive();
      if (status.ok()) note(LogLevel::kInfo, summary());  // the job ended well; the ranks say theirs
    } else {
      // Setup failed before the machine ran: every rank that joined hears it.
      for (Member* m : joined()) {
        (void)send_message(*m->link, CoordinatorMessage(Abort{0, status}), Deadline::After(std::chrono::seconds(2)));
      }
      answer_latecomers(status);
    }
    return report_.finish(status);
  }

 private:
  // "3 refits (versions 1..3) committed and verified, 53.77 MiB moved each
  // (161.3 MiB in all), 0.41 s from setup to the last commit", and the
  // failed refits recovered from, if any.
  std::string summary() const {
    std::string line = tally_.summary(
        "moved", every_commit_verified_ ? "committed and verified" : "committed (not every byte verified)");
    if (recovered_failures_ > 0) line += "; " + format_count(recovered_failures_, "failed refit") + " recovered from";
    return line;
  }

  // ---- setup: listen, admit, check, send Setup ---------------------------------

  Status setup(const std::function<void(int)>& on_listening) {
    RETURN_IF_ERROR(validate_rank_counts(options_.trainer_ranks, options_.engine_ranks));
    if (options_.engines < 1 || options_.relay_fanout < 1) {
      return InvalidArgument("coordinator: --engines (" + std::to_string(options_.engines) + ") and --relay-fanout (" +
                             std::to_string(options_.relay_fanout) + ") must be at least 1");
    }
    if (options_.min_engines < 0 || options_.min_engines > options_.engines) {
      return InvalidArgument("coordinator: --min-engines " + std::to_string(options_.min_engines) +
                             " is not a count of engines in 1.." + std::to_string(options_.engines) + " (--engines)");
    }
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
    RETURN_IF_ERROR(plan_relay(engine_joins, options_.engine_ranks, static_cast<std::uint64_t>(options_.relay_fanout),
                               options_.release_between_refits, topology));
    for (const std::string& warning : topology.warnings) note(LogLevel::kWarning, warning);
    for (auto* group : {&topology.engine_setups, &topology.trainer_setups}) {
      for (Setup& setup : *group) setup.release_between_refits = options_.release_between_refits;
    }
    report_.set_topology(engine_joins[0], topology, options_.engines, options_.relay_fanout);
    engine_joins_ = engine_joins;
    engine_setups_ = topology.engine_setups;
    live_engines_.assign(static_cast<std::size_t>(options_.engines), true);
    for (const Setup& setup : engine_setups_) routes_.push_back(Route{setup.feeders, setup.relay});
    reroutes_.assign(routes_.size(), std::nullopt);
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

  // Admits joins (authenticated and read by the gate) until every rank
  // joined; refusals are logged and never disturb the ranks already in. A
  // rank that joined and is lost before the others did ends setup at once,
  // named (not only once the last rank joins, or at the setup deadline).
  Status accept_joins(Deadline deadline) {
    while (!roster_.complete()) {
      std::vector<pollfd> fds{{gate_->fd(), POLLIN, 0}};
      std::vector<Member*> members = joined();
      for (Member* m : members) fds.push_back({m->link->fd(), POLLIN, 0});
      const int ready = poll_until(fds, deadline.min(Deadline::After(std::chrono::milliseconds(200))));
      if (ready < 0) return ErrnoStatus("coordinator poll", -ready);
      for (std::size_t i = 1; ready > 0 && i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        Member& m = *members[i - 1];
        // Nothing is due from a rank before its Setup: a message that arrives
        // anyway is ignored; a closed connection is a lost rank.
        auto message = recv_rank_message(*m.link, Deadline::After(std::chrono::milliseconds(1000)));
        if (!message.ok()) {
          return Unavailable("lost " + m.name() + " (pid " + std::to_string(m.join.pid) +
                             ") during setup, before every rank joined: " + message.status().message());
        }
      }
      if (deadline.expired()) {
        return DeadlineExceeded("setup timed out after " + format_seconds(options_.setup_timeout_s) + ": missing " +
                                roster_.missing());
      }
      progress_.setup(std::to_string(roster_.joined_count()) + " of " + format_count(roster_.expected(), "rank") +
                      " joined");
      while (auto candidate = gate_->take()) admit(std::move(candidate->link), candidate->join);
      if (!roster_.setup_failure().ok()) return roster_.setup_failure();
    }
    return Status::Ok();
  }

  // One candidate of the gate into the roster; what it says is logged.
  void admit(std::unique_ptr<Link> link, const Json& text) {
    StatusOr<std::string> admitted = roster_.admit(std::move(link), text);
    if (!admitted.ok()) note(LogLevel::kWarning, admitted.status().message());
    if (admitted.ok() && !admitted->empty() && options_.log_joins) note(LogLevel::kInfo, *admitted);
  }

  // A rank reported that its setup failed before every rank joined: the
  // ranks still on their way (started with it by the same launcher) are
  // told why as they arrive, instead of finding no coordinator and retrying
  // until their setup deadline; until every expected rank joined, failed or
  // was told, for at most kLatecomerWindow (and never past the setup
  // deadline), so that the coordinator itself still stops soon.
  void answer_latecomers(const Status& why) {
    if (!gate_ || !roster_.failed_rank() || setup_deadline_.is_never()) return;
    const Deadline until = setup_deadline_.min(Deadline::After(kLatecomerWindow));
    std::set<RankKey> accounted = roster_.joined_keys();
    accounted.insert(*roster_.failed_rank());
    const std::size_t expected = static_cast<std::size_t>(roster_.expected());
    while (accounted.size() < expected && !until.expired()) {
      std::vector<pollfd> fds{{gate_->fd(), POLLIN, 0}};
      if (poll_until(fds, until.min(Deadline::After(std::chrono::milliseconds(200)))) < 0) return;
      while (auto candidate = gate_->take()) {
        auto message = decode_rank_message(candidate->join);
        const Join* join = message.ok() ? std::get_if<Join>(&*message) : nullptr;
        const SetupFailed* failed = message.ok() ? std::get_if<SetupFailed>(&*message) : nullptr;
        if (join != nullptr && roster_.fits(*join)) {
          (void)send_message(*candidate->link, CoordinatorMessage(Refusal{why}),
                             Deadline::After(std::chrono::milliseconds(1000)));
          accounted.insert(Roster::key(join->role, join->engine, join->rank));
        } else if (failed != nullptr) {
          accounted.insert(Roster::key(failed->role, failed->engine, failed->rank));
        }
      }
    }
  }

  // A connection after setup is a replacement the machine awaits (admitted:
  // returns true) or a duplicate or a stray: refused (with the reason) and
  // logged; the running job is not disturbed.
  bool refuse_latecomers(RefitPhases& phases) {
    bool replaced = false;
    while (auto candidate = gate_->take()) {
      auto message = decode_rank_message(candidate->join);
      const Join* join = message.ok() ? std::get_if<Join>(&*message) : nullptr;
      if (join != nullptr && join->role == Role::kTrainer && phases.awaits_replacement(join->rank)) {
        replaced = admit_replacement(phases, std::move(candidate->link), *join) || replaced;
        continue;
      }
      StatusOr<std::string> admitted = roster_.admit(std::move(candidate->link), candidate->join);
      // The roster only admits a rank whose slot is free, which cannot
      // happen after setup; keep the invariant loud.
      note(LogLevel::kWarning, admitted.ok() ? "internal error: a rank was admitted after setup"
                                             : admitted.status().message());
    }
    return replaced;
  }

  // A new process of trainer rank t, which the machine awaits: admitted when
  // its join matches the lost process's (same plan), sent that rank's Setup,
  // and fed to the machine as Replaced. Otherwise refused, named.
  bool admit_replacement(RefitPhases& phases, std::unique_ptr<Link> link, const Join& join) {
    Member& old = roster_.trainer(join.rank);
    const std::string name = rank_name(join.role, join.rank), pid = std::to_string(join.pid);
    const std::string differs = join_difference(old.join, join);
    if (!differs.empty()) {
      const std::string why = "replacement " + name + " (pid " + pid + ") refused: its " + differs +
                              " differs from the lost process's";
      (void)send_message(*link, CoordinatorMessage(Refusal{FailedPrecondition(why)}),
                         Deadline::After(std::chrono::milliseconds(1000)));
      note(LogLevel::kWarning, why);
      return false;
    }
    Status sent = send_message(*link, CoordinatorMessage(trainer_setups_[static_cast<std::size_t>(join.rank)]),
                               Deadline::After(std::chrono::seconds(5)));
    if (!sent.ok()) {
      note(LogLevel::kWarning, "replacement " + name + ": setup not sent: " + sent.message());
      return false;
    }
    link->set_peer(name + " (pid " + pid + ")");
    old.link = std::move(link);
    old.join = join;
    old.closed = false;
    note(LogLevel::kInfo, "a replacement " + name + " joined (pid " + pid + ")");
    feed(phases, Replaced{join.rank});
    return true;
  }

  // ---- the phase machine's feed --------------------------------------------------

  // Members in the machine's numbering: trainers, then engines.
  std::vector<Member*> joined() { return roster_.joined(); }

  Status drive() {
    PhaseOptions phase_options;
    phase_options.trainer_ranks = options_.trainer_ranks;
    phase_options.engine_ranks = options_.engine_ranks * options_.engines;
    phase_options.engines = options_.engines;
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
    RefitPhases phases(phase_options);
    members_ = joined();
    // Setup's linking shares the deadline the joins had.
    std::vector<Lost> lost;
    for (PhaseAction& action : phases.start(Clock::now(), setup_deadline_.at())) carry_out(action, &lost);
    for (const Lost& l : lost) feed(phases, l);
    while (!ended_) {
      std::vector<pollfd> fds;
      for (Member* m : members_) fds.push_back({m->closed ? -1 : m->link->fd(), POLLIN, 0});
      fds.push_back({gate_->fd(), POLLIN, 0});
      const auto wait = std::chrono::ceil<std::chrono::milliseconds>(
          std::max(phases.wake_at(), Clock::now()) - Clock::now());
      const int timeout = static_cast<int>(std::min<std::int64_t>(wait.count(), 100));
      const int ready =
          poll_until(fds, Deadline::After(std::chrono::milliseconds(phases.wake_at() == PhaseTime::max() ? 100 : timeout)));
      if (ready < 0) return ErrnoStatus("coordinator poll", -ready);
      // A replaced member's link is new: this round's poll results are stale.
      if (ready > 0 && (fds.back().revents & POLLIN) && refuse_latecomers(phases)) continue;
      for (std::size_t i = 0; ready > 0 && i < members_.size() && !ended_; ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
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
    return end_status_;
  }

  // One event into the machine; its actions carried out. A send that fails
  // becomes a lost rank, fed back in turn.
  void feed(RefitPhases& phases, const PhaseEvent& event) {
    std::vector<Lost> lost;
    step(phases, event, &lost);
    for (std::size_t i = 0; i < lost.size() && !ended_; ++i) {
      const Lost next = lost[i];
      step(phases, PhaseEvent(next), &lost);
    }
  }

  void step(RefitPhases& phases, const PhaseEvent& event, std::vector<Lost>* lost) {
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

  void carry_out(PhaseAction& action, std::vector<Lost>* lost) {
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
        if (members_[i]->closed) continue;
        Status sent = send_message(*members_[i]->link, routed(send->message, i), by);
        if (!sent.ok() && !ending) {
          members_[i]->closed = true;
          lost->push_back(Lost{static_cast<int>(i), sent.message()});
        }
      }
      if (std::holds_alternative<Relink>(send->message)) reroutes_.assign(reroutes_.size(), std::nullopt);
    } else if (auto* drop = std::get_if<DropEngine>(&action)) {
      drop_engine(*drop);
    } else if (auto* commit = std::get_if<RecordCommit>(&action)) {
      report_.record_commit(*commit);
      tally_.add(commit->version, report_.bytes_per_refit());
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

  // Many engines: engine `drop.engine` leaves the job. Its ranks still
  // connected are told (a shutdown with the reason) and no longer heard;
  // the live engines' routes are planned again (relay_topology.h), and the
  // next relink carries each changed one.
  void drop_engine(const DropEngine& drop) {
    note(LogLevel::kWarning, "engine " + std::to_string(drop.engine) + " dropped from the job: " +
                                 drop.why.message());
    report_.record_drop(drop);
    const std::size_t ranks = static_cast<std::size_t>(options_.engine_ranks);
    const std::size_t trainers = static_cast<std::size_t>(options_.trainer_ranks);
    const Status told = Aborted("engine " + std::to_string(drop.engine) + " was dropped from the job: " +
                                drop.why.message());
    for (std::size_t r = 0; r < ranks; ++r) {
      Member& m = *members_[trainers + drop.engine * ranks + r];
      if (m.closed) continue;
      (void)send_message(*m.link, CoordinatorMessage(Shutdown{told, report_.committed_version()}),
                         Deadline::After(std::chrono::seconds(2)));
      m.closed = true;
    }
    live_engines_[drop.engine] = false;
    const std::vector<Route> routes = relay_routes(engine_joins_, options_.engine_ranks,
                                                   static_cast<std::uint64_t>(options_.relay_fanout), live_engines_,
                                                   engine_setups_);
    for (std::size_t g = 0; g < routes.size(); ++g) {
      if (!live_engines_[g / ranks] || routes[g] == routes_[g]) continue;
      routes_[g] = routes[g];
      reroutes_[g] = routes[g];
    }
  }

  // `message` as member `i` gets it: a relink carries the member's new route
  // when an engine was dropped since the last one.
  CoordinatorMessage routed(const CoordinatorMessage& message, std::size_t i) const {
    const auto* relink = std::get_if<Relink>(&message);
    const std::size_t trainers = static_cast<std::size_t>(options_.trainer_ranks);
    if (relink == nullptr || i < trainers || !reroutes_[i - trainers]) return message;
    return CoordinatorMessage(Relink{relink->version, reroutes_[i - trainers]});
  }

  // The engine ranks' pools after an acquire: a replacement trainer rank's
  // setup names them, not the pools of the job's setup.
  void adopt_descriptors(const Acquire& acquire) {
    for (Setup& setup : trainer_setups_) {
      if (setup.engine_rank < acquire.descriptors.size()) setup.descriptor = acquire.descriptors[setup.engine_rank];
      for (EngineTarget& target : setup.targets) {
        if (target.engine_rank >= acquire.descriptors.size()) continue;
        target.descriptor = acquire.descriptors[target.engine_rank];
      }
    }
  }

  // ---- fault hooks (refit/fault_hook.h) -------------------------------------------

  // Before start(v) or go(v) goes out.
  void fire_send_hook(const CoordinatorMessage& message) {
    if (const auto* start = std::get_if<Start>(&message)) {
      fire_fault_hook(fault_, ProtocolStep::kStart, start->version, "refit coordinator");
    } else if (const auto* go = std::get_if<Go>(&message)) {
      fire_fault_hook(fault_, ProtocolStep::kGo, go->version, "refit coordinator");
    }
  }

  // On the first ready(v), sent(v), done(v) or committed(v) from any rank.
  void fire_received_hook(const RankMessage& message) {
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

  void note(LogLevel level, const std::string& line) {
    progress_.break_line();  // a line of its own, not the rest of a setup line
    log(level, "refit coordinator", line);
  }

  CoordinatorOptions options_;
  FaultHook fault_;  // options_.debug_fault, disarmed once it fired
  // Accepts, authenticates and reads joins off this thread (join_gate.h).
  std::unique_ptr<JoinGate> gate_;
  std::vector<Member*> members_;  // the machine's numbering
  std::vector<Setup> trainer_setups_;
  // Many engines: every engine rank's join and setup (k * R + r), which
  // engines are live, each rank's route now, and those the next relink
  // carries (changed by a drop).
  std::vector<Join> engine_joins_;
  std::vector<Setup> engine_setups_;
  std::vector<bool> live_engines_;
  std::vector<Route> routes_;
  std::vector<std::optional<Route>> reroutes_;
  // Set by setup() before any use; Never() only as the initial value.
  Deadline setup_deadline_ = Deadline::Never();
  HeartbeatTiming heartbeats_;
  bool ended_ = false;
  Status end_status_;
  ReportBuilder report_;
  ProgressLine progress_;
  Roster roster_;  // the expected ranks, and those that joined
  // For the summary line: every committed refit (every engine rank's bytes),
  // whether each was verified, and the failed refits recovered from.
  RefitTally tally_;
  bool every_commit_verified_ = true;
  std::uint64_t recovered_failures_ = 0;
};

}  // namespace

Status validate_rank_counts(int trainer_ranks, int engine_ranks) {
  if (trainer_ranks < 1 || engine_ranks < 1) {
    return FailedPrecondition("trainer_ranks (" + std::to_string(trainer_ranks) + ") and engine_ranks (" +
                              std::to_string(engine_ranks) + ") must be at least 1");
  }
  return Status::Ok();
}

Json coordinate_job(const CoordinatorOptions& options, const std::function<void(int port)>& on_listening) {
  Coordinator coordinator(options);
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
