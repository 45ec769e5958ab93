// `--trainer-layout`: see trainer_layout.h.
#include "refit/trainer_layout.h"

#include <charconv>
#include <cstdint>
#include <optional>

namespace refit {
namespace {

constexpr std::string_view kAccepted =
    "accepted: \"full\", \"fsdp\", \"tp\", or \"tp:X,fsdp:Y\" (either order, either part alone) with X * Y = the "
    "trainer ranks";

Status bad_text(std::string_view text, std::string_view why) {
  return InvalidArgument("trainer layout \"" + std::string(text) + "\": " + std::string(why) + "; " +
                         std::string(kAccepted));
}

// The X of "tp:X": a positive decimal integer and nothing else ("+2", "2x"
// and "0" are not degrees).
std::optional<int> parse_degree(std::string_view digits) {
  int value = 0;
  const char* end = digits.data() + digits.size();
  const auto [at, error] = std::from_chars(digits.data(), end, value);
  if (digits.empty() || error != std::errc() || at != end || value < 1) return std::nullopt;
  return value;
}

// Reads one part, "tp:X" or "fsdp:Y", into `out`; `seen` counts the parts
// of each kind so that "tp:2,tp:2" is refused.
Status parse_part(std::string_view text, std::string_view part, TrainerLayout& out, int (&seen)[2]) {
  const std::size_t colon = part.find(':');
  const std::string_view key = part.substr(0, colon);
  if (colon == std::string_view::npos || (key != "tp" && key != "fsdp")) {
    return bad_text(text, "\"" + std::string(part) + "\" is not \"tp:X\" or \"fsdp:Y\"");
  }
  const std::optional<int> degree = parse_degree(part.substr(colon + 1));
  if (!degree) return bad_text(text, "the degree in \"" + std::string(part) + "\" is not a whole number >= 1");
  const bool is_tp = key == "tp";
  if (++seen[is_tp ? 0 : 1] > 1) return bad_text(text, "names " + std::string(key) + " twice");
  (is_tp ? out.tp : out.fsdp) = *degree;
  return Status::Ok();
}

// A value parse_trainer_layout could have returned: degrees >= 1, and
// "full" only with both degrees 1.
Status check_degrees(const TrainerLayout& layout) {
  if (layout.tp < 1 || layout.fsdp < 1 || (layout.full && (layout.tp != 1 || layout.fsdp != 1))) {
    return InvalidArgument("trainer layout: tp " + std::to_string(layout.tp) + ", fsdp " +
                           std::to_string(layout.fsdp) + (layout.full ? ", full" : "") +
                           " is not a layout (degrees must be >= 1, and \"full\" has both 1)");
  }
  return Status::Ok();
}

std::string_view split_name(ShardRule rule) {
  switch (rule) {
    case ShardRule::kColumn: return "column-parallel";
    case ShardRule::kRow: return "row-parallel";
    case ShardRule::kVocab: return "vocab-parallel";
    case ShardRule::kExpert: return "expert-parallel";
    case ShardRule::kReplicated: break;
  }
  return "replicated";
}

// The tp level of a weight of at least one dimension, by its shard rule: a
// Megatron split (even) of dim 0 (column, vocab) or dim 1 (row); replicated
// weights are copied on every TP rank.
StatusOr<LayoutLevel> tp_level(const TrainerLayout& layout, const Weight& weight) {
  if (weight.rule == ShardRule::kReplicated) return LayoutLevel::replicate(layout.tp);
  const int dim = weight.rule == ShardRule::kRow ? 1 : 0;
  const std::string where = "trainer layout " + layout.ToString() + ": tensor '" + weight.spec.ToString() + "' (" +
                            std::string(split_name(weight.rule)) + ", split along dim " + std::to_string(dim) + ")";
  if (dim >= static_cast<int>(weight.spec.shape.size())) {
    return InvalidArgument(where + " has no dimension " + std::to_string(dim));
  }
  const std::int64_t extent = weight.spec.shape[static_cast<std::size_t>(dim)];
  if (extent % layout.tp != 0) {
    return InvalidArgument(where + ": extent " + std::to_string(extent) + " is not a multiple of the tp degree " +
                           std::to_string(layout.tp));
  }
  return LayoutLevel::even(dim, layout.tp);
}

// One weight's layout over tp * fsdp ranks. REQUIRES: check_degrees passed.
StatusOr<Layout> weight_layout(const TrainerLayout& layout, const Weight& weight) {
  const int ranks = layout.tp * layout.fsdp;
  if (layout.full) return Layout{};
  // A scalar is never split; replicate(1) would be a level that says nothing.
  if (weight.spec.shape.empty()) return ranks == 1 ? Layout{} : Layout::of(LayoutLevel::replicate(ranks));
  Layout out;
  if (layout.tp > 1) {
    ASSIGN_OR_RETURN(const LayoutLevel level, tp_level(layout, weight));
    out.levels.push_back(level);
  }
  // FSDP2 chunks every weight (1-D norms too) along dim 0 of its TP shard.
  if (layout.fsdp > 1) out.levels.push_back(LayoutLevel::chunk(0, layout.fsdp));
  // torchtitan's (dp_shard, tp) mesh: TP ranks are consecutive.
  if (out.levels.size() == 2) out.order = RankOrder::kOuterFastest;
  return out;
}

}  // namespace

std::string TrainerLayout::ToString() const {
  if (full) return "full";
  std::string out = tp != 1 ? "tp:" + std::to_string(tp) : "";
  // Both degrees 1 (a sharded trainer of one rank) prints "fsdp:1".
  if (fsdp != 1 || tp == 1) out += (out.empty() ? "fsdp:" : ",fsdp:") + std::to_string(fsdp);
  return out;
}

StatusOr<TrainerLayout> parse_trainer_layout(std::string_view text, int ranks) {
  if (ranks < 1) return bad_text(text, "needs at least 1 trainer rank, got " + std::to_string(ranks));
  if (text == "full") return TrainerLayout{};
  if (text == "fsdp") return TrainerLayout{.tp = 1, .fsdp = ranks, .full = false};
  if (text == "tp") return TrainerLayout{.tp = ranks, .fsdp = 1, .full = false};
  TrainerLayout out{.tp = 1, .fsdp = 1, .full = false};
  int seen[2] = {0, 0};
  const std::size_t comma = text.find(',');
  RETURN_IF_ERROR(parse_part(text, text.substr(0, comma), out, seen));
  if (comma != std::string_view::npos) {
    const std::string_view second = text.substr(comma + 1);
    if (second.find(',') != std::string_view::npos) return bad_text(text, "has more than two parts");
    RETURN_IF_ERROR(parse_part(text, second, out, seen));
  }
  const std::int64_t product = static_cast<std::int64_t>(out.tp) * out.fsdp;
  if (product != ranks) {
    return InvalidArgument("trainer layout \"" + std::string(text) + "\": tp " + std::to_string(out.tp) +
                           " x fsdp " + std::to_string(out.fsdp) + " = " + std::to_string(product) +
                           " ranks, but there are " + std::to_string(ranks) + " trainer ranks");
  }
  return out;
}

StatusOr<std::vector<Layout>> trainer_layouts(const TrainerLayout& layout, const Model& model) {
  RETURN_IF_ERROR(check_degrees(layout));
  std::vector<Layout> out;
  out.reserve(model.weights.size());
  for (const Weight& weight : model.weights) {
    ASSIGN_OR_RETURN(Layout l, weight_layout(layout, weight));
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace refit

namespace refit {

Status validate_full_trainer_counts(const TrainerLayout& layout, int trainer_ranks, int engine_ranks) {
  if (!layout.full || trainer_ranks >= engine_ranks) return Status::Ok();
  return FailedPrecondition("fewer trainer ranks (" + std::to_string(trainer_ranks) + ") than engine ranks (" +
                            std::to_string(engine_ranks) +
                            "): every engine rank needs at least one full-weight trainer rank to feed it (or "
                            "give the trainers a sharded --trainer-layout)");
}

}  // namespace refit
