#include "runtime/model_choice.h"

#include <algorithm>

#include "refit/expert_parallel.h"

namespace refit {

StatusOr<std::vector<ShardRulePattern>> shard_rules_from_text(const std::vector<std::string>& rules) {
  std::vector<ShardRulePattern> user;
  for (const std::string& text : rules) {
    ASSIGN_OR_RETURN(ShardRulePattern row, parse_shard_rule_pattern(text));
    user.push_back(std::move(row));
  }
  return shard_rules_with_defaults(user);
}

StatusOr<ModelChoice> open_model_choice(const std::string& preset_or_path, int layers,
                                        const std::vector<std::string>& rules) {
  ModelChoice choice;
  const std::vector<std::string> presets = model_presets();
  if (std::find(presets.begin(), presets.end(), preset_or_path) != presets.end()) {
    if (!rules.empty()) {
      return InvalidArgument("--rule applies to checkpoints; the preset '" + preset_or_path +
                             "' has its own shard rules");
    }
    ASSIGN_OR_RETURN(choice.model, make_model(preset_or_path, layers));
    return choice;
  }
  if (layers >= 0) {
    return InvalidArgument("--layers " + std::to_string(layers) + " applies to presets, not to the checkpoint '" +
                           preset_or_path + "'");
  }
  auto checkpoint = Checkpoint::Open(preset_or_path);
  if (!checkpoint.ok()) {
    return Status(checkpoint.status().code(),
                  "'" + preset_or_path + "' is not a preset (" + [&] {
                    std::string names;
                    for (const auto& p : presets) names += (names.empty() ? "" : ", ") + p;
                    return names;
                  }() + ") and not a readable checkpoint: " + checkpoint.status().message());
  }
  ASSIGN_OR_RETURN(std::vector<ShardRulePattern> table, shard_rules_from_text(rules));
  ASSIGN_OR_RETURN(choice.model, model_from_checkpoint(*checkpoint, table));
  choice.checkpoint = std::make_unique<Checkpoint>(std::move(*checkpoint));
  return choice;
}

StatusOr<ModelChoice> open_engine_model(const RankOptions& options) {
  ASSIGN_OR_RETURN(ModelChoice choice, open_model_choice(options.model, options.layers, options.shard_rules));
  ASSIGN_OR_RETURN(const EngineExperts experts, parse_engine_experts(options.engine_experts));
  ASSIGN_OR_RETURN(choice.model, engine_expert_model(std::move(choice.model), experts, options.engine_ranks));
  ASSIGN_OR_RETURN(const QuantizeSpec quantize, parse_quantize(options.quantize));
  if (quantize.format == QuantFormat::kNone) return choice;
  ASSIGN_OR_RETURN(choice.quantized, quantize_model(choice.model, quantize, options.engine_ranks));
  choice.unquantized = std::move(choice.model);
  choice.model = choice.quantized.engine;
  return choice;
}

}  // namespace refit
