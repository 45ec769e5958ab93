// The name maps' tables (name_map_tables.cc): the rule types and, per
// family and format, the tensors in checkpoint order. Private to
// src/reshard/name_map*.cc; name_map.h is the contract.
#pragma once

#include <array>
#include <string_view>
#include <vector>

#include "reshard/name_map.h"

namespace refit::name_map_detail {

// The logical weights, one per Hugging Face tensor of a layer (or of the
// model, or of an expert for Qwen3-MoE's gate, up and down).
enum class Component : unsigned char {
  kEmbed, kFinalNorm, kLmHead, kInputNorm, kPostAttnNorm, kQ, kK, kV, kQNorm, kKNorm, kO, kRouter,
  kGate, kUp, kDown,
};

enum class Format : unsigned char { kMegatron, kHf, kVllm };

// Which instances of a rule exist.
enum class Scope : unsigned char {
  kModel,           // one tensor
  kLayer,           // one per layer: "{L}" in the name
  kExpert,          // one per layer and expert: "{L}" and "{E}"
  kStackedExperts,  // one per layer; dim 0 runs over the experts, index j holds expert j
};

// How a fused tensor orders its components' rows.
enum class Rows : unsigned char {
  kConcat,         // all rows of the first component, then the second's, ...
  kPerQueryGroup,  // per kv head g: the g-th of kv_heads equal blocks of each component in turn
};

// One tensor of a format: its name template and its components in order.
struct Rule {
  std::string_view name;
  Scope scope = Scope::kLayer;
  Rows rows = Rows::kConcat;
  std::array<Component, 3> parts{};
  int part_count = 0;
};

constexpr Rule whole(std::string_view name, Scope scope, Component c) {
  return Rule{name, scope, Rows::kConcat, {c, c, c}, 1};
}
constexpr Rule fused(std::string_view name, Scope scope, Rows rows, Component a, Component b) {
  return Rule{name, scope, rows, {a, b, b}, 2};
}
constexpr Rule fused(std::string_view name, Scope scope, Rows rows, Component a, Component b, Component c) {
  return Rule{name, scope, rows, {a, b, c}, 3};
}

// The rules of one format, in checkpoint order: model tensors before the
// layers, the layer's tensors, model tensors after.
std::vector<Rule> rules_of(ModelFamily family, Format format, MegatronExperts experts);

}  // namespace refit::name_map_detail
