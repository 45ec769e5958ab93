// The trainer's side of `--engine-experts` (refit/expert_parallel.h): the
// engine splits each weight by the rules of the source's model, so under
// expert parallelism the trainer sees its source through a model whose
// expert tensors carry rule kExpert. The bytes, their device and the
// trainer's own layouts are the source's, unchanged.
#pragma once

#include <memory>

#include "refit/roles.h"
#include "refit/status.h"
#include "refit/weight_source.h"

namespace refit {

// `source` itself for --engine-experts tp, and for a trainer that does not
// name its tensors as the engine does (--trainer-names megatron: its
// sharded plan, runtime/sharded_plan.h, applies the expert rules to the
// engine's own tensors); for ep, a view of it whose
// model() is engine_expert_model(source->model(), kEp, engine_ranks).
// Errors: parse_engine_experts's and engine_expert_model's.
StatusOr<std::unique_ptr<WeightSource>> with_engine_experts(std::unique_ptr<WeightSource> source,
                                                            const RankOptions& options);

}  // namespace refit
