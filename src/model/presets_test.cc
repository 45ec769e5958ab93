#include <set>
#include <string>

#include <gtest/gtest.h>

#include "refit/model.h"

namespace refit {
namespace {

Model must_make(const std::string& preset, int layers = -1) {
  StatusOr<Model> m = make_model(preset, layers);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : Model{};
}

// Catches: a missing or extra per-layer tensor (e.g. forgetting o_proj), wrong
// shapes (e.g. q_proj sized kv_heads), the llama preset gaining q_norm/k_norm.
TEST(PresetsTest, Llama3_8bMatchesTheRealCheckpoint) {
  const Model m = must_make("llama3-8b");
  EXPECT_EQ(m.preset, "llama3-8b");
  EXPECT_EQ(m.weights.size(), 291u);
  // 8,030,261,248 parameters: bf16 matrices plus 65 fp32 norms of 4096.
  const std::uint64_t params = 8030261248ULL;
  const std::uint64_t norm_params = 65ULL * 4096;
  EXPECT_EQ(m.total_bytes(), (params - norm_params) * 2 + norm_params * 4);
  EXPECT_NEAR(static_cast<double>(m.total_bytes()), 16.06e9, 0.01e9);
}

// Catches: MoE layers missing the router, the expert count or q_norm/k_norm.
TEST(PresetsTest, Qwen3MoeWith24LayersHas9435Tensors) {
  const Model m = must_make("qwen3-30b-a3b", 24);
  EXPECT_EQ(m.weights.size(), 9435u);
  EXPECT_NEAR(static_cast<double>(m.total_bytes()), 31.2e9, 0.1e9);
  const Model full = must_make("qwen3-30b-a3b");
  EXPECT_EQ(full.weights.size(), 3u + 48u * 393u);
}

TEST(PresetsTest, TinyIsTensOfMegabytesAndTinyMoeHasHundredsOfTensors) {
  const Model tiny = must_make("tiny");
  EXPECT_GT(tiny.total_bytes(), 10'000'000u);
  EXPECT_LT(tiny.total_bytes(), 100'000'000u);
  EXPECT_EQ(tiny.weights.size(), 3u + 4u * 9u);
  const Model moe = must_make("tiny-moe");
  EXPECT_GE(moe.weights.size(), 200u);
  EXPECT_LT(moe.weights.size(), 1000u);
  EXPECT_EQ(moe.weights.size(), 3u + 2u * (8u + 1u + 64u * 3u));
}

// Catches: a preset that lists only bf16 (rule 5 multi-dtype batches would go
// untested), duplicate names (e.g. expert index not in the name).
TEST(PresetsTest, EveryPresetHasTwoDtypesAndUniqueNames) {
  ASSERT_EQ(model_presets().size(), 4u);
  for (const std::string& preset : model_presets()) {
    const Model m = must_make(preset, preset == "qwen3-30b-a3b" ? 2 : -1);
    std::set<DType> dtypes;
    std::set<std::string> names;
    for (const Weight& w : m.weights) {
      dtypes.insert(w.spec.dtype);
      names.insert(w.spec.name);
      EXPECT_FALSE(w.spec.shape.empty()) << w.spec.name;
      for (std::int64_t d : w.spec.shape) EXPECT_GT(d, 0) << w.spec.name;
    }
    EXPECT_GE(dtypes.size(), 2u) << preset;
    EXPECT_EQ(names.size(), m.weights.size()) << preset;
  }
}

// Catches: a wrong order, a wrong HF name, a wrong rule or a transposed shape.
TEST(PresetsTest, TinyMoeLayerOrderNamesShapesAndRules) {
  const Model m = must_make("tiny-moe", 1);
  ASSERT_EQ(m.weights.size(), 3u + 8u + 1u + 64u * 3u);
  struct Expect {
    const char* name;
    DType dtype;
    std::vector<std::int64_t> shape;
    ShardRule rule;
  };
  const Expect head[] = {
      {"model.embed_tokens.weight", DType::kBFloat16, {4096, 256}, ShardRule::kVocab},
      {"model.layers.0.input_layernorm.weight", DType::kFloat32, {256}, ShardRule::kReplicated},
      {"model.layers.0.self_attn.q_proj.weight", DType::kBFloat16, {256, 256}, ShardRule::kColumn},
      {"model.layers.0.self_attn.k_proj.weight", DType::kBFloat16, {128, 256}, ShardRule::kColumn},
      {"model.layers.0.self_attn.v_proj.weight", DType::kBFloat16, {128, 256}, ShardRule::kColumn},
      {"model.layers.0.self_attn.q_norm.weight", DType::kFloat32, {64}, ShardRule::kReplicated},
      {"model.layers.0.self_attn.k_norm.weight", DType::kFloat32, {64}, ShardRule::kReplicated},
      {"model.layers.0.self_attn.o_proj.weight", DType::kBFloat16, {256, 256}, ShardRule::kRow},
      {"model.layers.0.post_attention_layernorm.weight", DType::kFloat32, {256}, ShardRule::kReplicated},
      {"model.layers.0.mlp.gate.weight", DType::kBFloat16, {64, 256}, ShardRule::kReplicated},
      {"model.layers.0.mlp.experts.0.gate_proj.weight", DType::kBFloat16, {128, 256}, ShardRule::kColumn},
      {"model.layers.0.mlp.experts.0.up_proj.weight", DType::kBFloat16, {128, 256}, ShardRule::kColumn},
      {"model.layers.0.mlp.experts.0.down_proj.weight", DType::kBFloat16, {256, 128}, ShardRule::kRow},
      {"model.layers.0.mlp.experts.1.gate_proj.weight", DType::kBFloat16, {128, 256}, ShardRule::kColumn},
  };
  for (std::size_t i = 0; i < std::size(head); ++i) {
    const Weight& w = m.weights[i];
    EXPECT_EQ(w.spec.name, head[i].name) << i;
    EXPECT_EQ(w.spec.dtype, head[i].dtype) << head[i].name;
    EXPECT_EQ(w.spec.shape, head[i].shape) << head[i].name;
    EXPECT_EQ(w.rule, head[i].rule) << head[i].name;
  }
  const std::size_t n = m.weights.size();
  EXPECT_EQ(m.weights[n - 3].spec.name, "model.layers.0.mlp.experts.63.down_proj.weight");
  EXPECT_EQ(m.weights[n - 2].spec.name, "model.norm.weight");
  EXPECT_EQ(m.weights[n - 2].spec.dtype, DType::kFloat32);
  EXPECT_EQ(m.weights[n - 1].spec.name, "lm_head.weight");
  EXPECT_EQ(m.weights[n - 1].rule, ShardRule::kVocab);
}

TEST(PresetsTest, DenseLayerIsLlamaStyle) {
  const Model m = must_make("tiny", 1);
  std::vector<std::string> names;
  for (const Weight& w : m.weights) names.push_back(w.spec.name);
  const std::vector<std::string> want = {
      "model.embed_tokens.weight",
      "model.layers.0.input_layernorm.weight",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.o_proj.weight",
      "model.layers.0.post_attention_layernorm.weight",
      "model.layers.0.mlp.gate_proj.weight",
      "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight",
      "model.norm.weight",
      "lm_head.weight",
  };
  EXPECT_EQ(names, want);
  EXPECT_EQ(m.weights[9].spec.shape, (std::vector<std::int64_t>{512, 1408}));
  EXPECT_EQ(m.weights[9].rule, ShardRule::kRow);
}

// Catches: `layers` ignored, off by one, or keeping the last layers instead of the first.
TEST(PresetsTest, LayersKeepsTheFirstN) {
  const Model full = must_make("tiny");
  for (int layers = 0; layers <= 4; ++layers) {
    const Model m = must_make("tiny", layers);
    ASSERT_EQ(m.weights.size(), 3u + 9u * static_cast<unsigned>(layers));
    // The first 1 + 9 * layers weights are the full model's prefix.
    for (std::size_t i = 0; i + 2 < m.weights.size(); ++i) EXPECT_EQ(m.weights[i].spec, full.weights[i].spec);
    EXPECT_EQ(m.weights[m.weights.size() - 1].spec, full.weights.back().spec);
    if (layers > 0) {
      EXPECT_EQ(m.weights[m.weights.size() - 3].spec.name,
                "model.layers." + std::to_string(layers - 1) + ".mlp.down_proj.weight");
    }
  }
  EXPECT_EQ(must_make("tiny", 0).weights.size(), 3u);
}

// Catches: accepting too many layers silently, messages that do not name the value.
TEST(PresetsTest, ErrorsNameTheValueAndTheValidChoices) {
  StatusOr<Model> bad_layers = make_model("tiny", 5);
  ASSERT_FALSE(bad_layers.ok());
  EXPECT_EQ(bad_layers.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_layers.status().message().find("5"), std::string::npos) << bad_layers.status().message();
  EXPECT_NE(bad_layers.status().message().find("0..4"), std::string::npos) << bad_layers.status().message();

  StatusOr<Model> bad_preset = make_model("llama-9000", -1);
  ASSERT_FALSE(bad_preset.ok());
  EXPECT_EQ(bad_preset.status().code(), StatusCode::kInvalidArgument);
  const std::string msg = bad_preset.status().message();
  EXPECT_NE(msg.find("llama-9000"), std::string::npos) << msg;
  for (const std::string& p : model_presets()) EXPECT_NE(msg.find(p), std::string::npos) << msg;

  EXPECT_TRUE(make_model("qwen3-30b-a3b", 48).ok());
  EXPECT_FALSE(make_model("qwen3-30b-a3b", 49).ok());
}

}  // namespace
}  // namespace refit
