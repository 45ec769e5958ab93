#include "reshard/name_map.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "refit/model.h"
#include "testing/expect_has.h"
#include "testing/hand_conversion.h"
#include "testing/status_matchers.h"

namespace refit {

// gtest's printers for the map's values (found by argument-dependent lookup
// in namespace refit).
void PrintTo(const MappedTensor& t, std::ostream* os) {
  *os << t.name << " [";
  for (std::size_t d = 0; d < t.shape.size(); ++d) *os << (d == 0 ? "" : ", ") << t.shape[d];
  *os << "]";
}
void PrintTo(const Correspondence& c, std::ostream* os) {
  *os << c.ToString() << " (" << c.component << " " << box_text(c.component_box) << ")";
}

namespace {

// The hand conversions (Dense, Store, hf_model, megatron_from_hf,
// vllm_from_hf) and box_offsets: testing/hand_conversion.h.
using testing::box_offsets;
using testing::Dense;
using testing::hf_model;
using testing::megatron_from_hf;
using testing::Store;
using testing::vllm_from_hf;

// ---- Applying correspondences ----

// True when `box` has the rank of `shape` and lies inside it.
bool inside(const std::vector<std::int64_t>& shape, const Box& box) {
  if (box.begin.size() != shape.size() || box.end.size() != shape.size()) return false;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (box.begin[d] < 0 || box.begin[d] > box.end[d] || box.end[d] > shape[d]) return false;
  }
  return true;
}

// Copies each correspondence's trainer box into its engine box; a box
// outside the hand-built tensor fails the test before anything is copied.
void apply(const std::vector<Correspondence>& cs, const Store& trainer, Store& engine) {
  for (const Correspondence& c : cs) {
    ASSERT_TRUE(trainer.contains(c.trainer_name)) << c.ToString();
    ASSERT_TRUE(engine.contains(c.engine_name)) << c.ToString();
    const Dense& src = trainer.at(c.trainer_name);
    Dense& dst = engine.at(c.engine_name);
    ASSERT_TRUE(inside(src.shape, c.trainer_box)) << c.ToString() << ": trainer box outside the hand conversion";
    ASSERT_TRUE(inside(dst.shape, c.engine_box)) << c.ToString() << ": engine box outside the hand conversion";
    const std::vector<std::int64_t> from = box_offsets(src.shape, c.trainer_box);
    const std::vector<std::int64_t> to = box_offsets(dst.shape, c.engine_box);
    ASSERT_EQ(from.size(), to.size()) << c.ToString();
    for (std::size_t i = 0; i < from.size(); ++i) {
      dst.v[static_cast<std::size_t>(to[i])] = src.v[static_cast<std::size_t>(from[i])];
    }
  }
}

// Same names, shapes and every element; reports each tensor's first wrong
// element.
void expect_stores_equal(const Store& got, const Store& want) {
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.contains(name)) << name;
    const Dense& g = got.at(name);
    ASSERT_EQ(g.shape, w.shape) << name;
    for (std::size_t i = 0; i < w.v.size(); ++i) {
      if (g.v[i] != w.v[i]) {
        ADD_FAILURE() << name << ": element " << i << " is " << g.v[i] << ", the hand conversion has " << w.v[i];
        break;
      }
    }
  }
}

std::vector<MappedTensor> listed(const Store& s) {
  std::vector<MappedTensor> out;
  for (const auto& [name, t] : s) out.push_back(MappedTensor{name, t.shape});
  return out;
}

std::vector<MappedTensor> sorted(std::vector<MappedTensor> v) {
  std::sort(v.begin(), v.end(), [](const MappedTensor& a, const MappedTensor& b) { return a.name < b.name; });
  return v;
}

// Moves `trainer` (a hand conversion of `hf`) into empty engine tensors by
// `map`'s correspondences and expects the hand conversion `want`, element
// by element. Also: both sides list exactly the hand conversions' tensors,
// the correspondences pass the check, and each engine box holds its
// component's box of `hf`.
void expect_map_matches(const NameMap& map, const Store& hf, const Store& trainer, const Store& want) {
  ASSERT_OK_AND_ASSIGN(const std::vector<Correspondence> cs, model_correspondences(map));
  ASSERT_OK_AND_ASSIGN(const std::vector<MappedTensor> engine_list, mapped_tensors(map, MapSide::kEngine));
  ASSERT_OK_AND_ASSIGN(const std::vector<MappedTensor> trainer_list, mapped_tensors(map, MapSide::kTrainer));
  ASSERT_EQ(sorted(engine_list), listed(want)) << map.ToString();
  ASSERT_EQ(sorted(trainer_list), listed(trainer)) << map.ToString();
  EXPECT_OK(check_correspondences(cs, engine_list, trainer_list));

  Store got = want;
  for (auto& [name, t] : got) std::fill(t.v.begin(), t.v.end(), 0u);  // 0: no element of hf
  apply(cs, trainer, got);
  expect_stores_equal(got, want);

  for (const Correspondence& c : cs) {
    ASSERT_TRUE(hf.contains(c.component)) << c.ToString() << " names component " << c.component;
    const Dense& comp = hf.at(c.component);
    const Dense& eng = got.at(c.engine_name);
    ASSERT_TRUE(inside(comp.shape, c.component_box)) << c.ToString() << ": component box outside " << c.component;
    const std::vector<std::int64_t> a = box_offsets(comp.shape, c.component_box);
    const std::vector<std::int64_t> b = box_offsets(eng.shape, c.engine_box);
    ASSERT_EQ(a.size(), b.size()) << c.ToString();
    for (std::size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(comp.v[static_cast<std::size_t>(a[i])], eng.v[static_cast<std::size_t>(b[i])])
          << c.ToString() << " is not box " << box_text(c.component_box) << " of " << c.component;
    }
  }
}

ModelDims LlamaDims() {
  return ModelDims{.hidden = 16, .heads = 4, .kv_heads = 2, .head_dim = 4, .intermediate = 24, .experts = 0,
                   .layers = 2, .vocab = 32};
}

// heads * head_dim (24) differs from hidden (16), as in Qwen3 (32 x 128 vs
// 2048), and the expert width from every other extent.
ModelDims Qwen3MoeDims(MegatronExperts form = MegatronExperts::kStacked) {
  return ModelDims{.hidden = 16, .heads = 4, .kv_heads = 2, .head_dim = 6, .intermediate = 10, .experts = 4,
                   .layers = 2, .vocab = 32, .megatron_experts = form};
}

NameMap Map(ModelFamily family, MapDirection direction, ModelDims dims) { return NameMap{family, direction, dims}; }

// ---- Each map against its hand conversion ----

// Catches: linear_qkv read as [q; k; v] (vLLM's order) instead of Megatron's
// per-group interleave, or a group stride off by a head; gate and up
// swapped in linear_fc1; the two fused layer norms swapped
// (linear_qkv.layer_norm_weight is input_layernorm); any renamed tensor
// sent to the wrong Hugging Face name or shape.
TEST(NameMap, LlamaMegatronToHfMatchesHandConversion) {
  const ModelDims d = LlamaDims();
  const Store hf = hf_model(ModelFamily::kLlama, d);
  expect_map_matches(Map(ModelFamily::kLlama, MapDirection::kMegatronToHf, d), hf,
                     megatron_from_hf(ModelFamily::kLlama, d, hf), hf);
}

// Catches: a Megatron -> vLLM map that copies linear_qkv into qkv_proj whole
// (both are [(heads + 2 kv_heads) head_dim, hidden] but order rows
// differently), or that reorders linear_fc1 (the same [gate; up] as
// gate_up_proj, so it must be one whole-tensor copy).
TEST(NameMap, LlamaMegatronToVllmMatchesHandConversion) {
  const ModelDims d = LlamaDims();
  const Store hf = hf_model(ModelFamily::kLlama, d);
  expect_map_matches(Map(ModelFamily::kLlama, MapDirection::kMegatronToVllm, d), hf,
                     megatron_from_hf(ModelFamily::kLlama, d, hf), vllm_from_hf(ModelFamily::kLlama, d, hf));
}

// Catches: qkv_proj or gate_up_proj assembled in another order ([k; q; v],
// [up; gate]), or k placed at heads * hidden instead of heads * head_dim.
TEST(NameMap, LlamaHfToVllmMatchesHandConversion) {
  const ModelDims d = LlamaDims();
  const Store hf = hf_model(ModelFamily::kLlama, d);
  expect_map_matches(Map(ModelFamily::kLlama, MapDirection::kHfToVllm, d), hf, hf,
                     vllm_from_hf(ModelFamily::kLlama, d, hf));
}

// Catches: a stacked expert tensor whose slot j is not expert j (all
// experts landing in slot 0, or slots reversed), each expert's fc1 halves
// swapped, q_layernorm / k_layernorm swapped, the router or
// pre_mlp_layernorm misnamed, and q rows sized by hidden instead of
// heads * head_dim (they differ here).
TEST(NameMap, Qwen3MoeMegatronStackedToHfMatchesHandConversion) {
  const ModelDims d = Qwen3MoeDims(MegatronExperts::kStacked);
  const Store hf = hf_model(ModelFamily::kQwen3Moe, d);
  expect_map_matches(Map(ModelFamily::kQwen3Moe, MapDirection::kMegatronToHf, d), hf,
                     megatron_from_hf(ModelFamily::kQwen3Moe, d, hf), hf);
}

// Catches: TEGroupedMLP's weightJ read as another expert's, or the
// per-expert form still listing the stacked names.
TEST(NameMap, Qwen3MoeMegatronPerExpertToHfMatchesHandConversion) {
  const ModelDims d = Qwen3MoeDims(MegatronExperts::kPerExpert);
  const Store hf = hf_model(ModelFamily::kQwen3Moe, d);
  expect_map_matches(Map(ModelFamily::kQwen3Moe, MapDirection::kMegatronToHf, d), hf,
                     megatron_from_hf(ModelFamily::kQwen3Moe, d, hf), hf);
}

// Catches: Megatron experts moved into w13_weight / w2_weight at the wrong
// slot or half, in either Megatron expert form.
TEST(NameMap, Qwen3MoeMegatronToVllmMatchesHandConversion) {
  for (const MegatronExperts form : {MegatronExperts::kStacked, MegatronExperts::kPerExpert}) {
    SCOPED_TRACE(form == MegatronExperts::kStacked ? "stacked" : "per expert");
    const ModelDims d = Qwen3MoeDims(form);
    const Store hf = hf_model(ModelFamily::kQwen3Moe, d);
    expect_map_matches(Map(ModelFamily::kQwen3Moe, MapDirection::kMegatronToVllm, d), hf,
                       megatron_from_hf(ModelFamily::kQwen3Moe, d, hf), vllm_from_hf(ModelFamily::kQwen3Moe, d, hf));
  }
}

// Catches: w13_weight built [up; gate] (w1 is gate_proj, w3 up_proj), w2
// given an expert's up_proj, or the experts' slots shifted.
TEST(NameMap, Qwen3MoeHfToVllmMatchesHandConversion) {
  const ModelDims d = Qwen3MoeDims();
  const Store hf = hf_model(ModelFamily::kQwen3Moe, d);
  expect_map_matches(Map(ModelFamily::kQwen3Moe, MapDirection::kHfToVllm, d), hf, hf,
                     vllm_from_hf(ModelFamily::kQwen3Moe, d, hf));
}

// ---- The boxes themselves, spelled out ----

Box B(std::vector<std::int64_t> begin, std::vector<std::int64_t> end) { return Box{std::move(begin), std::move(end)}; }

// Catches: k head g placed after all query heads, or after one query head
// instead of the group's heads / kv_heads; a lookup that returns the pieces
// of another layer. With 4 heads, 2 kv heads and head_dim 4, Megatron's
// linear_qkv rows are q0 q1 [0, 8), k0 [8, 12), v0 [12, 16), q2 q3 [16, 24),
// k1 [24, 28), v1 [28, 32).
TEST(NameMap, MegatronKvHeadsFollowTheirGroupsQueries) {
  const NameMap map = Map(ModelFamily::kLlama, MapDirection::kMegatronToHf, LlamaDims());
  const std::string k = "model.layers.1.self_attn.k_proj.weight";
  const std::string qkv = "decoder.layers.1.self_attention.linear_qkv.weight";
  ASSERT_OK_AND_ASSIGN(const std::vector<Correspondence> got, tensor_correspondences(map, MapSide::kEngine, k));
  const std::vector<Correspondence> want = {
      {k, B({0, 0}, {4, 16}), qkv, B({8, 0}, {12, 16}), k, B({0, 0}, {4, 16})},
      {k, B({4, 0}, {8, 16}), qkv, B({24, 0}, {28, 16}), k, B({4, 0}, {8, 16})},
  };
  EXPECT_EQ(got, want);

  ASSERT_OK_AND_ASSIGN(const std::vector<Correspondence> all, tensor_correspondences(map, MapSide::kTrainer, qkv));
  std::vector<std::string> text;
  for (const Correspondence& c : all) text.push_back(c.ToString());
  const std::string q = "model.layers.1.self_attn.q_proj.weight";
  const std::string v = "model.layers.1.self_attn.v_proj.weight";
  const std::string x = " x [0, 16)";
  EXPECT_EQ(text, (std::vector<std::string>{
                      q + " [0, 8)" + x + " <- " + qkv + " [0, 8)" + x,
                      q + " [8, 16)" + x + " <- " + qkv + " [16, 24)" + x,
                      k + " [0, 4)" + x + " <- " + qkv + " [8, 12)" + x,
                      k + " [4, 8)" + x + " <- " + qkv + " [24, 28)" + x,
                      v + " [0, 4)" + x + " <- " + qkv + " [12, 16)" + x,
                      v + " [4, 8)" + x + " <- " + qkv + " [28, 32)" + x,
                  }));
}

// Catches: a stacked tensor's box without its leading slot (a rank the
// tensor lacks) or at the wrong slot; up_proj placed in the first half of
// w13. Expert 2's up_proj [10, 16] is w13_weight [2, 3) x [10, 20) x [0, 16).
TEST(NameMap, StackedExpertsTakeAUnitLeadingBox) {
  const NameMap map = Map(ModelFamily::kQwen3Moe, MapDirection::kHfToVllm, Qwen3MoeDims());
  const std::string up = "model.layers.0.mlp.experts.2.up_proj.weight";
  const std::string w13 = "model.layers.0.mlp.experts.w13_weight";
  ASSERT_OK_AND_ASSIGN(const std::vector<Correspondence> got, tensor_correspondences(map, MapSide::kTrainer, up));
  const std::vector<Correspondence> want = {
      {w13, B({2, 10, 0}, {3, 20, 16}), up, B({0, 0}, {10, 16}), up, B({0, 0}, {10, 16})}};
  EXPECT_EQ(got, want);
}

// ---- Lookups, presets, errors ----

std::vector<NameMap> AllSmallMaps() {
  std::vector<NameMap> out;
  for (const MapDirection dir : {MapDirection::kMegatronToHf, MapDirection::kMegatronToVllm, MapDirection::kHfToVllm}) {
    out.push_back(Map(ModelFamily::kLlama, dir, LlamaDims()));
    out.push_back(Map(ModelFamily::kQwen3Moe, dir, Qwen3MoeDims(MegatronExperts::kStacked)));
    if (dir != MapDirection::kHfToVllm)
      out.push_back(Map(ModelFamily::kQwen3Moe, dir, Qwen3MoeDims(MegatronExperts::kPerExpert)));
  }
  return out;
}

std::vector<std::string> texts(const std::vector<Correspondence>& cs) {
  std::vector<std::string> out;
  for (const Correspondence& c : cs)
    out.push_back(c.ToString() + " (" + c.component + " " + box_text(c.component_box) + ")");
  std::sort(out.begin(), out.end());
  return out;
}

// Catches: a one-name lookup that misses pieces the whole-model join finds
// (only group 0 of linear_qkv, only expert 0 of a stacked tensor, a
// per-expert name matched to another expert), or that adds pieces of
// another layer.
TEST(NameMap, OneNameLookupsAgreeWithTheWholeModel) {
  for (const NameMap& map : AllSmallMaps()) {
    SCOPED_TRACE(map.ToString());
    ASSERT_OK_AND_ASSIGN(const std::vector<Correspondence> all, model_correspondences(map));
    for (const MapSide side : {MapSide::kEngine, MapSide::kTrainer}) {
      ASSERT_OK_AND_ASSIGN(const std::vector<MappedTensor> tensors, mapped_tensors(map, side));
      for (const MappedTensor& t : tensors) {
        std::vector<Correspondence> want;
        for (const Correspondence& c : all) {
          if ((side == MapSide::kEngine ? c.engine_name : c.trainer_name) == t.name) want.push_back(c);
        }
        ASSERT_OK_AND_ASSIGN(const std::vector<Correspondence> got, tensor_correspondences(map, side, t.name));
        if (side == MapSide::kEngine) {
          EXPECT_EQ(got, want) << t.name;  // same order, too
        } else {
          EXPECT_EQ(texts(got), texts(want)) << t.name;
        }
      }
    }
  }
}

ModelDims Llama3_8bDims() {
  return ModelDims{.hidden = 4096, .heads = 32, .kv_heads = 8, .head_dim = 128, .intermediate = 14336, .experts = 0,
                   .layers = 32, .vocab = 128256};
}
ModelDims Qwen3_30bA3bDims() {
  return ModelDims{.hidden = 2048, .heads = 32, .kv_heads = 4, .head_dim = 128, .intermediate = 768, .experts = 128,
                   .layers = 48, .vocab = 151936};
}

std::vector<MappedTensor> preset_tensors(const std::string& preset) {
  std::vector<MappedTensor> out;
  StatusOr<Model> model = make_model(preset, -1);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (!model.ok()) return out;
  for (const Weight& w : model->weights) out.push_back(MappedTensor{w.spec.name, w.spec.shape});
  return out;
}

// Catches: a Hugging Face name, shape or order that differs from refit's
// presets (src/model/presets.cc) at real sizes: k_proj sized by heads,
// a missing q_norm, experts ordered tensor by tensor instead of expert by
// expert. Also runs the whole-model check at those sizes, for every map.
TEST(NameMap, HfTensorsMatchTheModelPresets) {
  const NameMap llama = Map(ModelFamily::kLlama, MapDirection::kMegatronToHf, Llama3_8bDims());
  const NameMap qwen = Map(ModelFamily::kQwen3Moe, MapDirection::kHfToVllm, Qwen3_30bA3bDims());
  ASSERT_OK_AND_ASSIGN(const std::vector<MappedTensor> llama_hf, mapped_tensors(llama, MapSide::kEngine));
  ASSERT_OK_AND_ASSIGN(const std::vector<MappedTensor> qwen_hf, mapped_tensors(qwen, MapSide::kTrainer));
  EXPECT_EQ(llama_hf, preset_tensors("llama3-8b"));
  EXPECT_EQ(qwen_hf, preset_tensors("qwen3-30b-a3b"));

  for (const MapDirection dir : {MapDirection::kMegatronToHf, MapDirection::kMegatronToVllm, MapDirection::kHfToVllm}) {
    for (const NameMap& base : {llama, qwen}) {
      const NameMap map = Map(base.family, dir, base.dims);
      SCOPED_TRACE(map.ToString());
      ASSERT_OK_AND_ASSIGN(const std::vector<Correspondence> cs, model_correspondences(map));
      ASSERT_OK_AND_ASSIGN(const std::vector<MappedTensor> engine, mapped_tensors(map, MapSide::kEngine));
      ASSERT_OK_AND_ASSIGN(const std::vector<MappedTensor> trainer, mapped_tensors(map, MapSide::kTrainer));
      EXPECT_OK(check_correspondences(cs, engine, trainer));
    }
  }
}

// Catches: a lookup that accepts an index outside the model or a name with
// a leading zero, that finds a name on the wrong side or in the other
// Megatron expert form, or whose error does not name the tensor and map.
TEST(NameMap, LookupErrorsNameTheTensor) {
  const NameMap llama = Map(ModelFamily::kLlama, MapDirection::kMegatronToHf, LlamaDims());
  const auto s = [](const StatusOr<std::vector<Correspondence>>& r) { return r.status(); };

  const Status past = s(tensor_correspondences(llama, MapSide::kEngine, "model.layers.2.self_attn.q_proj.weight"));
  EXPECT_EQ(past.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(past.message(), "llama megatron->hf: engine tensor 'model.layers.2.self_attn.q_proj.weight'");
  EXPECT_HAS(past.message(), "layer 2 is outside the model's 2 layers");

  EXPECT_EQ(s(tensor_correspondences(llama, MapSide::kEngine, "model.layers.01.self_attn.q_proj.weight")).code(),
            StatusCode::kNotFound);
  const Status fused = s(tensor_correspondences(llama, MapSide::kEngine, "model.layers.0.self_attn.qkv_proj.weight"));
  EXPECT_EQ(fused.code(), StatusCode::kNotFound);
  EXPECT_HAS(fused.message(), "no engine tensor is named 'model.layers.0.self_attn.qkv_proj.weight'");
  EXPECT_HAS(fused.message(), "Hugging Face names, such as 'model.layers.0.input_layernorm.weight'");
  EXPECT_EQ(
      s(tensor_correspondences(llama, MapSide::kEngine, "decoder.layers.0.self_attention.linear_qkv.weight")).code(),
      StatusCode::kNotFound);

  const NameMap grouped =
      Map(ModelFamily::kQwen3Moe, MapDirection::kMegatronToHf, Qwen3MoeDims(MegatronExperts::kPerExpert));
  const Status expert =
      s(tensor_correspondences(grouped, MapSide::kTrainer, "decoder.layers.0.mlp.experts.linear_fc1.weight4"));
  EXPECT_EQ(expert.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(expert.message(), "expert 4 is outside the model's 4 experts");
  const NameMap stacked = Map(ModelFamily::kQwen3Moe, MapDirection::kMegatronToHf, Qwen3MoeDims());
  EXPECT_EQ(s(tensor_correspondences(stacked, MapSide::kTrainer, "decoder.layers.0.mlp.experts.linear_fc1.weight0"))
                .code(),
            StatusCode::kNotFound);
}

// Catches: dims accepted where heads are not a multiple of kv heads (the
// per-group split would drop rows), a Qwen3-MoE without experts, a Llama
// with some, or a zero extent; errors must name the map and the field.
TEST(NameMap, RejectsDimsThatCannotBeMapped) {
  ModelDims d = LlamaDims();
  d.kv_heads = 3;
  Status s = validate_name_map(Map(ModelFamily::kLlama, MapDirection::kMegatronToHf, d));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "llama megatron->hf: heads (4) must be a multiple of kv_heads (3)");

  d = Qwen3MoeDims();
  d.experts = 0;
  EXPECT_HAS(validate_name_map(Map(ModelFamily::kQwen3Moe, MapDirection::kHfToVllm, d)).message(),
             "qwen3-moe hf->vllm: experts must be at least 1 (it is 0)");
  d = LlamaDims();
  d.experts = 4;
  EXPECT_HAS(validate_name_map(Map(ModelFamily::kLlama, MapDirection::kHfToVllm, d)).message(), "Llama has no experts");
  d = LlamaDims();
  d.hidden = 0;
  EXPECT_HAS(mapped_tensors(Map(ModelFamily::kLlama, MapDirection::kHfToVllm, d), MapSide::kEngine).status().message(),
             "hidden must be at least 1 (it is 0)");
}

// ---- check_correspondences ----

struct Fixture {
  std::vector<Correspondence> cs;
  std::vector<MappedTensor> engine;
  std::vector<MappedTensor> trainer;
};

Fixture LlamaFixture() {
  const NameMap map = Map(ModelFamily::kLlama, MapDirection::kMegatronToHf, LlamaDims());
  Fixture f;
  f.cs = model_correspondences(map).value();
  f.engine = mapped_tensors(map, MapSide::kEngine).value();
  f.trainer = mapped_tensors(map, MapSide::kTrainer).value();
  return f;
}

// The index of the correspondence writing rows from `row` of `engine`.
std::size_t find(const Fixture& f, const std::string& engine, std::int64_t row) {
  for (std::size_t i = 0; i < f.cs.size(); ++i) {
    if (f.cs[i].engine_name == engine && f.cs[i].engine_box.begin[0] == row) return i;
  }
  ADD_FAILURE() << "no correspondence writes " << engine << " row " << row;
  return 0;
}

const std::string kK1 = "model.layers.1.self_attn.k_proj.weight";

// Catches: a check that misses an engine element nobody writes, or whose
// error does not name the tensor and say how much is written.
TEST(NameMapCheck, ReportsAnEngineGap) {
  Fixture f = LlamaFixture();
  ASSERT_OK(check_correspondences(f.cs, f.engine, f.trainer));
  f.cs.erase(f.cs.begin() + static_cast<std::ptrdiff_t>(find(f, kK1, 4)));
  const Status s = check_correspondences(f.cs, f.engine, f.trainer);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "engine tensor '" + kK1 + "' [8, 16]: the correspondences write 64 of its 128 elements");
}

// Catches: a check that lets two correspondences write one engine element
// (a sum-of-sizes check alone passes a duplicate that fills a gap).
TEST(NameMapCheck, ReportsADoubleWrite) {
  Fixture f = LlamaFixture();
  const std::size_t i = find(f, kK1, 4);
  f.cs[i].engine_box = B({0, 0}, {4, 16});  // writes rows 0..3 again, leaves 4..7 empty
  const Status s = check_correspondences(f.cs, f.engine, f.trainer);
  EXPECT_HAS(s.message(), "engine tensor '" + kK1 + "' [8, 16]: boxes [0, 4) x [0, 16) and [0, 4) x [0, 16) overlap");
  EXPECT_HAS(s.message(), "written twice");
}

// Catches: a check that lets one trainer element feed two engine elements
// (here k head 1 read from v head 1's rows, which v_proj reads too).
TEST(NameMapCheck, ReportsADoubleRead) {
  Fixture f = LlamaFixture();
  f.cs[find(f, kK1, 4)].trainer_box = B({28, 0}, {32, 16});
  const Status s = check_correspondences(f.cs, f.engine, f.trainer);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "trainer tensor 'decoder.layers.1.self_attention.linear_qkv.weight' [32, 16]: boxes");
  EXPECT_HAS(s.message(), "read twice");
}

// Catches: a check that accepts boxes of unequal extents, a box outside its
// tensor or of another rank, or a tensor neither side lists.
TEST(NameMapCheck, ReportsMalformedCorrespondences) {
  const Fixture good = LlamaFixture();
  const std::size_t i = find(good, kK1, 4);

  Fixture f = good;
  f.cs[i].trainer_box.end[0] += 1;
  EXPECT_HAS(check_correspondences(f.cs, f.engine, f.trainer).message(),
             "the boxes' extents differ ([4, 16] vs [5, 16]");

  f = good;
  f.cs[i].engine_box = B({6, 0}, {10, 16});
  EXPECT_HAS(check_correspondences(f.cs, f.engine, f.trainer).message(),
             "engine tensor '" + kK1 + "' [8, 16]: box [6, 10) x [0, 16) is not inside the tensor along dim 0");

  f = good;
  f.cs[i].engine_box = B({4}, {8});
  EXPECT_HAS(check_correspondences(f.cs, f.engine, f.trainer).message(), "does not have the tensor's 2 dimensions");

  f = good;
  f.cs[i].engine_name = "model.layers.1.self_attn.kv_proj.weight";
  EXPECT_HAS(check_correspondences(f.cs, f.engine, f.trainer).message(),
             "names engine tensor 'model.layers.1.self_attn.kv_proj.weight', which the engine does not hold");

  f = good;
  f.trainer.push_back(f.trainer.front());
  EXPECT_HAS(check_correspondences(f.cs, f.engine, f.trainer).message(),
             "trainer tensor 'embedding.word_embeddings.weight' is listed twice");
}

}  // namespace
}  // namespace refit
