#include "refit/trainer_layout.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "testing/expect_has.h"
#include "testing/random_layout.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

TrainerLayout Sharded(int tp, int fsdp) { return TrainerLayout{.tp = tp, .fsdp = fsdp, .full = false}; }

Weight W(std::string name, std::vector<std::int64_t> shape, ShardRule rule) {
  return Weight{TensorSpec{std::move(name), DType::kBFloat16, std::move(shape)}, rule};
}

// The layout of the one weight of a model made of `weight` alone.
StatusOr<Layout> LayoutOf(const TrainerLayout& layout, const Weight& weight) {
  ASSIGN_OR_RETURN(std::vector<Layout> layouts, trainer_layouts(layout, Model{"m", {weight}}));
  return layouts.at(0);
}

// [begin, end) per dimension of rank `rank`'s box.
std::vector<std::pair<std::int64_t, std::int64_t>> BoxOf(const Weight& weight, const Layout& layout, int rank) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  auto box = layout_box(weight.spec, layout, rank);
  EXPECT_TRUE(box.ok()) << box.status().ToString();
  if (!box.ok()) return out;
  for (std::size_t d = 0; d < box->begin.size(); ++d) out.emplace_back(box->begin[d], box->end[d]);
  return out;
}

using R = std::vector<std::pair<std::int64_t, std::int64_t>>;

// Catches: "tp:X,fsdp:Y" read in one order only, "fsdp:4" not equal to
// "fsdp" over 4 ranks, or ToString printing the unresolved "fsdp" (or tp and
// fsdp swapped), so that a layout does not read back as itself.
TEST(TrainerLayout, ParsesEveryDocumentedFormAndPrintsItBack) {
  struct Case {
    std::string text;
    int ranks;
    TrainerLayout want;
    std::string printed;
  };
  const Case cases[] = {
      {"full", 4, TrainerLayout{}, "full"},
      {"fsdp", 4, Sharded(1, 4), "fsdp:4"},
      {"tp", 8, Sharded(8, 1), "tp:8"},
      {"tp:2,fsdp:4", 8, Sharded(2, 4), "tp:2,fsdp:4"},
      {"fsdp:4,tp:2", 8, Sharded(2, 4), "tp:2,fsdp:4"},
      {"fsdp:4", 4, Sharded(1, 4), "fsdp:4"},
      {"tp:3", 3, Sharded(3, 1), "tp:3"},
      {"tp:1,fsdp:4", 4, Sharded(1, 4), "fsdp:4"},
      {"fsdp", 1, Sharded(1, 1), "fsdp:1"},
  };
  for (const Case& c : cases) {
    ASSERT_OK_AND_ASSIGN(const TrainerLayout got, parse_trainer_layout(c.text, c.ranks));
    EXPECT_EQ(got, c.want) << c.text;
    EXPECT_EQ(got.ToString(), c.printed) << c.text;
    ASSERT_OK_AND_ASSIGN(const TrainerLayout again, parse_trainer_layout(got.ToString(), c.ranks));
    EXPECT_EQ(again, got) << c.text;
  }
}

// Catches: a product of degrees other than the trainer ranks accepted (the
// layouts would span ranks that do not exist, or leave ranks idle), a zero
// or malformed degree read as something, a part given twice, or an error
// that does not quote the text and say what is accepted.
TEST(TrainerLayout, RefusesBadTextQuotingItAndSayingWhatIsAccepted) {
  const Status product = parse_trainer_layout("tp:2,fsdp:3", 4).status();
  EXPECT_EQ(product.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(product.message(), "\"tp:2,fsdp:3\": tp 2 x fsdp 3 = 6 ranks, but there are 4 trainer ranks");
  EXPECT_HAS(parse_trainer_layout("tp:2", 4).status().message(), "tp 2 x fsdp 1 = 2 ranks");
  const std::pair<std::string, std::string> bad[] = {
      {"", "is not \"tp:X\" or \"fsdp:Y\""},
      {"FSDP", "\"FSDP\" is not"},
      {"dp:2", "\"dp:2\" is not"},
      {"tp,fsdp", "\"tp\" is not"},
      {"tp:0,fsdp:4", "the degree in \"tp:0\" is not a whole number >= 1"},
      {"tp:2x,fsdp:2", "\"tp:2x\""},
      {"tp:+2,fsdp:2", "\"tp:+2\""},
      {"tp:2,tp:2", "names tp twice"},
      {"tp:2,fsdp:2,", "more than two parts"},
  };
  for (const auto& [text, why] : bad) {
    const Status s = parse_trainer_layout(text, 4).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_HAS(s.message(), "trainer layout \"" + text + "\"");
    EXPECT_HAS(s.message(), why);
    EXPECT_HAS(s.message(), "accepted: \"full\", \"fsdp\", \"tp\", or \"tp:X,fsdp:Y\"");
  }
  EXPECT_HAS(parse_trainer_layout("full", 0).status().message(), "needs at least 1 trainer rank, got 0");
}

// Catches: the TP x FSDP product in kOuterSlowest order (rank 1 would be
// FSDP index 1 of TP shard 0, not TP shard 1 of FSDP index 0), or the levels
// swapped (FSDP chunking the full tensor, TP splitting the chunk).
TEST(TrainerLayout, TpRanksAreConsecutive) {
  const Weight column = W("q", {8, 4}, ShardRule::kColumn);
  ASSERT_OK_AND_ASSIGN(const Layout layout, LayoutOf(Sharded(2, 2), column));
  EXPECT_EQ(layout, (Layout{{LayoutLevel::even(0, 2), LayoutLevel::chunk(0, 2)}, RankOrder::kOuterFastest}));
  // TP shard t holds rows [4t, 4t + 4); FSDP index f its rows [2f, 2f + 2).
  EXPECT_EQ(BoxOf(column, layout, 0), (R{{0, 2}, {0, 4}}));
  EXPECT_EQ(BoxOf(column, layout, 1), (R{{4, 6}, {0, 4}}));  // TP shard 1 of FSDP index 0
  EXPECT_EQ(BoxOf(column, layout, 2), (R{{2, 4}, {0, 4}}));
  EXPECT_EQ(BoxOf(column, layout, 3), (R{{6, 8}, {0, 4}}));
  // A row weight: TP splits dim 1, FSDP chunks dim 0 of the TP shard.
  const Weight row = W("o", {4, 8}, ShardRule::kRow);
  ASSERT_OK_AND_ASSIGN(const Layout row_layout, LayoutOf(Sharded(2, 2), row));
  EXPECT_EQ(BoxOf(row, row_layout, 1), (R{{0, 2}, {4, 8}}));
  EXPECT_EQ(BoxOf(row, row_layout, 2), (R{{2, 4}, {0, 4}}));
}

// Catches: a row weight split on dim 0, a norm chunked under tp (its rule
// is kReplicated) or left whole under fsdp (FSDP2 chunks it), a scalar given
// a split level, a level of degree 1 kept, or "full" given any level.
TEST(TrainerLayout, LevelsFollowTheShardRule) {
  const Weight column = W("gate", {6, 4}, ShardRule::kColumn);
  const Weight row = W("down", {4, 6}, ShardRule::kRow);
  const Weight vocab = W("embed", {10, 4}, ShardRule::kVocab);
  const Weight norm = W("norm", {5}, ShardRule::kReplicated);
  const Weight scalar = W("scale", {}, ShardRule::kReplicated);
  const auto one = [](LayoutLevel level) { return Layout::of(level); };
  const auto expect = [](const TrainerLayout& t, const Weight& w, const Layout& want) {
    auto got = LayoutOf(t, w);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, want) << t.ToString() << " " << w.spec.ToString() << ": got " << got->ToString();
    EXPECT_EQ(got->ranks(), t.tp * t.fsdp);
  };
  expect(Sharded(2, 1), column, one(LayoutLevel::even(0, 2)));
  expect(Sharded(2, 1), row, one(LayoutLevel::even(1, 2)));
  expect(Sharded(2, 1), vocab, one(LayoutLevel::even(0, 2)));
  expect(Sharded(2, 1), norm, one(LayoutLevel::replicate(2)));
  expect(Sharded(2, 1), scalar, one(LayoutLevel::replicate(2)));
  expect(Sharded(1, 3), row, one(LayoutLevel::chunk(0, 3)));
  expect(Sharded(1, 3), norm, one(LayoutLevel::chunk(0, 3)));
  expect(Sharded(1, 3), scalar, one(LayoutLevel::replicate(3)));
  expect(Sharded(2, 3), norm, Layout{{LayoutLevel::replicate(2), LayoutLevel::chunk(0, 3)}, RankOrder::kOuterFastest});
  expect(Sharded(2, 3), scalar, one(LayoutLevel::replicate(6)));
  for (const Weight& w : {column, row, vocab, norm, scalar}) {
    expect(TrainerLayout{}, w, Layout{});
    expect(Sharded(1, 1), w, Layout{});
  }
}

// Catches: an uneven TP split accepted (tensor_split instead of Megatron's
// even split: engines and trainer would disagree on the shards), a split
// along a dimension the tensor lacks, or an error that does not name the
// tensor, the extent and the degree.
TEST(TrainerLayout, TpRefusesAnExtentThatIsNotAMultipleOfTheDegree) {
  const Model model{"m", {W("ok", {8, 8}, ShardRule::kColumn), W("layers.0.down", {8, 6}, ShardRule::kRow)}};
  const Status s = trainer_layouts(Sharded(4, 2), model).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "trainer layout tp:4,fsdp:2: tensor 'layers.0.down bfloat16[8, 6]'");
  EXPECT_HAS(s.message(), "row-parallel, split along dim 1");
  EXPECT_HAS(s.message(), "extent 6 is not a multiple of the tp degree 4");
  EXPECT_OK(trainer_layouts(Sharded(1, 8), model).status());  // FSDP's chunks may be uneven
  const Status missing = LayoutOf(Sharded(2, 1), W("bias", {4}, ShardRule::kRow)).status();
  EXPECT_HAS(missing.message(), "tensor 'bias bfloat16[4]' (row-parallel, split along dim 1) has no dimension 1");
  const Status inconsistent = trainer_layouts(TrainerLayout{.tp = 2, .fsdp = 1, .full = true}, model).status();
  EXPECT_HAS(inconsistent.message(), "is not a layout");
}

// Catches: a layout whose ranks() is not tp * fsdp (the transfer plan
// refuses it), or boxes that overlap or leave elements out: on random small
// weights every element must be held by tp ranks for a replicated weight, by
// every rank for a scalar, and by exactly one rank otherwise; a refusal only
// where a tp split is uneven or lacks its dimension.
TEST(TrainerLayout, RandomWeightsAreCoveredOncePerReplica) {
  std::mt19937 rng(2019);
  const ShardRule rules[] = {ShardRule::kReplicated, ShardRule::kColumn, ShardRule::kRow, ShardRule::kVocab};
  for (int iter = 0; iter < 400; ++iter) {
    const Weight w{testing::random_spec(rng, "w"), rules[testing::uniform(rng, 0, 3)]};
    const TrainerLayout t = Sharded(testing::uniform(rng, 1, 3), testing::uniform(rng, 1, 3));
    const auto got = LayoutOf(t, w);
    const std::size_t dim = w.rule == ShardRule::kRow ? 1 : 0;
    const std::size_t ndim = w.spec.shape.size();
    const bool splits = t.tp > 1 && ndim > 0 && w.rule != ShardRule::kReplicated;
    const bool refused = splits && (dim >= ndim || w.spec.shape[dim] % t.tp != 0);
    ASSERT_EQ(got.ok(), !refused) << t.ToString() << " " << w.spec.ToString() << ": " << got.status().ToString();
    if (refused) continue;
    ASSERT_EQ(got->ranks(), t.tp * t.fsdp) << got->ToString();
    ASSERT_OK(validate_layout(w.spec, *got));
    const int replicas = ndim == 0 ? t.tp * t.fsdp : splits ? 1 : t.tp;
    for (std::uint64_t e = 0; e < static_cast<std::uint64_t>(w.spec.numel()); ++e) {
      int holders = 0;
      for (int r = 0; r < got->ranks(); ++r) {
        ASSERT_OK_AND_ASSIGN(const Box box, layout_box(w.spec, *got, r));
        holders += testing::box_holds(w.spec, box, e) ? 1 : 0;
      }
      ASSERT_EQ(holders, replicas) << w.spec.ToString() << " element " << e << " layout " << got->ToString();
    }
  }
}

// Catches: a preset weight the layouts refuse or spread over a rank count
// other than M (every layout of a model must span the same trainer ranks).
TEST(TrainerLayout, PresetLayoutsSpanTheTrainerRanks) {
  for (const std::string preset : {"tiny", "tiny-moe"}) {
    ASSERT_OK_AND_ASSIGN(const Model model, make_model(preset, 1));
    for (const auto& [text, ranks] : {std::pair<std::string, int>{"fsdp", 8}, {"tp", 4}, {"tp:2,fsdp:4", 8}}) {
      ASSERT_OK_AND_ASSIGN(const TrainerLayout t, parse_trainer_layout(text, ranks));
      ASSERT_OK_AND_ASSIGN(const std::vector<Layout> layouts, trainer_layouts(t, model));
      ASSERT_EQ(layouts.size(), model.weights.size());
      for (std::size_t i = 0; i < layouts.size(); ++i) {
        EXPECT_EQ(layouts[i].ranks(), ranks) << preset << " " << text << " " << model.weights[i].spec.ToString();
        EXPECT_OK(validate_layout(model.weights[i].spec, layouts[i]));
      }
    }
  }
}

}  // namespace
}  // namespace refit
