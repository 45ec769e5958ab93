// A trainer rank's join (control/protocol.h Join): its settings, and either
// its plan of the engine rank it feeds (digest, specs, the rule that cut
// each, one tensor per dtype) or, sharded, its layout, transfer digest and
// feeds. Split out of trainer_rank.cc.
#pragma once

#include "control/protocol.h"
#include "refit/model.h"
#include "refit/plan.h"
#include "refit/roles.h"
#include "refit/trainer_layout.h"
#include "runtime/sharded_plan.h"

namespace refit {

// What the join says about the rank beyond its options.
struct TrainerJoinFacts {
  const Model* model = nullptr;  // the trainer's model (the rules of the fed stream)
  const Plan* plan = nullptr;    // full weights: its plan of the fed engine rank's stream
  int engine_rank = 0;           // full weights: the engine rank it feeds
  bool on_device = false;        // the source's weights are in device memory
  int device = -1;               // the source's CUDA device (its UUID goes in the join)
  const TrainerLayout* layout = nullptr;  // sharded: the layout
  const ShardedPlan* sharded = nullptr;   // sharded: the plans; null for full weights
};

Join trainer_join(const RankOptions& options, const TrainerJoinFacts& facts);

}  // namespace refit
