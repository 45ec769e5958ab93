// A preset as a Megatron trainer holds it: see megatron_model.h.
#include "reshard/megatron_model.h"

#include <algorithm>
#include <map>
#include <optional>

#include "model/preset_arch.h"

namespace refit {
namespace {

// A box that is one C-order range of a tensor of `shape`: its first byte and
// its byte count (element size `element`). Every dimension after the box's
// first of extent > 1 must be whole. nullopt otherwise.
struct ByteRange {
  std::uint64_t begin = 0;
  std::uint64_t bytes = 0;
};
std::optional<ByteRange> c_order_range(const std::vector<std::int64_t>& shape, std::uint64_t element,
                                       const Box& box) {
  const std::size_t nd = shape.size();
  if (box.numel() == 0) return ByteRange{};
  std::size_t first = nd;  // the first dimension of extent > 1
  for (std::size_t d = 0; d < nd && first == nd; ++d) {
    if (box.end[d] - box.begin[d] > 1) first = d;
  }
  for (std::size_t d = first + 1; d < nd; ++d) {
    if (box.begin[d] != 0 || box.end[d] != shape[d]) return std::nullopt;
  }
  ByteRange out;
  std::uint64_t stride = element;
  for (std::size_t d = nd; d-- > 0;) {
    out.begin += static_cast<std::uint64_t>(box.begin[d]) * stride;
    stride *= static_cast<std::uint64_t>(shape[d]);
  }
  out.bytes = static_cast<std::uint64_t>(box.numel()) * element;
  return out;
}

StatusOr<NameMap> preset_map(const std::string& preset, int layers) {
  const PresetArch* a = find_preset_arch(preset);
  if (a == nullptr) return InvalidArgument("--trainer-names megatron: no model preset \"" + preset + "\"");
  if ((a->experts > 0) != a->qk_norm) {
    return InvalidArgument("--trainer-names megatron: model preset \"" + preset +
                           "\" is neither Llama-like (no experts, no q/k norms) nor Qwen3-MoE-like (both)");
  }
  NameMap map;
  map.family = a->experts > 0 ? ModelFamily::kQwen3Moe : ModelFamily::kLlama;
  map.direction = MapDirection::kMegatronToHf;
  map.dims = ModelDims{.hidden = a->hidden,
                       .heads = a->heads,
                       .kv_heads = a->kv_heads,
                       .head_dim = a->head_dim,
                       .intermediate = a->experts > 0 ? a->moe_inter : a->inter,
                       .experts = a->experts,
                       .layers = layers < 0 ? a->layers : layers,
                       .vocab = a->vocab,
                       .megatron_experts = MegatronExperts::kStacked};
  RETURN_IF_ERROR(validate_name_map(map));
  return map;
}

// The name map's Hugging Face tensors must be the preset's, in its order.
Status check_engine_tensors(const NameMap& map, const Model& engine) {
  ASSIGN_OR_RETURN(const std::vector<MappedTensor> hf, mapped_tensors(map, MapSide::kEngine));
  const std::string what = "--trainer-names megatron, model preset \"" + engine.preset + "\" (" + map.ToString() + ")";
  for (std::size_t i = 0; i < std::max(hf.size(), engine.weights.size()); ++i) {
    const std::string ours = i < engine.weights.size() ? engine.weights[i].spec.ToString() : "nothing";
    const std::string mapped = i < hf.size() ? hf[i].name : "nothing";
    if (i >= hf.size() || i >= engine.weights.size() || hf[i].name != engine.weights[i].spec.name ||
        hf[i].shape != engine.weights[i].spec.shape) {
      return InvalidArgument(what + ": tensor " + std::to_string(i) + " of the preset is " + ours +
                             " but the name map's is " + mapped);
    }
  }
  return Status::Ok();
}

// Each trainer tensor's segments, from the correspondences that read it.
Status add_content(MegatronModel& m) {
  std::map<std::string, std::size_t> engine_index, trainer_index;
  for (std::size_t i = 0; i < m.engine.weights.size(); ++i) engine_index[m.engine.weights[i].spec.name] = i;
  for (std::size_t i = 0; i < m.trainer.weights.size(); ++i) trainer_index[m.trainer.weights[i].spec.name] = i;
  m.content.assign(m.trainer.weights.size(), {});
  for (const Correspondence& c : m.correspondences) {
    const TensorSpec& e = m.engine.weights[engine_index.at(c.engine_name)].spec;
    const TensorSpec& t = m.trainer.weights[trainer_index.at(c.trainer_name)].spec;
    const std::uint64_t element = dtype_size(e.dtype);
    const std::optional<ByteRange> from = c_order_range(e.shape, element, c.engine_box);
    const std::optional<ByteRange> to = c_order_range(t.shape, element, c.trainer_box);
    if (!from || !to) return InvalidArgument("--trainer-names megatron: " + c.ToString() + " is not one C-order range");
    if (from->bytes == 0) continue;
    m.content[trainer_index.at(c.trainer_name)].push_back(ContentSegment{to->begin, to->bytes, e.name, from->begin});
  }
  for (std::size_t i = 0; i < m.content.size(); ++i) {
    std::vector<ContentSegment>& segments = m.content[i];
    std::sort(segments.begin(), segments.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
    const TensorSpec& spec = m.trainer.weights[i].spec;
    std::vector<ContentSegment> tiled;
    std::uint64_t at = 0;
    for (ContentSegment& s : segments) {
      if (s.begin < at) return InvalidArgument("--trainer-names megatron: '" + spec.name + "' is read twice");
      if (s.begin > at) tiled.push_back(ContentSegment{at, s.begin - at, spec.name, at});  // nobody reads it
      at = s.begin + s.bytes;
      tiled.push_back(std::move(s));
    }
    if (at < spec.nbytes()) tiled.push_back(ContentSegment{at, spec.nbytes() - at, spec.name, at});
    segments = std::move(tiled);
  }
  return Status::Ok();
}

// The trainer's tensors: the name map's Megatron ones, each of the dtype of
// the engine tensors it holds parts of.
Status add_trainer_tensors(MegatronModel& m) {
  std::map<std::string, DType> engine_dtype, trainer_dtype;
  for (const Weight& w : m.engine.weights) engine_dtype[w.spec.name] = w.spec.dtype;
  for (const Correspondence& c : m.correspondences) {
    const DType d = engine_dtype.at(c.engine_name);
    const auto [it, inserted] = trainer_dtype.emplace(c.trainer_name, d);
    if (!inserted && it->second != d) {
      return InvalidArgument("--trainer-names megatron: '" + c.trainer_name + "' holds parts of tensors of two "
                             "dtypes (" + std::string(dtype_name(it->second)) + " and " +
                             std::string(dtype_name(d)) + ", at " + c.ToString() + ")");
    }
  }
  ASSIGN_OR_RETURN(const std::vector<MappedTensor> megatron, mapped_tensors(m.map, MapSide::kTrainer));
  m.trainer.preset = m.engine.preset;
  for (const MappedTensor& t : megatron) {
    const auto it = trainer_dtype.find(t.name);
    const DType dtype = it == trainer_dtype.end() ? DType::kBFloat16 : it->second;
    m.trainer.weights.push_back(Weight{TensorSpec{t.name, dtype, t.shape}, ShardRule::kReplicated});
  }
  return Status::Ok();
}

}  // namespace

StatusOr<TrainerNames> parse_trainer_names(std::string_view text) {
  if (text == "hf") return TrainerNames::kHf;
  if (text == "megatron") return TrainerNames::kMegatron;
  return InvalidArgument("--trainer-names \"" + std::string(text) +
                         "\": expected hf (the engine's Hugging Face names) or megatron (Megatron-Core's fused "
                         "linear_qkv and linear_fc1 and stacked experts)");
}

StatusOr<MegatronModel> megatron_model(const std::string& preset, int layers) {
  MegatronModel m;
  ASSIGN_OR_RETURN(m.engine, make_model(preset, layers));
  ASSIGN_OR_RETURN(m.map, preset_map(preset, layers));
  RETURN_IF_ERROR(check_engine_tensors(m.map, m.engine));
  ASSIGN_OR_RETURN(m.correspondences, model_correspondences(m.map));
  RETURN_IF_ERROR(add_trainer_tensors(m));
  RETURN_IF_ERROR(add_content(m));
  return m;
}

}  // namespace refit
