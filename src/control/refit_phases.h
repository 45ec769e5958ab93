// RefitPhases: the coordinator's protocol as a pure state machine.
//
// It consumes events (a decoded message from rank X, X's connection lost,
// time passed) and returns actions (messages for every rank, a refit
// recorded as committed, a failure the job recovers from, the job's end).
// It owns no socket and reads no clock: every event comes with `now`, and
// wake_at() says when the machine wants a Tick. The I/O shell
// (coordinator.cc) accepts the ranks, feeds the machine and carries out what
// it returns; tests drive it with fake ranks (refit_phases_test.cc).
//
// The phases, per refit v (docs/DESIGN.md "Coordinator"):
//
//   setup --linked x all--> [idle: every trainer sends request(v) or finish]
//   start(v) -> prepare --ready x all--> go(v) -> transfer --sent x all-->
//   (sharded trainers under --quantize: in transfer, amax_share x every
//   trainer --> amax_table(v) to the trainers)
//   verify --done x all--> COMMIT DECISION: v committed, recorded now;
//   commit(v) -> commit --committed x all--> next refit (or shutdown)
//   (--release-between-refits: commit --committed x all--> release(v) to the
//   trainers --released x trainers--> release(v) to the engines --released
//   x all--> next refit, whose start first goes through acquire: acquire(w)
//   to the engines --acquired x engines--> acquire(w, descriptors) to the
//   trainers --linked x all--> start(w); release_phases.cc)
//
// Many engines (refit_phase_engines.cc, refit_phase_joins.cc): an engine
// lost is dropped while --min-engines stay; an engine whose ranks joined the
// running job is admitted at the next refit boundary (idle, or after a
// commit): its ranks get their Setup and the engine ranks relink around it
// (recovery, no abort); then its catch-up, v the last committed version:
// catch_up(v) to its parent's ranks, start(v) to its ranks --ready x its
// ranks--> go(v) --sent x parent, done x its ranks--> commit(v) to its ranks
// --committed x its ranks--> it is live, and the next refit starts. A
// failure in it refuses the joiner only.
//
// Before the decision, a failure (a rank's failed, a missed deadline) aborts
// v on every rank and relinks them (recovery), so the job goes on; a lost
// rank ends the job with abort(v). After the decision v stays committed:
// a rank lost, failed or stalled while the acks come in ends the job with a
// shutdown that carries the error and v, never an abort of v.
//
// Liveness, in every phase (idle included): the machine sends every rank a
// heartbeat each interval, and a rank it heard nothing from for the
// heartbeat deadline is lost, named, exactly as if its connection closed.
// A stopped rank (SIGSTOP) sends nothing, so its stall ends the job within
// the heartbeat deadline, not after a refit or setup deadline. The machine
// watches itself too: an event that comes more than the heartbeat deadline
// after its last heartbeat means the coordinator was stalled, every rank
// has given it up, and the job ends without deciding anything more.
//
// Members are numbered 0..T-1 (trainer ranks) then T..T+E-1 (engine ranks).
//
// Thread safety: none; one thread drives it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "control/protocol.h"
#include "refit/status.h"

namespace refit {

struct PhaseOptions {
  int trainer_ranks = 1;
  int engine_ranks = 1;  // of every engine slot together (max_engines of them)
  // Many engines: engine_ranks / max_engines ranks each (R); member T + k * R
  // + r is "engine k rank r" in messages (one engine: "engine rank r").
  // `engines` join at setup; engines [engines, max_engines) may join the
  // running job (refit_phase_joins.cc); 0: no more than `engines`.
  int engines = 1;
  int max_engines = 0;
  // The relay tree's fanout (relay_topology.h): a joining engine's parent,
  // which sends it the committed version, is found by the same rule.
  int relay_fanout = 1;
  // Many engines: the fewest engines the job goes on with (refit_phase_
  // engines.cc). An engine rank lost (or past a refit's deadline) drops its
  // engine while at least this many stay: a refit in flight is aborted and,
  // in scheduled jobs, run again on the others; the engines relink around
  // it. 0: every engine (a lost engine rank ends the job, as with one).
  int min_engines = 0;
  int refits = 1;  // 0: on demand (trainers send request/finish)
  double setup_timeout_s = 60;
  double refit_timeout_s = 300;
  // A rank's "failed" often comes from a peer that died: the machine waits
  // this long for a lost connection to blame before the failure stands.
  std::chrono::milliseconds blame_grace{500};
  // Liveness (see above). nullopt: none, for unit tests of the other rules;
  // the coordinator always sets it (CoordinatorOptions::heartbeat_*).
  std::optional<HeartbeatTiming> heartbeats;
  // Sharded trainers under --quantize: during each transfer every trainer
  // rank sends an amax_share, and once all did the machine sends the
  // trainer ranks the combined amax_table (control/amax_exchange.h).
  bool amax_exchange = false;
  // On demand only (refits == 0): a trainer rank lost while a refit is in
  // flight (before its commit decision) does not end the job: the refit is
  // aborted and recovered from as after a failure, and recovery waits this
  // long for a replacement process of that rank (the shell admits its join
  // and sends Replaced) instead of setup_timeout_s. 0: a lost rank ends the
  // job, as it always does in scheduled jobs.
  double trainer_replace_timeout_s = 0;
  // Direct mode over shadow weights: each start names the arena the
  // trainers write (Start::arena), 1 first, the other after each commit.
  bool alternate_arenas = false;
  // After each commit the ranks release refit's memory, and take it again
  // before the next start (see above). A failure in either phase ends the
  // job keeping the committed version (nothing of the next refit began).
  bool release_between_refits = false;
  // Partial refits, scheduled jobs (refit_phase_scope.cc): refits from
  // `only_from` on move only the tensors `only` selects (canonical globs,
  // refit/partial.h); empty: every refit is full. On demand the trainer
  // ranks' requests carry the globs instead. A partial refit needs whole
  // engines: the first refit, and the one after a recovery in which an
  // engine rank said its weights are incomplete, run full (with a note).
  std::vector<std::string> only;
  std::uint64_t only_from = 2;
  // Why this job's engines cannot take a partial refit ("": they can): a
  // trainer rank's partial ask then ends the job with it.
  std::string partial_refused;
};

using PhaseClock = std::chrono::steady_clock;
using PhaseTime = PhaseClock::time_point;

// ---- events

struct Received {
  int member = 0;
  RankMessage message;
};
struct Lost {
  int member = 0;
  std::string why;
};
struct Tick {};
// The shell admitted a replacement for `member` (awaits_replacement) and
// sent it its Setup: it is watched again and its linked is awaited.
struct Replaced {
  int member = 0;
};
// Many engines: every rank of engine `engine` (in [engines, max_engines))
// joined the running job and the shell checked their joins against engine
// 0's: it is admitted at the next refit boundary (refit_phase_joins.cc).
struct EngineJoined {
  int engine = 0;
};
using PhaseEvent = std::variant<Received, Lost, Tick, Replaced, EngineJoined>;

// ---- actions

// Send to every rank, or to the trainer ranks only (best effort once the
// job ended).
enum class Audience { kEveryRank, kTrainers, kEngines };
struct SendAll {
  CoordinatorMessage message;
  Audience audience = Audience::kEveryRank;
  std::vector<int> members;  // non-empty: only these members (the audience aside)
};
// The commit decision: refit `version` is committed from now on.
struct RecordCommit {
  std::uint64_t version = 0;
  std::vector<std::string> only;  // a partial refit's globs; empty: every tensor
  double seconds = 0;  // from go to the last rank's sent
  bool verified = true;
  std::vector<Done> engines, trainers;  // by rank
};
// Many engines: engine `engine` was dropped from the job during refit
// `version` (`why` names the rank and the cause): the shell shuts its ranks
// down and routes the relay around it before the relink that follows.
struct DropEngine {
  std::uint64_t engine = 0;
  std::uint64_t version = 0;
  Status why;
  bool joining = false;  // a joining engine refused before it was live (refit_phase_joins.cc)
};
// Many engines: engine `engine` joins the running job at this boundary: the
// shell sends its ranks their Setup (their place in the tree of the live
// engines with it), and the relink that follows carries each changed route.
struct AdmitEngine {
  std::uint64_t engine = 0;
  std::uint64_t version = 0;  // the committed version it will catch up to
};
// The joining engine committed `version` (sent by `parent`, verified when
// every rank said so): it is live from now on.
struct RecordJoin {
  std::uint64_t engine = 0;
  std::uint64_t version = 0;
  std::uint64_t parent = 0;
  bool verified = false;
  std::vector<Done> done;  // by rank
};
// A refit that failed before its decision and was aborted; recovery follows.
struct RecordFailure {
  std::uint64_t version = 0;
  Status error;
};
// Every rank relinked after a failure; the engines' state after it.
struct RecordRecovery {
  std::uint64_t version = 0;
  std::vector<Linked> engines;  // by rank
};
// Every rank released after refit `version` (release_between_refits): what
// each said it freed, by rank.
struct RecordRelease {
  std::uint64_t version = 0;
  std::vector<std::uint64_t> engine_bytes, trainer_bytes;
};
// A rank's progress during transfer: the bytes every rank sent so far.
struct ShowProgress {
  std::uint64_t version = 0;
  std::uint64_t bytes = 0;
  bool final = false;
};
struct Note {
  std::string line;
};
// The job ended (OK, or the error); the machine takes no more events.
struct EndJob {
  Status status;
};
using PhaseAction = std::variant<SendAll, RecordCommit, RecordFailure, RecordRecovery, RecordRelease, ShowProgress,
                                 Note, EndJob, DropEngine, AdmitEngine, RecordJoin>;

class RefitPhases {
 public:
  enum class Phase {
    kSetup, kIdle, kPrepare, kTransfer, kVerify, kCommit, kRelease, kAcquire, kBlame, kRecovery, kCatchUp, kEnded
  };

  explicit RefitPhases(const PhaseOptions& options);

  // Begins setup (the shell sent every rank its Setup): waits for linked,
  // until `linked_by` (the first: setup_timeout_s from now).
  std::vector<PhaseAction> start(PhaseTime now);
  std::vector<PhaseAction> start(PhaseTime now, PhaseTime linked_by);
  // The machine's one transition function.
  std::vector<PhaseAction> on(const PhaseEvent& event, PhaseTime now);

  // When the machine wants a Tick (PhaseTime::max(): never).
  PhaseTime wake_at() const;
  Phase phase() const { return phase_; }
  std::uint64_t committed_version() const { return decided_; }
  // Whether recovery waits for a new process of `member` (a lost trainer
  // rank of an on-demand job, trainer_replace_timeout_s).
  bool awaits_replacement(int member) const;
  std::string member_name(int member) const;

 private:
  // How far one rank got in the current step sequence. kAcquired comes
  // before kLinked (acquire, then link), kReleased after kCommitted.
  enum class Step { kNone, kAcquired, kLinked, kReady, kSent, kDone, kCommitted, kReleased };
  struct Member {
    Step step = Step::kNone;
    bool reported_failure = false;  // sent "failed" in the current refit
    std::optional<RankMessage> ask;  // on demand: its request or finish
    std::optional<Done> done;
    std::optional<Linked> linked;
    std::string plan_digest;  // its ready's: the plan it moves this refit by
    std::optional<std::vector<AmaxEntry>> amax;  // its amax_share of the refit
    std::uint64_t released_bytes = 0;            // its released
    std::string descriptor;                      // an engine rank's acquired
    std::uint64_t progress = 0;
    // Its connection closed while that did not end the job (it had
    // reported its failure): it cannot relink.
    std::optional<std::string> gone;
    bool replacing = false;  // lost; recovery waits for a new process of it
  };

  void on_message(int member, const RankMessage& message, PhaseTime now);
  void on_report(int member, Step step, const RankMessage& message, PhaseTime now);
  void on_failed(int member, const Failed& failed, PhaseTime now);
  void on_lost(int member, const std::string& why, PhaseTime now);
  bool replace_lost_trainer(int member, const std::string& why, PhaseTime now);
  void on_replaced(int member, PhaseTime now);
  void on_deadline(PhaseTime now);
  void check_silence(PhaseTime now);
  void beat(PhaseTime now);
  bool stalled_itself(PhaseTime now);
  PhaseTime phase_deadline() const;
  void on_ask(int member, const RankMessage& ask, PhaseTime now);
  void on_amax(int member, const AmaxShare& share, PhaseTime now);
  std::string missing_amax() const;
  void advance(PhaseTime now);
  void decide_idle(PhaseTime now);
  void decide_commit(PhaseTime now);
  void begin_refit(std::uint64_t version, PhaseTime now);
  void start_refit(std::uint64_t version, PhaseTime now);
  // Partial refits (refit_phase_scope.cc): the globs refit `version` moves
  // (`asked`: the trainer ranks' on demand), full while an engine is not
  // whole; the trainer ranks' asks agree; every rank's ready digest equals
  // that of the ranks it shares a stream with.
  std::vector<std::string> scope_of(std::uint64_t version, const std::vector<std::string>& asked);
  bool asks_agree(const std::vector<std::string>& first, const Request& request, int member);
  bool plans_agree(PhaseTime now);
  void note_engines_whole();
  // release_between_refits (release_phases.cc).
  void begin_release(PhaseTime now);
  void advance_release(PhaseTime now);
  void begin_acquire(std::uint64_t version, PhaseTime now);
  void advance_acquire(PhaseTime now);
  bool awaits(int member) const;
  Step furthest_step(int member) const;
  void next_refit(PhaseTime now);
  void fail(const Status& failure, PhaseTime now);
  void end(const Status& status);
  void enter(Phase phase, Step awaited);
  void send_to(CoordinatorMessage message, Audience audience);
  bool all_reached(Step step) const;
  bool all_trainers_reached(Step step) const;
  std::string waiting_for() const;
  std::string phase_name() const;
  std::string awaited_name() const;
  bool is_trainer(int member) const { return member < options_.trainer_ranks; }
  // Many engines (refit_phase_engines.cc).
  int engine_of(int member) const;  // -1: a trainer rank
  bool dropped(int member) const;
  int live_engines() const;
  bool drop_engines(const std::vector<int>& engines, const std::string& who, const std::string& why, PhaseTime now);
  bool drop_late_engines(PhaseTime now);
  void reroute_engines(PhaseTime now, const std::string& why, bool with_trainers = false);
  int root() const;  // the lowest live engine, which the trainer ranks feed
  void finish_recovery(PhaseTime now);
  int engine_slots() const { return options_.max_engines > 0 ? options_.max_engines : options_.engines; }
  int ranks_per_engine() const { return options_.engine_ranks / std::max(engine_slots(), 1); }
  std::vector<int> engine_members(int engine) const;
  // Engines joining (refit_phase_joins.cc).
  void on_engine_joined(int engine, PhaseTime now);
  void begin_catch_up(PhaseTime now);
  void start_catch_up(PhaseTime now);
  void on_catch_up(int member, const RankMessage& message, PhaseTime now);
  void advance_catch_up(PhaseTime now);
  bool catch_up_awaits(int member, Step step) const;
  bool catch_up_reached(Step step) const;
  void catch_up_lost(int member, const std::string& why, PhaseTime now);
  void refuse_joiner(const std::string& why, PhaseTime now, bool relink = true);
  void end_catch_up();
  std::string catch_up_waiting_for() const;

  PhaseOptions options_;
  std::vector<Member> members_;
  Phase phase_ = Phase::kSetup;
  Step awaited_ = Step::kLinked;
  std::uint64_t version_ = 0;   // the refit in flight (or last run)
  std::uint64_t decided_ = 0;   // the last version decided committed
  std::uint64_t landing_ = 1;   // alternate_arenas: the arena the next start names
  std::vector<std::string> only_;  // the refit in flight's globs (empty: every tensor)
  // Every live engine holds whole weights (a committed refit's every byte):
  // a partial refit may run. False until the first full commit, and after a
  // recovery in which an engine said otherwise.
  bool engines_whole_ = false;
  bool in_flight_ = true;       // setup or refit version_ undecided: a failure aborts it
  bool released_ = false;       // the ranks released after the last commit: acquire before a start
  bool second_stage_ = false;   // kRelease: the engines were asked; kAcquire: the trainers were
  PhaseTime deadline_ = PhaseTime::max();
  PhaseTime go_time_{}, last_sent_{};
  // kBlame: the failure that stands unless a lost rank explains it, and the
  // phase it happened in.
  Status blamed_;
  Phase blamed_phase_ = Phase::kSetup;
  PhaseTime blame_until_{};
  // kRecovery: the failure being recovered from.
  Status recovering_;
  // Many engines: the engines dropped so far; whether the recovery in
  // progress follows a failure (RecordRecovery) or a drop, and whether it
  // runs version_ again (a drop mid-refit, scheduled jobs); an engine
  // dropped after the decision: relink the engines once every live rank
  // committed.
  std::vector<bool> engine_dropped_;
  bool failure_recovery_ = false;
  bool retry_ = false;
  bool reroute_pending_ = false;
  bool reroute_trainers_ = false;  // the pending reroute moves the root: the trainer ranks relink too
  bool rerouting_ = false;  // kRecovery relinks the engines between refits (no abort: a failed is final)
  // Engines joining: those whose ranks all joined, in order of arrival; the
  // one being admitted (-1: none), its parent, and the refit version_ held
  // before its catch-up (version_ is the caught-up version meanwhile).
  std::vector<int> pending_joins_;
  int joining_ = -1;
  int parent_ = -1;
  std::uint64_t held_version_ = 0;
  // The last refused joiner's parent engine and the version it was sending:
  // its failed of that catch-up may still come while the engines relink.
  std::pair<int, std::uint64_t> refused_{-1, 0};
  // Liveness: when each member was last heard from (PhaseTime::max() once
  // it is lost: no longer watched), and when the next heartbeat is due.
  std::vector<PhaseTime> heard_;
  PhaseTime next_beat_ = PhaseTime::max();
  PhaseTime last_beat_{};  // the last heartbeat sent: the machine's own sign of life
  std::vector<PhaseAction> out_;
};

}  // namespace refit
