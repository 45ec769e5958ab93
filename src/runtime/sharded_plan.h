// What a sharded trainer rank computes at setup, before it joins (issue
// 19): the transfer plan from its side's layouts into the engine ranks'
// shard rules and, per engine rank it feeds, that rank's bucket plan and
// this rank's share of each bucket (the bucket feed).
//
// A trainer that names its tensors as the engine does (`--trainer-names
// hf`) plans with make_transfer_plan over one list of tensors; one that
// names them as Megatron-Core does (`--trainer-names megatron`) plans with
// make_mapped_transfer_plan between its Megatron tensors and the engine's
// Hugging Face tensors, joined by the name map (reshard/megatron_model.h).
// Either way the engine ranks' streams are their own tensors' shards, so
// the engines need not know how the trainer names its tensors: its feeds
// must cover their buckets exactly, as the coordinator checks.
//
// Thread safety: values; make_sharded_plan is pure.
#pragma once

#include <vector>

#include "refit/model.h"
#include "refit/plan.h"
#include "refit/roles.h"
#include "refit/status.h"
#include "refit/transfer_plan.h"
#include "refit/weight_source.h"
#include "reshard/bucket_feed.h"

namespace refit {

struct ShardedPlan {
  TransferPlan transfer;
  struct Fed {
    int engine_rank = 0;
    Plan plan;
    BucketFeed feed;
  };
  std::vector<Fed> fed;  // ascending engine rank, only those this rank writes into
};

// The plan of trainer rank options.rank, whose `source` holds its local
// shards (source.trainer_layouts(), over options.trainer_ranks), into
// options.engine_ranks engine ranks splitting the engine's model by its
// shard rules (model.h) and options.engine_experts. The engine's model is
// source.model() for --trainer-names hf; for megatron it is the preset's
// (options.model, options.layers) and source.model() must hold the
// preset's Megatron tensors. Errors name the tensor (make_transfer_plan's,
// make_mapped_transfer_plan's, make_bucket_feed's), or the first Megatron
// tensor the source lacks.
StatusOr<ShardedPlan> make_sharded_plan(const WeightSource& source, const RankOptions& options);

}  // namespace refit
