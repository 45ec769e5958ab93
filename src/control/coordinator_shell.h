// CoordinatorShell: the coordinator's I/O shell (coordinate.h's
// coordinate_job). It listens, admits the ranks' joins (through the join
// gate), checks the topology (topology.h), sends each rank its Setup, and
// then feeds the phase machine (refit_phases.h) with what the ranks send,
// carrying out the actions it returns and writing the report. The
// protocol's decisions are the machine's; the shell only moves bytes.
//
// coordinator.cc holds setup, the feed and the actions; coordinator_
// admission.cc who is in the job after setup: replacement trainer ranks,
// engines joining the running job, engines dropped.
//
// Thread safety: none; one thread runs it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "control/coordinate.h"
#include "control/engine_tree.h"
#include "control/join_gate.h"
#include "control/progress_line.h"
#include "control/refit_phases.h"
#include "control/report_builder.h"
#include "control/roster.h"
#include "core/refit_tally.h"
#include "refit/fault_hook.h"
#include "refit/log.h"

namespace refit {

class CoordinatorShell {
 public:
  explicit CoordinatorShell(const CoordinatorOptions& options);

  Json run(const std::function<void(int)>& on_listening);

 private:
  // "3 refits (versions 1..3) committed and verified, 53.77 MiB moved each
  // (161.3 MiB in all), 0.41 s from setup to the last commit", and the
  // failed refits recovered from, if any.
  std::string summary() const;

  // Engine slots: --max-engines, or --engines when not given.
  int slots() const { return options_.max_engines > 0 ? options_.max_engines : options_.engines; }

  // ---- setup: listen, admit, check, send Setup ---------------------------------

  Status setup(const std::function<void(int)>& on_listening);

  // Admits joins (authenticated and read by the gate) until every rank
  // joined; refusals are logged and never disturb the ranks already in. A
  // rank that joined and is lost before the others did ends setup at once,
  // named (not only once the last rank joins, or at the setup deadline).
  Status accept_joins(Deadline deadline);

  // One candidate of the gate into the roster; what it says is logged.
  void admit(std::unique_ptr<Link> link, const Json& text);

  // A rank reported that its setup failed before every rank joined: the
  // ranks still on their way (started with it by the same launcher) are
  // told why as they arrive, instead of finding no coordinator and retrying
  // until their setup deadline; until every expected rank joined, failed or
  // was told, for at most kLatecomerWindow (and never past the setup
  // deadline), so that the coordinator itself still stops soon.
  void answer_latecomers(const Status& why);

  // A connection after setup is a replacement the machine awaits (admitted:
  // returns true) or a duplicate or a stray: refused (with the reason) and
  // logged; the running job is not disturbed.
  bool refuse_latecomers(RefitPhases& phases);

  // ---- engines joining the running job (refit_phase_joins.cc) ------------------

  // Whether `text` is the join of an engine rank past the setup's engines.
  bool joins_running_job(const Json& text) const;

  // A rank of an engine joining the running job: held (not heard, not told)
  // until every rank of its engine joined; then checked against engine 0's
  // (refused, named, when it differs) and handed to the machine, which
  // admits it at the next refit boundary. True when members_ changed.
  bool admit_joiner(RefitPhases& phases, std::unique_ptr<Link> link, const Json& text);

  // Engine k's slots in the machine's numbering.
  std::vector<Member*> engine_members(std::uint64_t k) const;

  // A joining engine not admitted: each of its ranks is told why, and its
  // slots are free again (the same engine number may try again).
  void refuse_engine(std::uint64_t k, const Status& why);

  // The machine admits engine `admit.engine` at this boundary: its ranks get
  // their Setup (their place in the tree of the live engines with it).
  void admit_engine(const AdmitEngine& admit, std::vector<Lost>* lost);

  // The job ended: an engine still waiting to be admitted is told.
  void tell_waiting_engines(const Status& status);

  // A new process of trainer rank t, which the machine awaits: admitted when
  // its join matches the lost process's (same plan), sent that rank's Setup,
  // and fed to the machine as Replaced. Otherwise refused, named.
  bool admit_replacement(RefitPhases& phases, std::unique_ptr<Link> link, const Join& join);

  // ---- the phase machine's feed --------------------------------------------------

  Status drive();

  // One event into the machine; its actions carried out. A send that fails
  // becomes a lost rank, fed back in turn.
  void feed(RefitPhases& phases, const PhaseEvent& event);

  void step(RefitPhases& phases, const PhaseEvent& event, std::vector<Lost>* lost);

  void carry_out(PhaseAction& action, std::vector<Lost>* lost);

  // Many engines: engine `drop.engine` leaves the job. Its ranks still
  // connected are told (a shutdown with the reason) and no longer heard;
  // the live engines' routes are planned again (relay_topology.h), and the
  // next relink carries each changed one. A joining engine refused by the
  // machine frees its slots (its number may try again).
  void drop_engine(const DropEngine& drop);

  // `message` as member `i` gets it: a relink carries an engine rank's new
  // route when the relay tree changed since the last one.
  CoordinatorMessage routed(const CoordinatorMessage& message, std::size_t i) const;
  // The root of the relay tree moved since the last relink: the new root's
  // rank for each engine rank trainer setup `trainer` feeds; empty otherwise.
  std::vector<EngineTarget> moved_targets(const Setup& trainer) const;

  // The engine ranks' pools after an acquire: a replacement trainer rank's
  // setup names them, not the pools of the job's setup.
  void adopt_descriptors(const Acquire& acquire);

  // ---- fault hooks (refit/fault_hook.h) -------------------------------------------

  // Before start(v) or go(v) goes out.
  void fire_send_hook(const CoordinatorMessage& message);

  // On the first ready(v), sent(v), done(v) or committed(v) from any rank.
  void fire_received_hook(const RankMessage& message);

  void note(LogLevel level, const std::string& line);

  CoordinatorOptions options_;
  std::string partial_refused_;  // why a partial refit cannot run in this job ("": it can)
  FaultHook fault_;  // options_.debug_fault, disarmed once it fired
  // Accepts, authenticates and reads joins off this thread (join_gate.h).
  std::unique_ptr<JoinGate> gate_;
  std::vector<Member*> members_;  // the machine's numbering
  std::vector<Setup> trainer_setups_;
  // Set by setup() before any use; Never() only as the initial value.
  Deadline setup_deadline_ = Deadline::Never();
  HeartbeatTiming heartbeats_;
  bool ended_ = false;
  Status end_status_;
  ReportBuilder report_;
  ProgressLine progress_;
  Roster roster_;  // the expected ranks, and those that joined
  // Many engines: the relay tree of the live engines; joiners that came
  // during setup (admitted once the job runs) and those whose ranks all
  // joined, waiting for a refit boundary.
  EngineTree tree_;
  std::vector<JoinGate::Candidate> early_joiners_;
  std::set<std::uint64_t> waiting_;
  // For the summary line: every committed refit (every engine rank's bytes),
  // whether each was verified, and the failed refits recovered from.
  RefitTally tally_;
  bool every_commit_verified_ = true;
  std::uint64_t recovered_failures_ = 0;
};

}  // namespace refit
