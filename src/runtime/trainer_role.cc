// The trainer role as a process runs it: its weight source from the
// options, then a TrainerRank serving the job (roles.h: make_rank_source,
// run_trainer). The rank itself: trainer_rank.cc.
#include <algorithm>

#include "refit/checkpoint.h"
#include "refit/roles.h"
#include "refit/trainer_layout.h"
#include "refit/trainer_rank.h"
#include "refit/weight_source.h"
#include "runtime/model_choice.h"
#include "runtime/setup_failure.h"
#include "runtime/shard_source.h"

namespace refit {
namespace {

// A Megatron-named trainer rank's shards (--trainer-names megatron). FSDP
// only: Megatron's TP shard of linear_fc1 is [gate_r; up_r], not one box of
// the tensor (reshard/name_map.h), so a tp level has no layout yet.
StatusOr<std::unique_ptr<WeightSource>> megatron_source(const RankOptions& options, const TrainerLayout& layout) {
  if (layout.full || layout.tp > 1) {
    return InvalidArgument("--trainer-names megatron with --trainer-layout " + options.trainer_layout +
                           ": Megatron-named trainers run with --trainer-layout fsdp in this build (a full "
                           "trainer names its tensors as the engine does; Megatron's TP shard of linear_fc1 is "
                           "[gate_r; up_r], not one box of the tensor)");
  }
  ASSIGN_OR_RETURN(const MegatronModel model, megatron_model(options.model, options.layers));
  ASSIGN_OR_RETURN(const std::uint64_t change, change_parts(options.change_fraction));
  ASSIGN_OR_RETURN(std::vector<Layout> layouts, trainer_layouts(layout, model.trainer));
  return make_megatron_shard_source(model, std::move(layouts), options.rank,
                                    options.device == "cuda" ? MemoryKind::kCuda : MemoryKind::kHost, options.gpu,
                                    change);
}

}  // namespace

StatusOr<std::unique_ptr<WeightSource>> make_rank_source(const RankOptions& options) {
  const std::vector<std::string> presets = model_presets();
  if (std::find(presets.begin(), presets.end(), options.model) != presets.end() && options.shard_rules.empty()) {
    const bool on_device = options.device == "cuda";
    ASSIGN_OR_RETURN(const TrainerLayout layout, parse_trainer_layout(options.trainer_layout, options.trainer_ranks));
    ASSIGN_OR_RETURN(const TrainerNames names, parse_trainer_names(options.trainer_names));
    if (names == TrainerNames::kMegatron) return megatron_source(options, layout);
    ASSIGN_OR_RETURN(const QuantizeSpec quantize, parse_quantize(options.quantize));  // finite where quantized
    ASSIGN_OR_RETURN(const std::uint64_t change, change_parts(options.change_fraction));
    if (!layout.full) {
      ASSIGN_OR_RETURN(Model model, make_model(options.model, options.layers));
      ASSIGN_OR_RETURN(std::vector<Layout> layouts, trainer_layouts(layout, model));
      return make_synthetic_shard_source(options.model, options.layers, std::move(layouts), options.rank,
                                         on_device ? MemoryKind::kCuda : MemoryKind::kHost, options.gpu, quantize,
                                         change);
    }
    return make_synthetic_source(options.model, options.layers, on_device ? MemoryKind::kCuda : MemoryKind::kHost,
                                 options.gpu, quantize, change);
  }
  if (options.trainer_names != "hf") {
    return InvalidArgument("--trainer-names " + options.trainer_names + ": Megatron names are generated for a "
                           "preset (--model " + options.model + " is a checkpoint, read under its own names)");
  }
  if (options.trainer_layout != "full") {
    return InvalidArgument("--trainer-layout " + options.trainer_layout +
                           ": sharded trainers generate a preset's shards (--model " + options.model +
                           " is a checkpoint); a checkpoint is read whole (--trainer-layout full)");
  }
  if (options.device == "cuda") {
    return InvalidArgument("--device cuda: a checkpoint's weights are read into host memory; use --device cpu "
                           "(device engines are still fed, through pinned memory)");
  }
  ASSIGN_OR_RETURN(ModelChoice choice, open_model_choice(options.model, options.layers, options.shard_rules));
  ASSIGN_OR_RETURN(std::vector<ShardRulePattern> rules, shard_rules_from_text(options.shard_rules));
  return make_checkpoint_source(std::move(*choice.checkpoint), rules);
}

Status run_trainer(const RankOptions& options) {
  const std::string name = "trainer rank " + std::to_string(options.rank);
  // Before the weights are made: --device cuda without a usable GPU fails
  // here, not in an allocation.
  // (validate_rank_settings names the rank itself.)
  const Status settings = validate_rank_settings(options, /*engine=*/false);
  StatusOr<std::unique_ptr<WeightSource>> source =
      settings.ok() ? make_rank_source(options) : StatusOr<std::unique_ptr<WeightSource>>(settings);
  if (!source.ok()) {
    // The coordinator and the other ranks hear why now, not at the setup deadline.
    report_setup_failure(options, Role::kTrainer, source.status());
    return settings.ok() ? source.status().WithContext(name) : settings;
  }
  ASSIGN_OR_RETURN(auto rank, TrainerRank::Join(options, std::move(*source)));
  return rank->serve();
}

}  // namespace refit
