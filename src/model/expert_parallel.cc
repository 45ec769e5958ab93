#include "refit/expert_parallel.h"

#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace refit {
namespace {

constexpr std::string_view kExperts = ".experts.";

// Where a name is an expert tensor: its layer prefix (up to ".experts.")
// and its expert index (nullopt: stacked).
struct ExpertName {
  std::string layer;
  std::optional<int> expert;
};

std::optional<ExpertName> expert_name(const std::string& name) {
  const std::size_t at = name.find(kExperts);
  if (at == std::string::npos) return std::nullopt;
  std::size_t i = at + kExperts.size();
  ExpertName out{name.substr(0, at), std::nullopt};
  if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return out;
  long long j = 0;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])) && j <= 1'000'000; ++i) {
    j = j * 10 + (name[i] - '0');
  }
  if (i >= name.size() || name[i] != '.') return std::nullopt;  // "experts.12abc": not an expert index
  out.expert = static_cast<int>(j);
  return out;
}

std::string model_text(const Model& model) { return "model '" + model.preset + "'"; }

}  // namespace

std::string_view engine_experts_name(EngineExperts experts) {
  return experts == EngineExperts::kEp ? "ep" : "tp";
}

StatusOr<EngineExperts> parse_engine_experts(std::string_view text) {
  if (text == "tp") return EngineExperts::kTp;
  if (text == "ep") return EngineExperts::kEp;
  return InvalidArgument("--engine-experts '" + std::string(text) +
                         "': expected tp (experts split by their TP rules) or ep (whole experts per engine rank)");
}

StatusOr<Model> engine_expert_model(Model model, EngineExperts experts, int engine_ranks) {
  if (experts == EngineExperts::kTp) return model;
  std::map<std::string, std::set<int>> layers;  // per layer prefix: its expert indices
  bool any = false;
  for (Weight& w : model.weights) {
    const std::optional<ExpertName> e = expert_name(w.spec.name);
    if (!e) continue;
    if (!e->expert && w.spec.shape.size() < 2) continue;  // not a stacked [E, ...] weight
    // A per-expert scalar (an FP8 checkpoint's input_scale) has no rows to
    // hold or not: it keeps its rule (replicated, a few bytes per rank).
    if (w.spec.shape.empty()) continue;
    any = true;
    w.rule = ShardRule::kExpert;
    if (e->expert) {
      w.expert = *e->expert;
      layers[e->layer].insert(*e->expert);
      continue;
    }
    w.expert = -1;
    w.experts = static_cast<int>(w.spec.shape[0]);
    if (w.experts < engine_ranks) {
      return InvalidArgument(model_text(model) + ", --engine-experts ep: stacked expert tensor '" +
                             w.spec.ToString() + "' has " + std::to_string(w.experts) + " experts for " +
                             std::to_string(engine_ranks) + " engine ranks (each rank needs at least one)");
    }
  }
  if (!any) {
    return InvalidArgument(model_text(model) + ", --engine-experts ep: the model has no expert tensors "
                           "(names with '.experts.'); use --engine-experts tp");
  }
  for (const auto& [layer, indices] : layers) {
    const int count = static_cast<int>(indices.size());
    if (*indices.rbegin() != count - 1) {
      return InvalidArgument(model_text(model) + ", --engine-experts ep: layer '" + layer + "' has " +
                             std::to_string(count) + " experts numbered up to " +
                             std::to_string(*indices.rbegin()) + " (expected 0.." + std::to_string(count - 1) + ")");
    }
    if (count < engine_ranks) {
      return InvalidArgument(model_text(model) + ", --engine-experts ep: layer '" + layer + "' has " +
                             std::to_string(count) + " experts for " + std::to_string(engine_ranks) +
                             " engine ranks (each rank needs at least one)");
    }
  }
  for (Weight& w : model.weights) {
    if (w.rule != ShardRule::kExpert || w.expert < 0) continue;
    w.experts = static_cast<int>(layers[expert_name(w.spec.name)->layer].size());
  }
  return model;
}

}  // namespace refit
