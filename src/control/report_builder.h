// The job's report document as the coordinator builds it (refit/coordinator.h,
// "The report"): the topology at setup, every committed refit with its
// figures and every rank's stats, every failure recovered from, and at the
// end the error or the verdict, and what each engine rank holds
// (`engines_at_end`, engine_holdings.h). With a path it keeps the report file up to
// date while the job runs: written atomically at setup and at every commit
// decision (before commit(v) goes out), marked unfinished, so a coordinator
// killed at any moment leaves a file naming the last committed version.
//
// Thread safety: none; the coordinator's thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "control/control_message.h"
#include "control/engine_holdings.h"
#include "control/protocol.h"
#include "control/refit_phases.h"
#include "control/topology.h"
#include "refit/status.h"

namespace refit {

class ReportBuilder {
 public:
  // `path`: the report file kept while the job runs ("": none).
  explicit ReportBuilder(std::string path);

  // What setup decided: transport, mode, device, bucket size (of `first`,
  // every engine rank agreeing), batches and bytes per refit.
  // Many engines (issue 18): `engines` of topology.engine_setups.size() /
  // engines ranks each, relayed in a tree of `relay_fanout`: the report's
  // `engines` list and `relay` tree, each engine rank's stats named by
  // engine and rank.
  void set_topology(const Join& first, const Topology& topology, int engines = 1, int relay_fanout = 1);
  // The commit decision (refit_phases.h RecordCommit): the refit's figures,
  // every rank's stats, the transport's memory path, and from the trainer
  // ranks' stats (runtime/trainer_share.h) `gathered_bytes` (their sum) and
  // `duplicate_bytes` (the payload they wrote beyond one copy of every
  // engine rank's stream; the largest of any refit).
  void record_commit(const RecordCommit& commit);
  void record_failure(const RecordFailure& failure);
  // Many engines: engine drop.engine left the job (its `lost`, `lost_at`;
  // a joining engine refused is listed with `joined_at` null).
  void record_drop(const DropEngine& drop);
  // An engine joined the running job: listed with `joined_at` (the version
  // it caught up to), `fed_by` (its parent) and `catch_up` (that refit's
  // bytes, verified, and each rank's stats).
  void record_join(const RecordJoin& join);
  // Many engines: the tree of the live engines after it changed (an engine
  // dropped or joined): `relay.live` [{engine, fed_by (null: the
  // trainers)}]; `relay.parents` stays the tree of the setup.
  void record_tree(const std::vector<std::pair<std::uint64_t, std::optional<std::uint64_t>>>& tree);
  void record_recovery(const RecordRecovery& recovery);
  // --release-between-refits: the bytes each engine rank returned after the
  // refit, in its `refits` entry (`released_bytes`, by engine rank).
  void record_release(const RecordRelease& release);
  // go(version) went out: engines serving live weights are written from now
  // on (engine_holdings.h; the report's `engines_at_end`).
  void record_go(std::uint64_t version);

  std::uint64_t committed_version() const;
  std::uint64_t bytes_per_refit() const { return bytes_per_refit_; }
  // What one committed refit moved into one engine: bytes_per_refit, or a
  // partial refit's (its engine ranks' `refit_bytes`, the first live engine's).
  std::uint64_t refit_bytes(const RecordCommit& commit) const;

  // Rewrites the report file (when there is one) as it stands, marked
  // unfinished: "the coordinator wrote this report <when> and did not
  // finish the job". An error names the file.
  Status persist_running(const std::string& when) const;

  // The final document: `status`'s error, or (OK) verified when every byte
  // of every committed refit was compared and matched, no refit failed and
  // at least one committed.
  Json finish(const Status& status);

 private:
  void record_reads(const std::vector<Done>& engines);
  void record_engines(const RecordCommit& commit);
  Json engine_rank_stats(const std::vector<Done>& done, std::size_t first_engine = 0) const;
  Json& engine_entry(std::uint64_t engine);  // the `engines` entry of `engine` (appended when missing)
  std::string path_;
  std::size_t engines_ = 1, ranks_per_engine_ = 1;
  Json report_;
  std::uint64_t bytes_per_refit_ = 0;
  const char* memory_path_field_ = nullptr;  // the transport's (transport.h), or none
  bool all_verified_ = true;
  EngineHoldings holdings_;
};

}  // namespace refit
