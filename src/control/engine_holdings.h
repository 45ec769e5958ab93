// What each engine rank holds, as far as the coordinator can tell from the
// protocol, for the report's `engines_at_end` (issue 21: a failed job's
// report still says, per engine rank, which version it serves, which
// version it last verified, and whether its weights are whole).
//
//   weight_version    the last version decided committed (every engine rank
//                     applies the commit it hears; one lost after the
//                     decision is named by the job's error)
//   verified_version  the last committed version whose `done` from this
//                     engine rank said every byte was verified
//   weights_complete  false from the moment go(v) of a refit after the last
//                     commit went out (trainers may write the weights the
//                     engine serves) unless the engine serves shadow weights
//                     (its done said so: a refit lands in the arena not
//                     served); after a recovery, what the rank said in its
//                     `linked`
//
// Thread safety: none; the coordinator's thread.
#pragma once

#include <cstdint>
#include <vector>

#include "control/control_message.h"
#include "control/refit_phases.h"

namespace refit {

class EngineHoldings {
 public:
  // `engine_ranks`: every engine rank of the setup's engines (listed from
  // the start), `ranks_per_engine` R: slot g is engine g / R's rank g % R.
  explicit EngineHoldings(std::size_t engine_ranks = 0, std::size_t ranks_per_engine = 1)
      : engines_(engine_ranks, Engine{0, 0, true, false, true}), ranks_(ranks_per_engine == 0 ? 1 : ranks_per_engine) {}

  // The commit decision of commit.version (its engines' done messages).
  void committed(const RecordCommit& commit);
  // go(version) went out to every rank.
  void went(std::uint64_t version);
  // Every rank relinked after a failure; the engines' word on what they hold.
  void recovered(const RecordRecovery& recovery);
  // An engine joined the running job having committed join.version (many
  // engines): its ranks are listed from now on.
  void joined(const RecordJoin& join);

  // [{engine, rank, weight_version, verified_version, weights_complete,
  // shadow}] of every listed engine rank.
  Json json() const;
  // Every engine rank's last done said it serves shadow weights.
  bool all_shadow() const;

 private:
  struct Engine {
    std::uint64_t weight_version = 0, verified_version = 0;
    bool complete = true, shadow = false;
    bool listed = false;  // a rank of the setup's engines, or of one that joined
  };
  std::vector<Engine> engines_;  // by engine slot k * R + r
  std::size_t ranks_ = 1;
};

}  // namespace refit
