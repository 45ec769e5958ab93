// Coordinator: the control plane of one refit job.
//
// Trainer and engine ranks connect over TCP and join with their role, rank,
// device, settings and plan digest. At setup the coordinator validates the
// whole topology and rejects what is unsupported or inconsistent, with an
// error that names the setting and both values (DESIGN.md rules 1, 4, 10).
// Then, for each refit, it drives every rank through
//   start(version) -> ready -> go -> sent/applied (+ progress) -> done
//   -> commit(version) -> committed
// and only commits when every rank reported success (rule 6). A failure on
// any rank, a lost connection or a missed deadline aborts the refit on every
// rank with an error that names the rank and the phase.
//
// Topology: engine rank e is fed by the trainer ranks t with t % E == e (in
// increasing t); trainer ranks must be at least as many as engine ranks.
//
// The report: run_coordinator returns a JobReport whose `json` is the
// document `refit coordinator` prints (the same as `refit demo --json`:
// every committed refit with its figures, every rank's stats, warnings) and
// whose other fields are read from it.
//
// Thread safety: run_coordinator runs on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "refit/fault_hook.h"
#include "refit/secret.h"
#include "refit/status.h"

namespace refit {

struct CoordinatorOptions {
  // host:port to listen on; port 0: any free port. Default: "127.0.0.1:0"
  // (loopback unless told otherwise).
  std::string listen = "127.0.0.1:0";
  // Trainer ranks expected. Default: 1.
  int trainer_ranks = 1;
  // Engine ranks expected per engine (TP size). Default: 1.
  int engine_ranks = 1;
  // Engines (replicas of engine_ranks ranks each, `refit engine --engine
  // k`). Engine 0 is fed by the trainer ranks; each other engine by its
  // parent in a relay tree of fanout relay_fanout (1: a chain), so the
  // trainers' links carry each byte once whatever the count. A refit
  // commits only once every rank of every engine has it. Default: 1.
  int engines = 1;
  int relay_fanout = 1;
  // Engine slots: engines E..max_engines-1 may join the running job (`refit
  // engine --engine k` started later, ranks checked against engine 0's). At
  // the next refit boundary the coordinator admits it: it first receives
  // the last committed version from its parent in the relay tree (not from
  // the trainers), commits and verifies it, and only then counts as live.
  // 0: engines (no joining). Default: 0.
  int max_engines = 0;
  // The fewest engines the job goes on with: an engine whose rank dies,
  // stalls past the heartbeat deadline or misses a refit's deadline is
  // dropped while at least this many stay (its relay children are fed by
  // its parent from then on; a refit in flight is aborted and run again on
  // the others; the report names the lost engine and rank). Engine 0, fed by
  // the trainers, goes the same way: the trainer ranks then link to the next
  // live engine, the relay tree's new root. 0: every engine (a lost engine
  // ends the job). Default: 0.
  int min_engines = 0;
  // Refits to run; 0: on demand, each refit asked for by every trainer rank
  // (TrainerRank::refit). Default: 1.
  int refits = 1;
  // Seed of the synthetic weights (presets). Default: 0.
  std::uint64_t seed = 0;
  // Seconds until every rank joined and linked. Default: 60.
  double setup_timeout_s = 60;
  // Seconds for one whole refit; suits multi-GB refits on CPU. Default: 300.
  double refit_timeout_s = 300;
  // Liveness (control/protocol.h): a heartbeat to every rank each this many
  // seconds. Default: 1.
  double heartbeat_interval_s = 1;
  // A rank heard nothing from for this many seconds is lost, named, in any
  // phase (idle between on-demand refits included): a stalled (SIGSTOP),
  // dead or cut-off rank ends the job this soon. Must exceed every rank's
  // heartbeat interval. Default: 10.
  double heartbeat_timeout_s = 10;
  // Seconds a new connection has to authenticate and send its join; one
  // that takes longer is refused, named. Handshakes run off the refit loop,
  // so a slow or silent one never holds up a refit. Default: 5.
  double handshake_timeout_s = 5;
  // On-demand jobs (refits == 0): seconds to wait for a replacement process
  // of a trainer rank lost while a refit is in flight (before its commit
  // decision). The refit is aborted; the engines keep their committed
  // version; a `refit trainer` (or refit.Trainer) started again with the
  // same rank and the same plan joins, and the next refit commits. 0 (the
  // default): a lost rank ends the job.
  double trainer_replace_timeout_s = 0;
  // Colocated jobs (trainer and engine on one GPU): after every commit the
  // trainer ranks close their mappings of the engines' memory and free their
  // staging, then the engine ranks free their receive pools; before the next
  // refit the engine ranks allocate them again and the trainers open them
  // (protocol release / acquire). The report gives per refit the bytes each
  // engine rank returned. A failure while releasing or acquiring ends the
  // job keeping the committed version. Default: false.
  bool release_between_refits = false;
  // Partial refits (refit/partial.h): refits from `only_from` on move only
  // the tensors these whole-name globs ('*' only) select, each with its own
  // plan and digest; the version still applies to the whole engine. Every
  // glob must select a tensor of engine rank 0's stream. The first refit,
  // and the one after an engine's weights were left incomplete, move every
  // tensor (with a note). Empty (the default): every refit is full. On
  // demand, Trainer refit(version, only) asks instead.
  std::vector<std::string> only;
  std::uint64_t only_from = 2;
  // Draw a progress bar (through refit::log). Default: false.
  bool progress = false;
  // Log each join and refusal. Default: true.
  bool log_joins = true;
  // Ranks must prove they know this secret, and the coordinator proves it
  // to them (control/auth.h). Empty: no authentication, allowed only on a
  // loopback address (a warning is logged once); listening on any other
  // address without a secret is refused at setup. Default: empty.
  Secret secret;
  // Where the report is kept while the job runs: written (atomically: a
  // reader sees the old file or the new one) at every commit decision,
  // before commit(v) goes out, and once more at the job's end. A
  // coordinator killed mid-job so leaves a report that names the last
  // committed version. Empty: no file (run_coordinator still returns the
  // report). Default: empty.
  std::string report_path;
  // Fault injection for tests: kill or stop the coordinator at one step of
  // the control protocol in one refit (refit/fault_hook.h). Default: off.
  FaultHook debug_fault;
};

// The topology rule every process checks before anything else: at least one
// rank of each role. Full-weight trainers also need at least as many trainer
// ranks as engine ranks (validate_full_trainer_counts, trainer_layout.h);
// sharded trainers may be fewer (one feeds several engine ranks), so the
// coordinator and the engines, which learn the layout from the joins, check
// that at setup.
Status validate_rank_counts(int trainer_ranks, int engine_ranks);

// What a job ended with. `status` is OK when the job ran to its end (every
// refit committed), otherwise the job's error, with the code it was reported
// with; `verified` is true only when, besides, every engine rank compared
// every byte of every refit and all matched (engines run with --no-verify
// leave it false).
struct JobReport {
  Status status;
  bool verified = false;
  std::uint64_t committed_version = 0;  // the last version the coordinator decided to commit
  std::string json;                     // the whole report (JSON text)
};

// Runs setup and `refits` refits (or on-demand refits until every trainer
// rank finished) and returns the report; a failed job's report still holds
// every refit that committed before the failure. `on_listening(port)` is
// called once the socket listens.
JobReport run_coordinator(const CoordinatorOptions& options, const std::function<void(int port)>& on_listening);

}  // namespace refit
