// The model a trainer or engine process works on: a preset (model.h) or a
// safetensors checkpoint on disk (checkpoint.h), named by one string so that
// every command takes `--model tiny` and `--model /path/to/checkpoint` alike.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "refit/checkpoint.h"
#include "refit/model.h"
#include "refit/quantize.h"
#include "refit/roles.h"
#include "refit/status.h"

namespace refit {

struct ModelChoice {
  Model model;
  // Set when the model came from a checkpoint: its mapped files hold the
  // bytes every refit of it must deliver.
  std::unique_ptr<Checkpoint> checkpoint;
  // An engine's --quantize (quantize.h): `model` is the engine's model of
  // `quantized.engine`'s weights, `unquantized` the model they come from,
  // and quantized.sources what each weight holds of it. Empty sources: no
  // conversion.
  Model unquantized;
  QuantizedModel quantized;
};

// A preset name opens the preset (keeping `layers` decoder layers, -1: all);
// anything else is opened as a checkpoint path, its TP rules decided by
// `rules` ("GLOB=RULE" rows, ahead of default_shard_rules()). `layers` must
// be -1 for a checkpoint. Errors name the model and say which it was taken for.
StatusOr<ModelChoice> open_model_choice(const std::string& preset_or_path, int layers,
                                        const std::vector<std::string>& rules);

// An engine rank's model: open_model_choice of its --model, --layers and
// --rule rows, its expert tensors split by --engine-experts
// (engine_expert_model, expert_parallel.h), then its --quantize conversions
// (quantize_model; `quantized` and `unquantized` set when there are any).
StatusOr<ModelChoice> open_engine_model(const RankOptions& options);

// The rows of `rules` ("GLOB=RULE") followed by the default table.
StatusOr<std::vector<ShardRulePattern>> shard_rules_from_text(const std::vector<std::string>& rules);

}  // namespace refit
