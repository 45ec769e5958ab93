// The coordinator's setup decisions, as pure functions of the ranks' joins:
// who may join, whether the joined ranks fit together (DESIGN.md rules 1, 4
// and 10; every error names the setting and both values), and what each
// rank is told in its Setup. No sockets: coordinator.cc calls these.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "control/protocol.h"
#include "refit/status.h"

namespace refit {

// "trainer rank 2", "engine rank 0".
std::string rank_name(Role role, int rank);
// What a joined rank is called: rank_name, or in a job of several engines
// "engine 1 rank 0" (relay_topology.h).
std::string join_name(const Join& join, int engines);

// Checks one join before the rank is admitted: its protocol version (a
// rank of another version is refused naming both), its role, rank and (an
// engine rank) engine within the job's counts. kFailedPrecondition saying
// why.
Status check_join(const Join& join, int trainer_ranks, int engine_ranks, int engines);

// What setup decided for a valid topology.
struct Topology {
  std::vector<Setup> trainer_setups, engine_setups;  // by rank
  std::uint64_t bytes_per_refit = 0;                 // every engine rank's stream
  std::uint64_t aligned_batches = 0;
  bool divergent_boundaries = false;  // the engine ranks' batch boundaries differ
  std::vector<std::string> warnings;  // for the log (ranks sharing a GPU ...)
};

// Every cross-rank check of the joined ranks (trainers[t], engines[e] joined
// as rank t, e), and the Setup each is sent. `seed` and `on_demand` go into
// every Setup.
// Every dtype trainer `t` sends (its join's stream_dtypes) is one engine
// `e` supports: kFailedPrecondition naming the dtype, a tensor and both ranks.
Status check_dtypes(const Join& t, const Join& e);

StatusOr<Topology> plan_topology(const std::vector<Join>& trainers, const std::vector<Join>& engines,
                                 std::uint64_t seed, bool on_demand);

}  // namespace refit
