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
//
// What is sent comes from a WeightSource (weight_source.h). Host sources may
// feed device engines (cuda_ipc): each bucket is packed into pinned host
// memory and copied to the device, on local CUDA device options.gpu.
//
// Thread safety: one thread drives a TrainerRank.
#pragma once

#include <cstdint>
#include <memory>

#include "refit/status.h"
#include "refit/weight_source.h"
#include "refit/roles.h"

namespace refit {

// The source a `refit trainer` process sends: the synthetic preset of
// options.model, or the checkpoint at that path (read into host memory).
StatusOr<std::unique_ptr<WeightSource>> make_rank_source(const RankOptions& options);

class TrainerRank {
 public:
  static StatusOr<std::unique_ptr<TrainerRank>> Join(const RankOptions& options, std::unique_ptr<WeightSource> source);
  ~TrainerRank();

  Status serve();
  // On failure the error is returned; when recovered() the rank relinked and
  // the caller may ask for the next refit (or the same version again).
  Status refit(std::uint64_t version);
  bool recovered() const;
  Status finish();

  // The last version this rank saw committed (0 before the first).
  std::uint64_t committed_version() const;
  // True when the coordinator runs refits on demand (use refit/finish).
  bool on_demand() const;

  class Impl;

 private:
  explicit TrainerRank(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace refit
