#include "refit/expert_parallel.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "testing/expect_has.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

// Catches: owners that are not contiguous ranges in expert order, ranges
// whose sizes differ by more than one, or the extra experts given to the
// last ranks instead of the first (vLLM's expert map gives them to the
// first): compared with a brute-force tensor_split of the expert list.
TEST(ExpertOwner, ContiguousRangesTheFirstRanksHoldingOneMore) {
  for (int experts = 1; experts <= 40; ++experts) {
    for (int ranks = 1; ranks <= 9; ++ranks) {
      std::vector<int> want;
      for (int r = 0; r < ranks; ++r) {
        const int count = experts / ranks + (r < experts % ranks ? 1 : 0);
        for (int i = 0; i < count; ++i) want.push_back(r);
      }
      for (int j = 0; j < experts; ++j) {
        ASSERT_EQ(expert_owner(j, experts, ranks), want[static_cast<std::size_t>(j)])
            << "expert " << j << " of " << experts << " over " << ranks << " ranks";
      }
    }
  }
}

// Catches: expert tensors left with their TP rule (each rank would hold a
// slice of every expert), non-expert tensors changed (the router, attention
// and norms keep their TP rules), or a wrong expert count per layer.
TEST(EngineExpertModel, ExpertTensorsGetTheirOwnerAndTheRestKeepTheirRules) {
  ASSERT_OK_AND_ASSIGN(const Model tp, make_model("tiny-moe", -1));
  ASSERT_OK_AND_ASSIGN(const Model ep, engine_expert_model(tp, EngineExperts::kEp, 3));
  ASSERT_EQ(ep.weights.size(), tp.weights.size());
  std::map<int, std::uint64_t> bytes_per_rank;
  int expert_tensors = 0;
  for (std::size_t i = 0; i < ep.weights.size(); ++i) {
    const Weight& w = ep.weights[i];
    const bool expert = w.spec.name.find(".experts.") != std::string::npos;
    if (!expert) {
      EXPECT_EQ(w.rule, tp.weights[i].rule) << w.spec.name;
      continue;
    }
    ++expert_tensors;
    EXPECT_EQ(w.rule, ShardRule::kExpert) << w.spec.name;
    EXPECT_EQ(w.experts, 64) << w.spec.name;
    for (int r = 0; r < 3; ++r) {
      const std::uint64_t held = shard_spec(w, r, 3).nbytes();
      EXPECT_TRUE(held == 0 || held == w.spec.nbytes()) << w.spec.name << " rank " << r << ": whole or nothing";
      bytes_per_rank[r] += held;
    }
  }
  EXPECT_EQ(expert_tensors, 2 * 64 * 3);  // 2 layers, 64 experts, gate/up/down
  // 64 experts over 3 ranks: 22, 21, 21 experts' bytes.
  const std::uint64_t per_expert = bytes_per_rank[0] / 22;
  EXPECT_EQ(bytes_per_rank[0], 22 * per_expert);
  EXPECT_EQ(bytes_per_rank[1], 21 * per_expert);
  EXPECT_EQ(bytes_per_rank[2], 21 * per_expert);
  ASSERT_OK_AND_ASSIGN(const Model same, engine_expert_model(tp, EngineExperts::kTp, 3));
  for (std::size_t i = 0; i < same.weights.size(); ++i) EXPECT_EQ(same.weights[i].rule, tp.weights[i].rule);
}

// A stacked [E, ...] expert tensor splits into whole experts along dim 0; a
// per-expert scalar (an FP8 checkpoint's input_scale) stays replicated.
// Catches: stacked tensors split along another dim or left to their TP
// rule, the extra expert given to the last rank, and a scalar made kExpert
// (its non-owners would hold "0 rows" of a tensor without rows).
TEST(EngineExpertModel, StackedExpertsSplitAlongDimZero) {
  Model m;
  m.preset = "stacked";
  m.weights.push_back(Weight{TensorSpec{"model.layers.0.mlp.experts.w13_weight", DType::kBFloat16, {5, 8, 4}},
                             ShardRule::kColumn});
  ASSERT_OK_AND_ASSIGN(const Model ep, engine_expert_model(m, EngineExperts::kEp, 2));
  EXPECT_EQ(ep.weights[0].rule, ShardRule::kExpert);
  EXPECT_EQ(ep.weights[0].expert, -1);
  EXPECT_EQ(shard_spec(ep.weights[0], 0, 2).shape, (std::vector<std::int64_t>{3, 8, 4}));
  EXPECT_EQ(shard_spec(ep.weights[0], 1, 2).shape, (std::vector<std::int64_t>{2, 8, 4}));
  Model scales;
  scales.preset = "fp8-scales";
  for (int j : {0, 1}) {
    const std::string e = "model.layers.0.mlp.experts." + std::to_string(j);
    scales.weights.push_back(Weight{TensorSpec{e + ".down_proj.weight", DType::kBFloat16, {4, 8}}, ShardRule::kRow});
    scales.weights.push_back(Weight{TensorSpec{e + ".down_proj.input_scale", DType::kFloat32, {}},
                                    ShardRule::kReplicated});
  }
  ASSERT_OK_AND_ASSIGN(const Model ep_scales, engine_expert_model(scales, EngineExperts::kEp, 2));
  EXPECT_EQ(ep_scales.weights[0].rule, ShardRule::kExpert);
  EXPECT_EQ(ep_scales.weights[1].rule, ShardRule::kReplicated);
  EXPECT_EQ(shard_spec(ep_scales.weights[1], 1, 2).nbytes(), 4u);
}

// Catches: ep accepted where it cannot hold (a dense model, a rank left
// without experts, expert indices with a gap), or errors that do not name
// the model and the layer or tensor.
TEST(EngineExpertModel, RefusalsNameTheModelAndTheLayer) {
  ASSERT_OK_AND_ASSIGN(const Model dense, make_model("tiny", -1));
  const auto none = engine_expert_model(dense, EngineExperts::kEp, 2);
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(none.status().message(), "model 'tiny', --engine-experts ep: the model has no expert tensors");
  ASSERT_OK_AND_ASSIGN(const Model moe, make_model("tiny-moe", 1));
  const auto few = engine_expert_model(moe, EngineExperts::kEp, 65);
  EXPECT_HAS(few.status().message(), "layer 'model.layers.0.mlp' has 64 experts for 65 engine ranks");
  Model gap;
  gap.preset = "gap";
  for (int j : {0, 1, 3}) {
    gap.weights.push_back(Weight{TensorSpec{"l.experts." + std::to_string(j) + ".w", DType::kUInt8, {2, 2}},
                                 ShardRule::kColumn});
  }
  EXPECT_HAS(engine_expert_model(gap, EngineExperts::kEp, 2).status().message(),
             "layer 'l' has 3 experts numbered up to 3 (expected 0..2)");
  EXPECT_HAS(parse_engine_experts("moe").status().message(), "--engine-experts 'moe': expected tp");
  ASSERT_OK_AND_ASSIGN(const EngineExperts ep, parse_engine_experts("ep"));
  EXPECT_EQ(engine_experts_name(ep), "ep");
}

}  // namespace
}  // namespace refit
