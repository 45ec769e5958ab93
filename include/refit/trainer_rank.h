// TrainerRank: one trainer rank of a refit job, driven in-process.
//
// Join() validates the settings, joins the coordinator and links to the
// engine rank it feeds (rank % engine_ranks): the data-plane link and the
// transport target are opened once and kept for every refit. Then either
//   serve()          a coordinator-scheduled job (`refit coordinator --refits N`):
//                    takes part in every refit until the coordinator shuts down
//   refit(version)   an on-demand job (`--refits 0`): asks for refit `version`
//                    once this rank's weights are ready, takes part, and
//                    returns once every rank committed it
//   finish()         on-demand: this rank asks for no more refits
// After each committed refit, last_refit() says what it took on this rank
// (bytes, seconds, GB/s, the waits): a TrainerRefitReport for a training
// loop's log.
//
// What is sent comes from a WeightSource (weight_source.h). Host sources may
// feed device engines (cuda_ipc): each bucket is packed into pinned host
// memory and copied to the device, on local CUDA device options.gpu.
//
// Thread safety: one thread drives a TrainerRank.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "refit/status.h"
#include "refit/weight_source.h"
#include "refit/roles.h"

namespace refit {

// The source a `refit trainer` process sends: the synthetic preset of
// options.model, or the checkpoint at that path (read into host memory).
StatusOr<std::unique_ptr<WeightSource>> make_rank_source(const RankOptions& options);

// What one committed refit took on this rank, for a training loop's log.
// Times are wall-clock seconds on this rank; the waits are the parts of
// `seconds` this rank spent waiting for others.
struct TrainerRefitReport {
  std::uint64_t version = 0;
  std::vector<std::string> only;  // a partial refit's globs (canonical); empty: every tensor
  std::uint64_t buckets = 0;  // buckets this rank sent
  std::uint64_t bytes = 0;    // bytes this rank sent: its buckets' share of the plan
  // From the call (refit(): before asking for the version; serve(): the
  // coordinator's start) to the coordinator's commit.
  double seconds = 0;
  double send_s = 0;          // from 'go' until every bucket was sent and its copies finished
  double wait_start_s = 0;    // refit(): asking until the coordinator started it (the other trainer ranks)
  double wait_go_s = 0;       // ready until 'go' (every rank of the job ready)
  double wait_credits_s = 0;  // waiting for the engine rank's credits (free pool slots); part of send_s
  double wait_commit_s = 0;   // done until the commit (the other ranks finishing)

  // bytes / seconds, in GB/s (1e9 bytes); 0 when seconds is 0.
  double gb_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0; }
};

class TrainerRank {
 public:
  static StatusOr<std::unique_ptr<TrainerRank>> Join(const RankOptions& options, std::unique_ptr<WeightSource> source);
  ~TrainerRank();

  Status serve();
  // On failure the error is returned; when recovered() the rank relinked and
  // the caller may ask for the next refit (or the same version again).
  // `only`: a partial refit of the tensors these whole-name globs select
  // ('*' only; refit/partial.h), every trainer rank asking the same; empty:
  // every tensor. The coordinator runs it full while an engine does not
  // hold whole weights (the first refit, after a failed one), with a note;
  // last_refit().only says what moved. A glob that selects none of the
  // stream's tensors is refused before anything is asked; so are sharded
  // trainers and --quantize (not built yet). Under --delta a partial refit
  // goes as its bytes, and the next full one is encoded wherever the
  // buckets hold no tensor it moved.
  Status refit(std::uint64_t version, const std::vector<std::string>& only = {});
  bool recovered() const;
  Status finish();

  // The last version this rank saw committed (0 before the first).
  std::uint64_t committed_version() const;
  // The report of the last refit this rank saw committed (by refit() or
  // serve()); nullopt before the first. A failed refit leaves it unchanged.
  std::optional<TrainerRefitReport> last_refit() const;
  // True when the coordinator runs refits on demand (use refit/finish).
  bool on_demand() const;

  class Impl;

 private:
  explicit TrainerRank(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace refit
