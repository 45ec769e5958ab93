// `refit push PATH`: the trainer side of a refit whose weights come from a
// safetensors checkpoint on disk (checkpoint.h).
//
// One process runs every trainer rank of the job (one thread each, ranks
// first_rank .. first_rank + ranks - 1), each a TrainerRank over the mapped
// checkpoint: it cuts each tensor into the shard of the engine rank it feeds
// by the shard-rules table and sends it. With an on-demand coordinator
// (--refits 0) the push asks for refit `version` and then finishes; with a
// scheduled one it takes part in every refit the coordinator runs.
#pragma once

#include <cstdint>
#include <string>

#include "refit/roles.h"

namespace refit {

struct PushOptions {
  RankOptions rank;           // shared settings; rank.rank is ignored
  int first_rank = 0;
  int ranks = -1;             // -1: every trainer rank (rank.trainer_ranks)
  std::uint64_t version = 1;  // on-demand coordinators: the version to ask for
  int repeat = 1;             // on-demand: refit versions version .. version + repeat - 1 (benchmarks)
};

// Returns the exit code (0 when every rank succeeded); prints a summary line.
int run_push(const PushOptions& options);

}  // namespace refit
