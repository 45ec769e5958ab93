// `--quantize` (refit/quantize.h): the text, the default selection, the
// engine's model under it, and the rule that every engine rank holds whole
// 128-blocks (checked against a brute-force split over random shapes).
#include "refit/quantize.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "testing/expect_has.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

Weight matrix(std::string name, std::vector<std::int64_t> shape, ShardRule rule) {
  return Weight{TensorSpec{std::move(name), DType::kBFloat16, std::move(shape)}, rule};
}

// Catches: a format name or glob list read wrong, an empty glob accepted
// (it would select nothing silently), ToString not giving back the text.
TEST(QuantizeSpec, ParsesTheFormsAndRefusesTheRestNamingThem) {
  for (const char* text : {"none", "fp8-block128", "fp8-block128:*", "fp8-block128:*.q_proj.weight,*.k_proj.weight"}) {
    ASSERT_OK_AND_ASSIGN(const QuantizeSpec spec, parse_quantize(text));
    EXPECT_EQ(spec.ToString(), text);
  }
  ASSERT_OK_AND_ASSIGN(const QuantizeSpec two, parse_quantize("fp8-block128:a,b"));
  EXPECT_EQ(two.format, QuantFormat::kFp8Block128);
  EXPECT_EQ(two.globs, (std::vector<std::string>{"a", "b"}));
  EXPECT_HAS(parse_quantize("fp8").status().message(), "expected none, fp8-block128");
  EXPECT_HAS(parse_quantize("fp8-block128:").status().message(), "an empty glob");
  EXPECT_HAS(parse_quantize("fp8-block128:a,,b").status().message(), "an empty glob");
}

// Catches: the router, an embedding, lm_head or a norm quantized by
// default (tried: the router's pattern dropped: fails); a linear weight of the attention or an expert left out; globs
// ignored or applied to 1-D tensors.
TEST(QuantizeSpec, TheDefaultSelectsTheLinearWeightsOnly) {
  ASSERT_OK_AND_ASSIGN(const Model model, make_model("tiny-moe", 1));
  ASSERT_OK_AND_ASSIGN(const QuantizeSpec spec, parse_quantize("fp8-block128"));
  std::vector<std::string> kept;
  int selected = 0;
  for (const Weight& w : model.weights) {
    if (quantizes(spec, w)) {
      ++selected;
    } else {
      kept.push_back(w.spec.name);
    }
  }
  EXPECT_EQ(selected, 4 + 3 * 64);  // q, k, v, o and every expert's gate, up, down
  EXPECT_EQ(kept, (std::vector<std::string>{"model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                                            "model.layers.0.self_attn.q_norm.weight",
                                            "model.layers.0.self_attn.k_norm.weight",
                                            "model.layers.0.post_attention_layernorm.weight",
                                            "model.layers.0.mlp.gate.weight", "model.norm.weight", "lm_head.weight"}));
  ASSERT_OK_AND_ASSIGN(const QuantizeSpec all, parse_quantize("fp8-block128:*"));
  EXPECT_TRUE(quantizes(all, model.weights.front()));  // the embedding, when asked for
  EXPECT_FALSE(quantizes(all, model.weights[1]));      // a norm: 1-D, never
}

// Catches: scales placed before their codes or not at all, a scale of the
// wrong shape or dtype, the codes' rule or expert fields dropped (the
// engine would split them otherwise), sources pointing at the wrong weight.
TEST(QuantizeModel, EachQuantizedWeightBecomesItsCodesThenItsScales) {
  Model model;
  model.weights = {matrix("a.weight", {300, 200}, ShardRule::kColumn),
                   Weight{TensorSpec{"n.weight", DType::kFloat32, {200}}, ShardRule::kReplicated},
                   matrix("e.weight", {4, 256, 130}, ShardRule::kExpert)};
  model.weights[2].experts = 4;
  ASSERT_OK_AND_ASSIGN(const QuantizedModel q, quantize_model(model, *parse_quantize("fp8-block128"), 1));
  ASSERT_EQ(q.engine.weights.size(), 5u);
  EXPECT_EQ(q.quantized_tensors, 2u);
  const std::vector<std::string> names = {"a.weight", "a.weight_scale_inv", "n.weight", "e.weight",
                                          "e.weight_scale_inv"};
  const std::vector<QuantSource> sources = {{0, QuantPart::kCodes}, {0, QuantPart::kScales}, {1, QuantPart::kCopy},
                                            {2, QuantPart::kCodes}, {2, QuantPart::kScales}};
  for (std::size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(q.engine.weights[i].spec.name, names[i]);
    EXPECT_EQ(q.sources[i], sources[i]) << names[i];
  }
  EXPECT_EQ(q.engine.weights[0].spec.dtype, DType::kFloat8E4M3FN);
  EXPECT_EQ(q.engine.weights[0].spec.shape, (std::vector<std::int64_t>{300, 200}));
  EXPECT_EQ(q.engine.weights[1].spec.dtype, DType::kFloat32);
  EXPECT_EQ(q.engine.weights[1].spec.shape, (std::vector<std::int64_t>{3, 2}));
  EXPECT_EQ(q.engine.weights[1].rule, ShardRule::kColumn);
  EXPECT_EQ(q.engine.weights[4].spec.shape, (std::vector<std::int64_t>{4, 2, 2}));
  EXPECT_EQ(q.engine.weights[4].rule, ShardRule::kExpert);
  EXPECT_EQ(q.engine.weights[4].experts, 4);
  ASSERT_OK_AND_ASSIGN(const QuantizedModel none, quantize_model(model, QuantizeSpec{}, 3));
  EXPECT_EQ(none.engine.weights.size(), 3u);
  EXPECT_EQ(none.quantized_tensors, 0u);
}

// Catches: a split that cuts a 128-block accepted, the refusal not naming
// the tensor, the ranks and the row (tried: the boundary check removed:
// this test fails, while the property test below still passes, as the
// scales' check refuses the same splits with a vaguer message); a glob that selects nothing accepted
// (a typo would quietly send bf16); a scale name that exists already.
TEST(QuantizeModel, RefusalsNameTheTensorAndWhy) {
  ASSERT_OK_AND_ASSIGN(const Model tiny, make_model("tiny", 1));
  const QuantizeSpec spec = *parse_quantize("fp8-block128");
  EXPECT_OK(quantize_model(tiny, spec, 1).status());
  // tiny's MLP is 1408 rows wide: 704 per rank of 2, inside block 5.
  EXPECT_HAS(quantize_model(tiny, spec, 2).status().message(),
             "tensor 'model.layers.0.mlp.gate_proj.weight' bfloat16[1408, 512], rule column over 2 engine ranks: the "
             "boundary between ranks 0 and 1 at row 704 cuts 128-row block 5");
  // Its 256 k rows: 64 per rank of 4.
  EXPECT_HAS(quantize_model(tiny, spec, 4).status().message(),
             "tensor 'model.layers.0.self_attn.k_proj.weight' bfloat16[256, 512], rule column over 4 engine ranks: "
             "the boundary between ranks 0 and 1 at row 64 cuts 128-row block 0");
  EXPECT_HAS(quantize_model(tiny, *parse_quantize("fp8-block128:*.qproj.weight"), 1).status().message(),
             "glob '*.qproj.weight' selects no 2-D or 3-D weight");
  Model clash;
  clash.weights = {matrix("a.weight", {128, 128}, ShardRule::kReplicated),
                   matrix("a.weight_scale_inv", {1, 1}, ShardRule::kReplicated)};
  EXPECT_HAS(quantize_model(clash, *parse_quantize("fp8-block128:a.weight"), 1).status().message(),
             "which the model already holds");
}

// Catches: any mistake in the boundary rule (an accepted split whose ranks
// do not hold whole blocks, a refused one whose ranks do, scales split
// otherwise than the weight's blocks), over random shapes, rules and rank
// counts, checked by enumerating every rank's rows or columns.
TEST(QuantizeModel, AcceptsExactlyTheSplitsWhoseRanksHoldWholeBlocks) {
  std::mt19937 rng(20261204);
  int accepted = 0, refused = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    const std::int64_t rows = std::uniform_int_distribution<std::int64_t>(1, 1200)(rng);
    const std::int64_t cols = std::uniform_int_distribution<std::int64_t>(1, 1200)(rng);
    const int ranks = std::uniform_int_distribution<int>(1, 8)(rng);
    const ShardRule rule = (iter % 2 == 0) ? ShardRule::kColumn : ShardRule::kRow;
    Model model;
    model.weights = {matrix("w.weight", {rows, cols}, rule)};
    const StatusOr<QuantizedModel> q = quantize_model(model, *parse_quantize("fp8-block128"), ranks);
    const std::int64_t size = rule == ShardRule::kColumn ? rows : cols;
    bool whole = true;  // brute force: every boundary inside the tensor on a multiple of 128
    for (int r = 0; r + 1 < ranks; ++r) {
      const ShardSlice s = shard_slice(model.weights[0], r, ranks);
      whole = whole && (s.end >= size || s.end % 128 == 0);
    }
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + " over " + std::to_string(ranks));
    ASSERT_EQ(q.ok(), whole) << q.status().ToString();
    if (!q.ok()) {
      ++refused;
      continue;
    }
    ++accepted;
    for (int r = 0; r < ranks; ++r) {
      const ShardSlice w = shard_slice(q->engine.weights[0], r, ranks);
      const ShardSlice b = shard_slice(q->engine.weights[1], r, ranks);
      if (w.begin == w.end) {
        EXPECT_EQ(b.begin, b.end);
        continue;
      }
      EXPECT_EQ(b.begin, w.begin / 128);
      EXPECT_EQ(b.end, (w.end + 127) / 128);
    }
  }
  EXPECT_GT(accepted, 200);
  EXPECT_GT(refused, 200);
}

}  // namespace
}  // namespace refit
