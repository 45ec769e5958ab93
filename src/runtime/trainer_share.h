// What a trainer rank reports about its share of the weights (the report's
// `trainer_ranks` entries and the top-level `gathered_bytes` and
// `duplicate_bytes`, issue 19): the payload bytes it wrote into each engine
// rank, and the bytes it holds beyond its own shards. The coordinator's
// report sums them (control/report_builder.cc).
//
// Thread safety: values and pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "control/control_message.h"
#include "refit/plan.h"
#include "refit/status.h"
#include "refit/weight_source.h"

namespace refit {

// The payload bytes (tensor bytes, alignment padding apart) one trainer rank
// wrote into one engine rank in a refit.
struct EngineShare {
  int engine_rank = 0;
  std::uint64_t bytes = 0;
};

// The payload bytes of buckets first, first + step, ... of `plan`: what a
// full-weight trainer rank that feeds every step-th bucket writes.
// REQUIRES: step >= 1.
std::uint64_t payload_of_buckets(const Plan& plan, std::uint64_t first, std::uint64_t step);

// Bytes a trainer rank holds beyond its own shards: a source of full
// tensors (no trainer_layouts()) holds every weight whole, which a sharded
// trainer has to gather first, so all of its bytes count; a source of shards
// holds exactly its own boxes (the WeightSource contract): 0.
std::uint64_t gathered_bytes(const WeightSource& source);

// The stats fields of one trainer rank's share: `engines` [{`engine_rank`,
// `bytes`}] and `gathered_bytes`.
void add_share_fields(Json& stats, const std::vector<EngineShare>& shares, std::uint64_t gathered);

}  // namespace refit
