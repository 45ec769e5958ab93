// A sharded trainer rank's plans: see sharded_plan.h.
#include "runtime/sharded_plan.h"

#include "refit/expert_parallel.h"
#include "refit/mapped_transfer_plan.h"
#include "reshard/megatron_model.h"

namespace refit {
namespace {

// The engine's tensors as a transfer plan's side: each split by its rule.
std::vector<SideTensor> engine_side(const Model& engine, int engine_ranks) {
  std::vector<SideTensor> out;
  for (const Weight& w : engine.weights) out.push_back(SideTensor{w.spec, engine_layout(w, engine_ranks)});
  return out;
}

// The mapped plan from the source's Megatron tensors into the preset's
// engine tensors; `engine` receives the engine's model (its expert rules).
StatusOr<TransferPlan> megatron_plan(const WeightSource& source, const RankOptions& options, Model* engine) {
  ASSIGN_OR_RETURN(MegatronModel m, megatron_model(options.model, options.layers));
  ASSIGN_OR_RETURN(const EngineExperts experts, parse_engine_experts(options.engine_experts));
  ASSIGN_OR_RETURN(*engine, engine_expert_model(std::move(m.engine), experts, options.engine_ranks));
  const std::vector<Weight>& held = source.model().weights;
  const std::vector<Layout> layouts = source.trainer_layouts();
  if (held.size() != m.trainer.weights.size() || layouts.size() != held.size()) {
    return InvalidArgument("--trainer-names megatron: the source holds " + std::to_string(held.size()) +
                           " tensors with " + std::to_string(layouts.size()) + " layouts, model preset \"" +
                           options.model + "\" has " + std::to_string(m.trainer.weights.size()) + " Megatron tensors");
  }
  MappedTransferInput input;
  for (std::size_t i = 0; i < held.size(); ++i) {
    if (held[i].spec != m.trainer.weights[i].spec) {
      return InvalidArgument("--trainer-names megatron: tensor " + std::to_string(i) + " of the source is " +
                             held[i].spec.ToString() + ", Megatron's is " + m.trainer.weights[i].spec.ToString());
    }
    input.trainer.push_back(SideTensor{held[i].spec, layouts[i]});
  }
  input.engine = engine_side(*engine, options.engine_ranks);
  input.correspondences = std::move(m.correspondences);
  input.trainer_ranks = options.trainer_ranks;
  input.engine_ranks = options.engine_ranks;
  return make_mapped_transfer_plan(std::move(input));
}

}  // namespace

StatusOr<ShardedPlan> make_sharded_plan(const WeightSource& source, const RankOptions& options) {
  ASSIGN_OR_RETURN(const TrainerNames names, parse_trainer_names(options.trainer_names));
  ShardedPlan out;
  Model engine = source.model();
  if (names == TrainerNames::kMegatron) {
    ASSIGN_OR_RETURN(out.transfer, megatron_plan(source, options, &engine));
  } else {
    const std::vector<Layout> layouts = source.trainer_layouts();
    std::vector<TensorLayouts> tensors;
    for (std::size_t i = 0; i < engine.weights.size(); ++i) {
      const Weight& w = engine.weights[i];
      tensors.push_back(TensorLayouts{w.spec, layouts[i], engine_layout(w, options.engine_ranks)});
    }
    ASSIGN_OR_RETURN(out.transfer,
                     make_transfer_plan(std::move(tensors), options.trainer_ranks, options.engine_ranks));
  }
  for (int e = 0; e < options.engine_ranks; ++e) {
    if (out.transfer.pair(options.rank, e).bytes == 0) continue;
    ShardedPlan::Fed fed;
    fed.engine_rank = e;
    ASSIGN_OR_RETURN(fed.plan, make_plan(engine_stream(engine, e, options.engine_ranks), options.bucket_size));
    ASSIGN_OR_RETURN(fed.feed, make_bucket_feed(out.transfer, e, fed.plan));
    out.fed.push_back(std::move(fed));
  }
  return out;
}

}  // namespace refit
