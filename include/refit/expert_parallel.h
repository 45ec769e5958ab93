// Expert parallelism on the engine side (`--engine-experts ep`, issue 19):
// each engine rank holds whole experts, about E/N of them, instead of a TP
// slice of every expert. Attention, embeddings, norms and the router keep
// their TP rules (model.h); only expert tensors change rule.
//
// Expert tensors are recognised by name:
//   per expert   "<layer>.experts.<J>.<rest>" (Hugging Face, refit's
//                presets: mlp.experts.J.gate_proj.weight): rule kExpert,
//                Weight::expert = J; the layer's E is the number of its
//                experts, which must be exactly 0..E-1
//   stacked      "<layer>.experts.<rest>" of at least 2 dimensions whose
//                rest does not start with a digit (vLLM's w13_weight
//                [E, 2I, H]): rule kExpert, Weight::expert = -1, E = dim 0
// Experts are dealt to ranks as contiguous ranges (expert_owner, model.h),
// like vLLM's expert map. Every layer needs at least as many experts as
// there are engine ranks: a rank without experts is refused, named.
//
// Both sides must agree: the trainer's engine streams and the engine's
// stream are compared at setup (a mismatch names the first tensor that
// differs, with its rule).
//
// Thread safety: values; the functions are pure.
#pragma once

#include <string_view>

#include "refit/model.h"
#include "refit/status.h"

namespace refit {

enum class EngineExperts : unsigned char {
  kTp,  // experts split like every other weight, by their TP rules (default)
  kEp,  // expert parallel: whole experts per engine rank
};

// "tp", "ep".
std::string_view engine_experts_name(EngineExperts experts);
// Parses "tp" or "ep"; anything else is kInvalidArgument quoting the text.
StatusOr<EngineExperts> parse_engine_experts(std::string_view text);

// `model` with its expert tensors under `experts` over `engine_ranks` ranks:
// kTp returns it unchanged; kEp gives every expert tensor rule kExpert and
// its expert index and count. Errors (kInvalidArgument, naming the model and
// the tensor or layer): kEp on a model with no expert tensors, a layer whose
// expert indices are not 0..E-1, a layer (or stacked tensor) of fewer
// experts than engine_ranks.
StatusOr<Model> engine_expert_model(Model model, EngineExperts experts, int engine_ranks);

}  // namespace refit
