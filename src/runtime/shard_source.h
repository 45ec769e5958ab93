// Synthetic sources of one sharded trainer rank's shards (shard_source.cc):
// make_synthetic_shard_source (refit/weight_source.h) for a trainer that
// names its tensors as the engine does, and the one here for a trainer that
// names them as Megatron-Core does (`--trainer-names megatron`).
#pragma once

#include <memory>
#include <vector>

#include "refit/layout.h"
#include "refit/status.h"
#include "refit/weight_source.h"
#include "reshard/megatron_model.h"

namespace refit {

// Trainer rank `rank`'s local shards of `model.trainer` (one layout per
// Megatron tensor, model order): data(i) holds the bytes of its box of
// Megatron tensor i, each byte the content (content.h) of the engine byte
// it corresponds to (model.content), so that engines verify what they
// receive against their own tensors' content. Errors as
// make_synthetic_shard_source's.
StatusOr<std::unique_ptr<WeightSource>> make_megatron_shard_source(const MegatronModel& model,
                                                                   std::vector<Layout> layouts, int rank,
                                                                   MemoryKind memory, int device,
                                                                   std::uint64_t change = kEveryElement);

}  // namespace refit
