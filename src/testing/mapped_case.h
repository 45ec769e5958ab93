// Cases for the mapped transfer plan's tests (mapped_transfer_plan_model_test.cc,
// bucket_feed_test.cc): a name map, its trainer and engine tensors with the
// layouts a test names (make_mapped_case) or random ones of random small
// dimensions and direction (random_mapped_case), and the hand conversions
// (hand_conversion.h) of a model of distinct values, cut into each rank's
// local shards.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "refit/mapped_transfer_plan.h"
#include "reshard/name_map.h"
#include "testing/hand_conversion.h"
#include "testing/random_layout.h"

namespace refit::testing {

// Local shards as bytes: shards[rank][tensor], C order of the rank's box.
using Shards = std::vector<std::vector<std::vector<std::uint8_t>>>;

struct MappedCase {
  NameMap map;
  Store trainer;  // the full trainer tensors: a hand conversion of a Hugging Face model
  Store engine;   // the full engine tensors the hand conversion makes of the same model
  MappedTransferInput input;
  std::string what;  // the map, the ranks and the layout kinds, for failure messages
};

// Small dimensions; `scale` multiplies the widths (hidden, head_dim,
// intermediate, vocab) for shards larger than a bucket.
inline ModelDims random_dims(ModelFamily family, MegatronExperts form, int scale, std::mt19937& rng) {
  ModelDims d;
  d.kv_heads = uniform(rng, 1, 3);
  d.heads = d.kv_heads * uniform(rng, 1, 3);
  d.head_dim = uniform(rng, 1, 4) * scale;
  d.hidden = uniform(rng, 1, 6) * scale;
  d.intermediate = uniform(rng, 1, 5) * scale;
  d.experts = family == ModelFamily::kQwen3Moe ? uniform(rng, 1, 4) : 0;
  d.layers = uniform(rng, 1, 2);
  d.vocab = uniform(rng, 1, 8) * scale;
  d.megatron_experts = form;
  return d;
}

// The dimension a TP rule splits a tensor of `ndim` dimensions along, by its
// name in any of the three formats; -1: replicated (norms, the router).
inline int tp_dim(const std::string& name, std::size_t ndim) {
  const auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (ndim < 2 || has("norm") || has("router") || has("mlp.gate.weight")) return -1;
  const bool row = has("linear_proj") || has("linear_fc2") || has("o_proj") || has("down_proj") || has("w2_weight");
  if (row) return static_cast<int>(ndim) - 1;
  return ndim == 3 ? 1 : 0;  // a stacked [E, rows, cols] tensor splits its rows
}

// Trainer layouts: 0 random, 1 FSDP (chunk dim 0), 2 Megatron TP (even
// along the TP dimension where it divides, else replicated).
inline Layout trainer_layout_of_kind(int kind, const TensorSpec& spec, int ranks, std::mt19937& rng) {
  if (kind == 0) return random_layout(spec, ranks, rng);
  if (kind == 1) return Layout::of(LayoutLevel::chunk(0, ranks));
  const int d = tp_dim(spec.name, spec.shape.size());
  if (d < 0 || spec.shape[static_cast<std::size_t>(d)] % ranks != 0) return Layout::of(LayoutLevel::replicate(ranks));
  return Layout::of(LayoutLevel::even(d, ranks));
}

// Engine layouts: 0 random, 1 the TP rule (tensor_split), 2 the TP rule but
// stacked experts split whole by expert parallelism where there are enough.
inline Layout engine_layout_of_kind(int kind, const TensorSpec& spec, int ranks, std::mt19937& rng) {
  if (kind == 0) return random_layout(spec, ranks, rng);
  if (kind == 2 && spec.shape.size() == 3 && spec.shape[0] >= ranks) return Layout::of(LayoutLevel::experts(ranks));
  const int d = tp_dim(spec.name, spec.shape.size());
  return d < 0 ? Layout::of(LayoutLevel::replicate(ranks)) : Layout::of(LayoutLevel::tensor_split(d, ranks));
}

// How a side splits each of its tensors.
using LayoutOf = std::function<Layout(const TensorSpec&)>;

inline std::vector<SideTensor> side_tensors(const Store& store, const std::vector<MappedTensor>& order, DType dtype,
                                            const LayoutOf& layout_of) {
  std::vector<SideTensor> out;
  for (const MappedTensor& t : order) {
    TensorSpec spec{t.name, dtype, store.at(t.name).shape};
    Layout layout = layout_of(spec);
    out.push_back(SideTensor{std::move(spec), std::move(layout)});
  }
  return out;
}

// The case of `map` (its family, direction and dims): a Hugging Face model
// of distinct values and its hand conversions, as `dtype`, the trainer
// tensors split over M ranks by `trainer`, the engine's over N by `engine`,
// the map's correspondences; `what` goes into failure messages.
inline MappedCase make_mapped_case(const NameMap& map, DType dtype, int m, const LayoutOf& trainer, int n,
                                   const LayoutOf& engine, std::string what) {
  MappedCase mc;
  mc.map = map;
  const Store hf = hf_model(map.family, map.dims);
  mc.trainer = map.direction == MapDirection::kHfToVllm ? hf : megatron_from_hf(map.family, map.dims, hf);
  mc.engine = map.direction == MapDirection::kMegatronToHf ? hf : vllm_from_hf(map.family, map.dims, hf);
  mc.input.trainer = side_tensors(mc.trainer, mapped_tensors(map, MapSide::kTrainer).value(), dtype, trainer);
  mc.input.engine = side_tensors(mc.engine, mapped_tensors(map, MapSide::kEngine).value(), dtype, engine);
  mc.input.correspondences = model_correspondences(map).value();
  mc.input.trainer_ranks = m;
  mc.input.engine_ranks = n;
  mc.what = std::move(what);
  return mc;
}

// A random family, direction, Megatron expert form, dimensions (random_dims
// at `scale`), M and N in 1..8, layout kinds and element size (2 or 4
// bytes: the low bytes of each value; 4 where 2 would not keep the model's
// values distinct).
inline MappedCase random_mapped_case(std::mt19937& rng, int scale = 1) {
  static const char* kTrainerKinds[] = {"random", "fsdp", "tp"};
  static const char* kEngineKinds[] = {"random", "tp-rule", "tp-rule+ep"};
  NameMap map;
  map.family = uniform(rng, 0, 1) == 0 ? ModelFamily::kLlama : ModelFamily::kQwen3Moe;
  map.direction = static_cast<MapDirection>(uniform(rng, 0, 2));
  const auto form = uniform(rng, 0, 1) == 0 ? MegatronExperts::kStacked : MegatronExperts::kPerExpert;
  map.dims = random_dims(map.family, form, scale, rng);
  std::int64_t values = 0;
  for (const auto& [name, t] : hf_model(map.family, map.dims)) values += numel(t.shape);
  const DType dtype = uniform(rng, 0, 1) == 0 && values < 65535 ? DType::kBFloat16 : DType::kFloat32;
  const int m = uniform(rng, 1, 8);
  const int n = uniform(rng, 1, 8);
  const int trainer_kind = uniform(rng, 0, 2);
  const int engine_kind = uniform(rng, 0, 2);
  const std::string what = map.ToString() + (form == MegatronExperts::kStacked ? " (stacked)" : " (per expert)") +
                           ", " + std::string(dtype_name(dtype)) + ", M " + std::to_string(m) + " " +
                           kTrainerKinds[trainer_kind] + ", N " + std::to_string(n) + " " + kEngineKinds[engine_kind];
  MappedCase mc = make_mapped_case(
      map, dtype, m, [&](const TensorSpec& spec) { return trainer_layout_of_kind(trainer_kind, spec, m, rng); }, n,
      [&](const TensorSpec& spec) { return engine_layout_of_kind(engine_kind, spec, n, rng); }, what);
  static const std::uint64_t kSplits[] = {0, 1, 16, 1ull << 20};
  mc.input.options.min_split_bytes = kSplits[uniform(rng, 0, 3)];
  return mc;
}

// Every rank's local shard of every tensor of `tensors`, cut from the full
// values of `store`: each element is its value's low dtype_size bytes.
inline Shards cut_shards(const std::vector<SideTensor>& tensors, int ranks, const Store& store) {
  Shards out(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    for (const SideTensor& t : tensors) {
      const Dense& full = store.at(t.spec.name);
      const std::size_t elem = dtype_size(t.spec.dtype);
      std::vector<std::uint8_t> bytes;
      for (const std::int64_t off : box_offsets(full.shape, layout_box(t.spec, t.layout, r).value())) {
        const std::uint32_t value = full.v[static_cast<std::size_t>(off)];
        std::uint8_t le[4];
        std::memcpy(le, &value, 4);  // little-endian hosts
        bytes.insert(bytes.end(), le, le + elem);
      }
      out[static_cast<std::size_t>(r)].push_back(std::move(bytes));
    }
  }
  return out;
}

// The same shards with every byte 0: what an engine rank holds before a
// refit lands.
inline Shards empty_like(const Shards& shards) {
  Shards out = shards;
  for (auto& rank : out) {
    for (auto& tensor : rank) std::fill(tensor.begin(), tensor.end(), 0);
  }
  return out;
}

}  // namespace refit::testing
