// Name maps as tables: each format (Megatron, Hugging Face, vLLM) of each
// family lists its tensors, and each tensor says which logical weights
// ("components": Hugging Face's separate tensors) it is made of and in what
// row order. A direction is a pair of formats; the correspondences are the
// join of the two sides' pieces on the component they hold. Layouts and
// their sources: name_map.h.
#include "reshard/name_map.h"
#include "reshard/name_map_tables.h"

#include <algorithm>
#include <array>
#include <compare>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

namespace refit {
namespace {

using namespace name_map_detail;  // the tables' types (name_map_tables.h)
using C = Component;

std::string_view format_name(Format format) {
  switch (format) {
    case Format::kMegatron: return "Megatron";
    case Format::kHf: return "Hugging Face";
    case Format::kVllm: return "vLLM";
  }
  return "unknown";
}

// The format `side` of `direction` holds.
Format format_of(MapDirection direction, MapSide side) {
  const bool trainer = side == MapSide::kTrainer;
  switch (direction) {
    case MapDirection::kMegatronToHf: return trainer ? Format::kMegatron : Format::kHf;
    case MapDirection::kMegatronToVllm: return trainer ? Format::kMegatron : Format::kVllm;
    case MapDirection::kHfToVllm: return trainer ? Format::kHf : Format::kVllm;
  }
  return Format::kHf;
}

std::vector<Rule> side_rules(const NameMap& map, MapSide side) {
  return rules_of(map.family, format_of(map.direction, side), map.dims.megatron_experts);
}

// The Hugging Face shape of a component.
std::vector<std::int64_t> component_shape(Component c, const ModelDims& d) {
  switch (c) {
    case C::kEmbed:
    case C::kLmHead: return {d.vocab, d.hidden};
    case C::kFinalNorm:
    case C::kInputNorm:
    case C::kPostAttnNorm: return {d.hidden};
    case C::kQ: return {d.heads * d.head_dim, d.hidden};
    case C::kK:
    case C::kV: return {d.kv_heads * d.head_dim, d.hidden};
    case C::kQNorm:
    case C::kKNorm: return {d.head_dim};
    case C::kO: return {d.hidden, d.heads * d.head_dim};
    case C::kRouter: return {d.experts, d.hidden};
    case C::kGate:
    case C::kUp: return {d.intermediate, d.hidden};
    case C::kDown: return {d.hidden, d.intermediate};
  }
  return {};
}

// One instance of a component: -1 where the scope has no layer or expert.
struct Key {
  Component component = C::kEmbed;
  std::int64_t layer = -1;
  std::int64_t expert = -1;
  friend auto operator<=>(const Key&, const Key&) = default;
};

// Rows [begin, end) of a component, held in a tensor from row `row` on
// (rows count after the slot dimension of a stacked tensor).
struct Piece {
  Key key;
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t slot = -1;  // index along a stacked tensor's dim 0; -1 when not stacked
  std::int64_t row = 0;
};

// A concrete tensor of one side and the pieces it is made of.
struct Instance {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<Piece> pieces;
};

std::string render(std::string_view name, std::int64_t layer, std::int64_t expert) {
  std::string out;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const std::string_view rest = name.substr(i);
    if (rest.starts_with("{L}") || rest.starts_with("{E}")) {
      out += std::to_string(rest[1] == 'L' ? layer : expert);
      i += 2;
    } else {
      out += name[i];
    }
  }
  return out;
}

// The tensor `rule` names for (layer, expert), with its pieces in row order.
// REQUIRES: validate_name_map passed (so kv_heads divides every component).
Instance instantiate(const Rule& rule, const ModelDims& d, std::int64_t layer, std::int64_t expert) {
  Instance t{render(rule.name, layer, expert), {}, {}};
  const bool stacked = rule.scope == Scope::kStackedExperts;
  const std::int64_t slots = stacked ? d.experts : 1;
  const std::int64_t groups = rule.rows == Rows::kPerQueryGroup ? d.kv_heads : 1;
  std::int64_t rows = 0;
  for (std::int64_t slot = 0; slot < slots; ++slot) {
    rows = 0;
    for (std::int64_t g = 0; g < groups; ++g) {
      for (int p = 0; p < rule.part_count; ++p) {
        const Component c = rule.parts[static_cast<std::size_t>(p)];
        const std::int64_t block = component_shape(c, d)[0] / groups;
        t.pieces.push_back(Piece{Key{c, layer, stacked ? slot : expert}, g * block, (g + 1) * block,
                                 stacked ? slot : -1, rows});
        rows += block;
      }
    }
  }
  t.shape = component_shape(rule.parts[0], d);  // the parts share every dimension but the rows
  t.shape[0] = rows;
  if (stacked) t.shape.insert(t.shape.begin(), d.experts);
  return t;
}

// Every tensor of `rules` in checkpoint order; consecutive per-expert rules
// go expert by expert (expert 0's gate, up, down, then expert 1's), as the
// Hugging Face checkpoint and presets.cc order them.
std::vector<Instance> expand(const std::vector<Rule>& rules, const ModelDims& d) {
  std::vector<Instance> out;
  std::size_t layer_begin = 0;
  while (layer_begin < rules.size() && rules[layer_begin].scope == Scope::kModel) {
    out.push_back(instantiate(rules[layer_begin++], d, -1, -1));
  }
  std::size_t layer_end = layer_begin;
  while (layer_end < rules.size() && rules[layer_end].scope != Scope::kModel) ++layer_end;
  for (std::int64_t layer = 0; layer < d.layers; ++layer) {
    for (std::size_t r = layer_begin; r < layer_end;) {
      if (rules[r].scope != Scope::kExpert) {
        out.push_back(instantiate(rules[r++], d, layer, -1));
        continue;
      }
      std::size_t run_end = r;
      while (run_end < layer_end && rules[run_end].scope == Scope::kExpert) ++run_end;
      for (std::int64_t e = 0; e < d.experts; ++e) {
        for (std::size_t k = r; k < run_end; ++k) out.push_back(instantiate(rules[k], d, layer, e));
      }
      r = run_end;
    }
  }
  for (std::size_t r = layer_end; r < rules.size(); ++r) out.push_back(instantiate(rules[r], d, -1, -1));
  return out;
}

// The box of component rows [lo, hi) of piece `p` inside tensor `t`.
// REQUIRES: p.begin <= lo <= hi <= p.end.
Box piece_box(const Instance& t, const Piece& p, std::int64_t lo, std::int64_t hi) {
  Box box;
  box.begin.assign(t.shape.size(), 0);
  box.end = t.shape;
  std::size_t row_dim = 0;
  if (p.slot >= 0) {
    box.begin[0] = p.slot;
    box.end[0] = p.slot + 1;
    row_dim = 1;
  }
  box.begin[row_dim] = p.row + (lo - p.begin);
  box.end[row_dim] = p.row + (hi - p.begin);
  return box;
}

// Rows [lo, hi) of the Hugging Face tensor of `key`, and that tensor's name.
struct ComponentPlace {
  std::string name;
  Box box;
};

ComponentPlace component_place(const std::vector<Rule>& hf_rules, const Key& key, const ModelDims& d, std::int64_t lo,
                               std::int64_t hi) {
  ComponentPlace out;
  for (const Rule& rule : hf_rules) {
    if (rule.parts[0] == key.component) out.name = render(rule.name, key.layer, key.expert);
  }
  const std::vector<std::int64_t> shape = component_shape(key.component, d);
  out.box.begin.assign(shape.size(), 0);
  out.box.end = shape;
  out.box.begin[0] = lo;
  out.box.end[0] = hi;
  return out;
}

// Pairs every engine piece with the trainer pieces of the same component
// whose rows overlap it: in engine tensor order, then engine row order.
std::vector<Correspondence> join(const std::vector<Instance>& engine, const std::vector<Instance>& trainer,
                                 const NameMap& map) {
  std::map<Key, std::vector<std::pair<const Instance*, const Piece*>>> held;
  for (const Instance& t : trainer) {
    for (const Piece& p : t.pieces) held[p.key].emplace_back(&t, &p);
  }
  const std::vector<Rule> hf_rules = rules_of(map.family, Format::kHf, map.dims.megatron_experts);
  std::vector<Correspondence> out;
  for (const Instance& e : engine) {
    for (const Piece& p : e.pieces) {
      const auto it = held.find(p.key);
      if (it == held.end()) continue;  // a gap: check_correspondences reports it
      for (const auto& [t, q] : it->second) {
        const std::int64_t lo = std::max(p.begin, q->begin);
        const std::int64_t hi = std::min(p.end, q->end);
        if (lo >= hi) continue;
        ComponentPlace place = component_place(hf_rules, p.key, map.dims, lo, hi);
        out.push_back(Correspondence{e.name, piece_box(e, p, lo, hi), t->name, piece_box(*t, *q, lo, hi),
                                     std::move(place.name), std::move(place.box)});
      }
    }
  }
  return out;
}

// Layer and expert indices read from a name; -1 where the template has none.
struct NameMatch {
  std::int64_t layer = -1;
  std::int64_t expert = -1;
};

// Reads a decimal index at `at` (no sign, no leading zero, at most 12
// digits); advances `at` past it.
std::optional<std::int64_t> read_index(std::string_view text, std::size_t& at) {
  std::size_t end = at;
  while (end < text.size() && end - at < 13 && text[end] >= '0' && text[end] <= '9') ++end;
  const std::size_t digits = end - at;
  if (digits == 0 || digits > 12 || (digits > 1 && text[at] == '0')) return std::nullopt;
  std::int64_t value = 0;
  for (; at < end; ++at) value = value * 10 + (text[at] - '0');
  return value;
}

// Matches `name` against a template of literal text, "{L}" and "{E}".
std::optional<NameMatch> match_name(std::string_view tmpl, std::string_view name) {
  NameMatch m;
  std::size_t at = 0;
  for (std::size_t i = 0; i < tmpl.size(); ++i) {
    const std::string_view rest = tmpl.substr(i);
    if (rest.starts_with("{L}") || rest.starts_with("{E}")) {
      const std::optional<std::int64_t> index = read_index(name, at);
      if (!index) return std::nullopt;
      (rest[1] == 'L' ? m.layer : m.expert) = *index;
      i += 2;
    } else if (at >= name.size() || name[at++] != tmpl[i]) {
      return std::nullopt;
    }
  }
  if (at != name.size()) return std::nullopt;
  return m;
}

// The rule of `rules` holding component `c`. REQUIRES: one does (each table
// holds every component of its family exactly once).
const Rule* rule_holding(const std::vector<Rule>& rules, Component c) {
  for (const Rule& rule : rules) {
    for (int p = 0; p < rule.part_count; ++p) {
      if (rule.parts[static_cast<std::size_t>(p)] == c) return &rule;
    }
  }
  return nullptr;
}

// The instance `side` names `name`, or an error naming it.
StatusOr<Instance> find_instance(const NameMap& map, MapSide side, std::string_view name) {
  const std::vector<Rule> rules = side_rules(map, side);
  for (const Rule& rule : rules) {
    const std::optional<NameMatch> m = match_name(rule.name, name);
    if (!m) continue;
    const auto context = [&] { return map.ToString() + ": " + std::string(map_side_name(side)) + " tensor '" +
                                      std::string(name) + "': "; };
    if (m->layer >= map.dims.layers) {
      return InvalidArgument(context() + "layer " + std::to_string(m->layer) + " is outside the model's " +
                             std::to_string(map.dims.layers) + " layers");
    }
    if (m->expert >= map.dims.experts) {
      return InvalidArgument(context() + "expert " + std::to_string(m->expert) + " is outside the model's " +
                             std::to_string(map.dims.experts) + " experts");
    }
    return instantiate(rule, map.dims, m->layer, m->expert);
  }
  const Format format = format_of(map.direction, side);
  const auto example = std::find_if(rules.begin(), rules.end(), [](const Rule& r) { return r.scope != Scope::kModel; });
  return NotFound(map.ToString() + ": no " + std::string(map_side_name(side)) + " tensor is named '" +
                  std::string(name) + "' (the " + std::string(map_side_name(side)) + " holds " +
                  std::string(format_name(format)) + " names, such as '" + render(example->name, 0, 0) + "')");
}

// The tensors of the side opposite `named` that hold any of its pieces.
std::vector<Instance> counterparts(const NameMap& map, MapSide other, const Instance& named) {
  const std::vector<Rule> rules = side_rules(map, other);
  std::vector<Instance> out;
  std::set<std::string> seen;
  for (const Piece& p : named.pieces) {
    const Rule* rule = rule_holding(rules, p.key.component);
    if (rule == nullptr) continue;
    Instance t = instantiate(*rule, map.dims, p.key.layer, rule->scope == Scope::kExpert ? p.key.expert : -1);
    if (seen.insert(t.name).second) out.push_back(std::move(t));
  }
  return out;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) out += (d == 0 ? "" : ", ") + std::to_string(shape[d]);
  return out + "]";
}

std::int64_t shape_numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (const std::int64_t x : shape) n *= x;
  return n;
}

// The extents other than 1: equal for two boxes that hold the same elements
// in the same C order.
std::vector<std::int64_t> squeezed_extents(const Box& box) {
  std::vector<std::int64_t> out;
  for (const std::int64_t x : box.extents()) {
    if (x != 1) out.push_back(x);
  }
  return out;
}

// OK when `box` has the rank of `shape` and lies inside it.
Status check_box(std::string_view side, const std::string& name, const std::vector<std::int64_t>& shape,
                 const Box& box) {
  const auto fail = [&](const std::string& why) {
    return InvalidArgument(std::string(side) + " tensor '" + name + "' " + shape_text(shape) + ": box " +
                           box_text(box) + " " + why);
  };
  if (box.begin.size() != shape.size() || box.end.size() != shape.size()) {
    return fail("does not have the tensor's " + std::to_string(shape.size()) + " dimensions");
  }
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (box.begin[d] < 0 || box.begin[d] > box.end[d] || box.end[d] > shape[d]) {
      return fail("is not inside the tensor along dim " + std::to_string(d));
    }
  }
  return Status::Ok();
}

bool boxes_overlap(const Box& a, const Box& b) {
  for (std::size_t d = 0; d < a.begin.size(); ++d) {
    if (std::max(a.begin[d], b.begin[d]) >= std::min(a.end[d], b.end[d])) return false;
  }
  return true;
}

// The first two boxes of `boxes` that share an element. REQUIRES: all have
// one rank.
std::optional<std::pair<const Box*, const Box*>> first_overlap(std::vector<const Box*> boxes) {
  std::erase_if(boxes, [](const Box* b) { return b->numel() == 0; });
  if (boxes.size() < 2) return std::nullopt;
  if (boxes[0]->begin.empty()) return std::make_pair(boxes[0], boxes[1]);  // two writes of one scalar
  std::stable_sort(boxes.begin(), boxes.end(), [](const Box* a, const Box* b) { return a->begin[0] < b->begin[0]; });
  for (std::size_t i = 0; i < boxes.size(); ++i) {
    // Sorted by begin[0]: once a box starts at or after this one's end, no later one overlaps it.
    for (std::size_t j = i + 1; j < boxes.size() && boxes[j]->begin[0] < boxes[i]->end[0]; ++j) {
      if (boxes_overlap(*boxes[i], *boxes[j])) return std::make_pair(boxes[i], boxes[j]);
    }
  }
  return std::nullopt;
}

// Name -> index into `tensors`; an error for a name listed twice.
StatusOr<std::unordered_map<std::string, std::size_t>> index_tensors(std::string_view side,
                                                                     const std::vector<MappedTensor>& tensors) {
  std::unordered_map<std::string, std::size_t> out;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!out.emplace(tensors[i].name, i).second) {
      return InvalidArgument(std::string(side) + " tensor '" + tensors[i].name + "' is listed twice");
    }
  }
  return out;
}

// The index of `name` in `index`, or an error naming the correspondence.
StatusOr<std::size_t> lookup(std::string_view side, const std::unordered_map<std::string, std::size_t>& index,
                             const std::string& name, const Correspondence& c) {
  const auto it = index.find(name);
  if (it == index.end()) {
    return InvalidArgument("correspondence " + c.ToString() + " names " + std::string(side) + " tensor '" + name +
                           "', which the " + std::string(side) + " does not hold");
  }
  return it->second;
}

}  // namespace

std::string_view model_family_name(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama: return "llama";
    case ModelFamily::kQwen3Moe: return "qwen3-moe";
  }
  return "unknown";
}

std::string_view map_direction_name(MapDirection direction) {
  switch (direction) {
    case MapDirection::kMegatronToHf: return "megatron->hf";
    case MapDirection::kMegatronToVllm: return "megatron->vllm";
    case MapDirection::kHfToVllm: return "hf->vllm";
  }
  return "unknown";
}

std::string_view map_side_name(MapSide side) { return side == MapSide::kTrainer ? "trainer" : "engine"; }

std::string NameMap::ToString() const {
  return std::string(model_family_name(family)) + " " + std::string(map_direction_name(direction));
}

Status validate_name_map(const NameMap& map) {
  const ModelDims& d = map.dims;
  const std::pair<const char*, std::int64_t> fields[] = {
      {"hidden", d.hidden},             {"heads", d.heads},   {"kv_heads", d.kv_heads}, {"head_dim", d.head_dim},
      {"intermediate", d.intermediate}, {"layers", d.layers}, {"vocab", d.vocab},
  };
  for (const auto& [field, value] : fields) {
    if (value < 1) {
      return InvalidArgument(map.ToString() + ": " + field + " must be at least 1 (it is " + std::to_string(value) +
                             ")");
    }
  }
  if (d.heads % d.kv_heads != 0) {
    return InvalidArgument(map.ToString() + ": heads (" + std::to_string(d.heads) +
                           ") must be a multiple of kv_heads (" + std::to_string(d.kv_heads) +
                           "): each query group holds heads / kv_heads query heads");
  }
  if (map.family == ModelFamily::kQwen3Moe && d.experts < 1) {
    return InvalidArgument(map.ToString() + ": experts must be at least 1 (it is " + std::to_string(d.experts) + ")");
  }
  if (map.family == ModelFamily::kLlama && d.experts != 0) {
    return InvalidArgument(map.ToString() + ": Llama has no experts; experts must be 0 (it is " +
                           std::to_string(d.experts) + ")");
  }
  return Status::Ok();
}

StatusOr<std::vector<MappedTensor>> mapped_tensors(const NameMap& map, MapSide side) {
  RETURN_IF_ERROR(validate_name_map(map));
  std::vector<MappedTensor> out;
  for (Instance& t : expand(side_rules(map, side), map.dims)) {
    out.push_back(MappedTensor{std::move(t.name), std::move(t.shape)});
  }
  return out;
}

StatusOr<std::vector<Correspondence>> tensor_correspondences(const NameMap& map, MapSide side,
                                                             std::string_view name) {
  RETURN_IF_ERROR(validate_name_map(map));
  ASSIGN_OR_RETURN(Instance named, find_instance(map, side, name));
  const MapSide other = side == MapSide::kTrainer ? MapSide::kEngine : MapSide::kTrainer;
  std::vector<Instance> others = counterparts(map, other, named);
  std::vector<Instance> mine;
  mine.push_back(std::move(named));
  return side == MapSide::kEngine ? join(mine, others, map) : join(others, mine, map);
}

StatusOr<std::vector<Correspondence>> model_correspondences(const NameMap& map) {
  RETURN_IF_ERROR(validate_name_map(map));
  return join(expand(side_rules(map, MapSide::kEngine), map.dims), expand(side_rules(map, MapSide::kTrainer), map.dims),
              map);
}

Status check_correspondences(const std::vector<Correspondence>& correspondences,
                             const std::vector<MappedTensor>& engine, const std::vector<MappedTensor>& trainer) {
  ASSIGN_OR_RETURN(const auto engine_index, index_tensors("engine", engine));
  ASSIGN_OR_RETURN(const auto trainer_index, index_tensors("trainer", trainer));
  std::vector<std::vector<const Box*>> writes(engine.size());
  std::vector<std::vector<const Box*>> reads(trainer.size());
  for (const Correspondence& c : correspondences) {
    ASSIGN_OR_RETURN(const std::size_t e, lookup("engine", engine_index, c.engine_name, c));
    ASSIGN_OR_RETURN(const std::size_t t, lookup("trainer", trainer_index, c.trainer_name, c));
    RETURN_IF_ERROR(check_box("engine", c.engine_name, engine[e].shape, c.engine_box));
    RETURN_IF_ERROR(check_box("trainer", c.trainer_name, trainer[t].shape, c.trainer_box));
    if (squeezed_extents(c.engine_box) != squeezed_extents(c.trainer_box)) {
      return InvalidArgument("correspondence " + c.ToString() + ": the boxes' extents differ (" +
                             shape_text(c.engine_box.extents()) + " vs " + shape_text(c.trainer_box.extents()) +
                             ", dims of extent 1 aside)");
    }
    writes[e].push_back(&c.engine_box);
    reads[t].push_back(&c.trainer_box);
  }
  for (std::size_t e = 0; e < engine.size(); ++e) {
    const std::string what = "engine tensor '" + engine[e].name + "' " + shape_text(engine[e].shape);
    if (const auto o = first_overlap(writes[e])) {
      return InvalidArgument(what + ": boxes " + box_text(*o->first) + " and " + box_text(*o->second) +
                             " overlap: those elements would be written twice");
    }
    std::int64_t written = 0;
    for (const Box* b : writes[e]) written += b->numel();
    if (written != shape_numel(engine[e].shape)) {
      return InvalidArgument(what + ": the correspondences write " + std::to_string(written) + " of its " +
                             std::to_string(shape_numel(engine[e].shape)) + " elements; every element needs one");
    }
  }
  for (std::size_t t = 0; t < trainer.size(); ++t) {
    if (const auto o = first_overlap(reads[t])) {
      return InvalidArgument("trainer tensor '" + trainer[t].name + "' " + shape_text(trainer[t].shape) + ": boxes " +
                             box_text(*o->first) + " and " + box_text(*o->second) +
                             " overlap: those elements would be read twice");
    }
  }
  return Status::Ok();
}

}  // namespace refit
