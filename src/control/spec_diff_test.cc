// The words a plan digest mismatch is explained in (spec_diff.h), and the
// coordinator's use of them (topology.h).
#include "control/spec_diff.h"

#include <gtest/gtest.h>

#include "control/topology.h"
#include "refit/plan.h"

namespace refit {
namespace {

const TensorSpec kEmbed{"embed", DType::kBFloat16, {8, 4}};
const TensorSpec kNorm{"layers.0.norm", DType::kFloat32, {4}};
const TensorSpec kMlp{"layers.1.mlp", DType::kBFloat16, {4, 16}};

std::string diff(const std::vector<TensorSpec>& trainer, const std::vector<TensorSpec>& engine) {
  return first_spec_difference({"trainer rank 1", &trainer}, {"engine rank 1", &engine});
}

// Catches: a comparison that skips a field (mutation tried: the dtype
// comparison left out of differing_fields; "tensor 1 differs in dtype" was
// then never said and this test failed), and one that names the wrong index
// or only one side.
TEST(FirstSpecDifference, NamesTheIndexTheFieldsAndBothTensors) {
  TensorSpec half_norm = kNorm;
  half_norm.dtype = DType::kBFloat16;
  EXPECT_EQ(diff({kEmbed, half_norm, kMlp}, {kEmbed, kNorm, kMlp}),
            "tensor 1 differs in dtype: trainer rank 1 has 'layers.0.norm' bfloat16[4], engine rank 1 has "
            "'layers.0.norm' float32[4]");
  TensorSpec wide = kMlp;
  wide.shape = {4, 32};
  EXPECT_EQ(diff({kEmbed, kNorm, wide}, {kEmbed, kNorm, kMlp}),
            "tensor 2 differs in shape: trainer rank 1 has 'layers.1.mlp' bfloat16[4, 32], engine rank 1 has "
            "'layers.1.mlp' bfloat16[4, 16]");
  EXPECT_EQ(diff({kEmbed, kMlp}, {kEmbed, kNorm}),
            "tensor 1 differs in name, dtype and shape: trainer rank 1 has 'layers.1.mlp' bfloat16[4, 16], engine "
            "rank 1 has 'layers.0.norm' float32[4]");
}

// Catches: a longer stream on either side (another --layers) reported as
// equal, or without the first tensor the shorter side lacks.
TEST(FirstSpecDifference, OneStreamLongerNamesItsFirstExtraTensor) {
  EXPECT_EQ(diff({kEmbed, kNorm}, {kEmbed, kNorm, kMlp}),
            "trainer rank 1 has 2 tensors, engine rank 1 has 3: the first one more is tensor 2 'layers.1.mlp' "
            "bfloat16[4, 16] of engine rank 1");
  EXPECT_EQ(diff({kEmbed, kNorm, kMlp}, {kEmbed}),
            "trainer rank 1 has 3 tensors, engine rank 1 has 1: the first one more is tensor 1 'layers.0.norm' "
            "float32[4] of trainer rank 1");
  EXPECT_EQ(diff({kEmbed}, {}), "trainer rank 1 has 1 tensor, engine rank 1 has 0: the first one more is tensor 0 "
                                "'embed' bfloat16[8, 4] of trainer rank 1");
  EXPECT_EQ(diff({kEmbed, kNorm}, {kEmbed, kNorm}), "");
}

std::string diff(const std::vector<TensorSpec>& trainer, const std::vector<ShardRule>& trainer_rules,
                 const std::vector<TensorSpec>& engine, const std::vector<ShardRule>& engine_rules) {
  return first_spec_difference({"trainer rank 1", &trainer, &trainer_rules}, {"engine rank 1", &engine, &engine_rules});
}

// Catches: a tensor whose only difference is its shard rule reported as
// equal (mutation: the `*rule_a != *rule_b` comparison left out of
// differing_fields, so diff returns ""), or named without the rule on each
// side.
TEST(FirstSpecDifference, ARuleOnlyDifferenceNamesBothRules) {
  const std::vector<TensorSpec> stream = {kEmbed, kNorm, kMlp};
  EXPECT_EQ(diff(stream, {ShardRule::kVocab, ShardRule::kReplicated, ShardRule::kRow}, stream,
                 {ShardRule::kVocab, ShardRule::kReplicated, ShardRule::kColumn}),
            "tensor 2 differs in rule: trainer rank 1 has 'layers.1.mlp' bfloat16[4, 16] (rule row), engine rank 1 "
            "has 'layers.1.mlp' bfloat16[4, 16] (rule column)");
  EXPECT_EQ(diff(stream, {ShardRule::kVocab, ShardRule::kReplicated, ShardRule::kRow}, stream,
                 {ShardRule::kVocab, ShardRule::kReplicated, ShardRule::kRow}),
            "");
}

// Catches: rules shown or compared when only one side sent them (an engine
// bound without a model sends none), and a shape difference that no longer
// shows the rules beside it when both sent them.
TEST(FirstSpecDifference, RulesAreShownOnlyWhenBothSidesSentThem) {
  TensorSpec half = kMlp;
  half.shape = {2, 16};
  const std::vector<ShardRule> replicated = {ShardRule::kVocab, ShardRule::kReplicated, ShardRule::kReplicated};
  const std::vector<ShardRule> column = {ShardRule::kVocab, ShardRule::kReplicated, ShardRule::kColumn};
  EXPECT_EQ(diff({kEmbed, kNorm, half}, column, {kEmbed, kNorm, kMlp}, replicated),
            "tensor 2 differs in shape and rule: trainer rank 1 has 'layers.1.mlp' bfloat16[2, 16] (rule column), "
            "engine rank 1 has 'layers.1.mlp' bfloat16[4, 16] (rule replicated)");
  EXPECT_EQ(diff({kEmbed, kNorm, half}, column, {kEmbed, kNorm, kMlp}, {}),
            "tensor 2 differs in shape: trainer rank 1 has 'layers.1.mlp' bfloat16[2, 16], engine rank 1 has "
            "'layers.1.mlp' bfloat16[4, 16]");
  EXPECT_EQ(diff({kEmbed, kNorm, kMlp}, column, {kEmbed, kNorm, kMlp}, {}), "");
  EXPECT_EQ(diff({kEmbed}, {ShardRule::kVocab}, {kEmbed, kNorm}, {ShardRule::kVocab, ShardRule::kReplicated}),
            "trainer rank 1 has 1 tensor, engine rank 1 has 2: the first one more is tensor 1 'layers.0.norm' "
            "float32[4] (rule replicated) of engine rank 1");
}

Join joined(Role role, const std::vector<TensorSpec>& specs) {
  Join j;
  j.role = role;
  j.trainer_ranks = j.engine_ranks = 1;
  j.bucket_size = 1 << 20;
  j.transport = "tcp";
  j.mode = "staged";
  j.pool_slots = 2;
  j.specs = specs;
  j.plan_digest = make_plan(specs, j.bucket_size).value().digest_hex();
  return j;
}

// Catches: the coordinator's digest mismatch without the first differing
// tensor when the trainer sent its specs, without each side's rule when
// both sent rules (mutation: why_digests_differ passing no rules to
// first_spec_difference, so the "(rule row)" needle is missing), and
// without the settings to compare when the trainer sent no specs.
TEST(PlanTopology, DigestMismatchNamesTheFirstDifferingTensor) {
  TensorSpec half_norm = kNorm;
  half_norm.dtype = DType::kBFloat16;
  const Join engine = joined(Role::kEngine, {kEmbed, kNorm});
  Join trainer = joined(Role::kTrainer, {kEmbed, half_norm});
  auto topology = plan_topology({trainer}, {engine}, 1, false);
  ASSERT_FALSE(topology.ok());
  EXPECT_EQ(topology.status().code(), StatusCode::kFailedPrecondition);
  const std::string message = topology.status().message();
  EXPECT_NE(message.find("plan digest mismatch: trainer rank 0 computed " + trainer.plan_digest), std::string::npos)
      << message;
  EXPECT_NE(message.find("tensor 1 differs in dtype: trainer rank 0 has 'layers.0.norm' bfloat16[4], engine rank 0 "
                         "has 'layers.0.norm' float32[4]"),
            std::string::npos)
      << message;
  // With both sides' rules, the tensor is shown with each side's rule.
  trainer.rules = {ShardRule::kVocab, ShardRule::kRow};
  Join ruled_engine = engine;
  ruled_engine.rules = {ShardRule::kVocab, ShardRule::kReplicated};
  const std::string ruled = plan_topology({trainer}, {ruled_engine}, 1, false).status().message();
  EXPECT_NE(ruled.find("tensor 1 differs in dtype and rule: trainer rank 0 has 'layers.0.norm' bfloat16[4] (rule row), "
                       "engine rank 0 has 'layers.0.norm' float32[4] (rule replicated)"),
            std::string::npos)
      << ruled;
  trainer.rules.clear();
  trainer.specs.clear();  // a trainer that sent only its digest
  const std::string without = plan_topology({trainer}, {engine}, 1, false).status().message();
  EXPECT_NE(without.find("compare the --model, --layers and --rule of trainer rank 0 and engine rank 0"),
            std::string::npos)
      << without;
}

}  // namespace
}  // namespace refit
