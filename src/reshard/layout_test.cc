#include "refit/layout.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "refit/model.h"
#include "testing/expect_has.h"
#include "testing/random_layout.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

TensorSpec Spec(std::vector<std::int64_t> shape, DType dtype = DType::kUInt8) {
  return TensorSpec{"layer.w", dtype, std::move(shape)};
}

// [begin, end) along `dim` of every rank's box.
std::vector<std::pair<std::int64_t, std::int64_t>> Ranges(const TensorSpec& spec, const Layout& layout, int dim) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (int r = 0; r < layout.ranks(); ++r) {
    auto box = layout_box(spec, layout, r);
    EXPECT_TRUE(box.ok()) << box.status().ToString();
    if (!box.ok()) return out;
    out.emplace_back(box->begin[static_cast<std::size_t>(dim)], box->end[static_cast<std::size_t>(dim)]);
  }
  return out;
}

using R = std::vector<std::pair<std::int64_t, std::int64_t>>;

// Catches: kChunk computed like tensor_split (the remainder spread over the
// first ranks) instead of torch.chunk's ceil(D/N) pieces with an empty tail.
TEST(Layout, ChunkMatchesTorchChunk) {
  EXPECT_EQ(Ranges(Spec({5, 3}), Layout::of(LayoutLevel::chunk(0, 4)), 0), (R{{0, 2}, {2, 4}, {4, 5}, {5, 5}}));
  EXPECT_EQ(Ranges(Spec({3, 10}), Layout::of(LayoutLevel::chunk(1, 4)), 1), (R{{0, 3}, {3, 6}, {6, 9}, {9, 10}}));
  EXPECT_EQ(Ranges(Spec({2}), Layout::of(LayoutLevel::chunk(0, 3)), 0), (R{{0, 1}, {1, 2}, {2, 2}}));
  EXPECT_EQ(Ranges(Spec({0}), Layout::of(LayoutLevel::chunk(0, 2)), 0), (R{{0, 0}, {0, 0}}));
}

// Catches: kTensorSplit giving the remainder to the last ranks, or
// layout_from_shard_rule mapping kRow to dim 0: boxes must equal the engine's
// shard_slice (model.h) for every rule, shape and rank count.
// The same for engine_layout of expert tensors (--engine-experts ep): a
// per-expert tensor whole on its owner and empty elsewhere, a stacked one in
// whole experts. Catches: engine_layout's owner differing from shard_slice's
// (tried: owner expert % ranks, round-robin: the boxes differ).
TEST(Layout, ShardRuleLayoutsMatchEngineShardSlices) {
  std::mt19937 rng(19);
  const ShardRule rules[] = {ShardRule::kReplicated, ShardRule::kColumn, ShardRule::kRow, ShardRule::kVocab,
                             ShardRule::kExpert};
  for (int iter = 0; iter < 500; ++iter) {
    Weight w{TensorSpec{"w", DType::kBFloat16, {testing::uniform(rng, 0, 20), testing::uniform(rng, 0, 20)}},
             rules[testing::uniform(rng, 0, 4)]};
    const int ranks = testing::uniform(rng, 1, 8);
    if (w.rule == ShardRule::kExpert) {
      w.experts = testing::uniform(rng, ranks, 12);
      w.expert = testing::uniform(rng, -1, w.experts - 1);  // -1: stacked
      if (w.expert < 0) w.spec.shape[0] = w.experts;
    }
    const Layout layout = engine_layout(w, ranks);
    for (int r = 0; r < ranks; ++r) {
      ASSERT_OK_AND_ASSIGN(const Box box, layout_box(w.spec, layout, r));
      const ShardSlice s = shard_slice(w, r, ranks);
      for (int d = 0; d < 2; ++d) {
        const bool split = d == s.dim;
        EXPECT_EQ(box.begin[static_cast<std::size_t>(d)], split ? s.begin : 0) << w.spec.ToString() << " rank " << r;
        EXPECT_EQ(box.end[static_cast<std::size_t>(d)], split ? s.end : w.spec.shape[static_cast<std::size_t>(d)]);
      }
      ASSERT_OK_AND_ASSIGN(const TensorSpec local, local_spec(w.spec, layout, r));
      EXPECT_EQ(local, shard_spec(w, r, ranks));
    }
  }
}

// Catches: kEven accepting an extent that is not a multiple of its ranks
// (silently splitting unevenly), or an error that does not name the tensor,
// the rank and the rule.
TEST(Layout, EvenSplitRejectsARemainder) {
  EXPECT_EQ(Ranges(Spec({6, 4}), Layout::of(LayoutLevel::even(1, 2)), 1), (R{{0, 2}, {2, 4}}));
  const Status s = validate_layout(Spec({6, 5}), Layout::of(LayoutLevel::even(1, 2)));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "layer.w uint8[6, 5]");
  EXPECT_HAS(s.message(), "rank 0");
  EXPECT_HAS(s.message(), "even(dim 1, 2 ranks)");
  EXPECT_HAS(s.message(), "(5) to be a multiple of 2");
  // An inner even level is checked against the box the outer level leaves.
  const Layout nested{{LayoutLevel::tensor_split(0, 2), LayoutLevel::even(0, 2)}, RankOrder::kOuterSlowest};
  const Status inner = validate_layout(Spec({6, 5}), nested);
  EXPECT_HAS(inner.message(), "level 1 even(dim 0, 2 ranks)");
  EXPECT_HAS(inner.message(), "(3) to be a multiple of 2");
}

// Catches: experts split by chunk sizes, along a dim other than 0, or
// accepted with fewer experts than ranks or on a 1-D tensor.
TEST(Layout, ExpertsAreWholeAndContiguous) {
  const Layout ep = Layout::of(LayoutLevel::experts(4));
  EXPECT_EQ(Ranges(Spec({10, 4, 3}), ep, 0), (R{{0, 3}, {3, 6}, {6, 8}, {8, 10}}));
  EXPECT_EQ(Ranges(Spec({10, 4, 3}), ep, 2), (R{{0, 3}, {0, 3}, {0, 3}, {0, 3}}));
  const Status few = validate_layout(Spec({3, 4, 3}), ep);
  EXPECT_HAS(few.message(), "3 experts over 4 ranks");
  EXPECT_HAS(few.message(), "experts(4 ranks)");
  EXPECT_HAS(validate_layout(Spec({8}), ep).message(), "at least 2 dimensions");
  EXPECT_HAS(validate_layout(Spec({8, 8}), Layout::of(LayoutLevel{LevelKind::kExperts, 1, 2})).message(),
             "splits dim 0");
}

// Catches: the rank order reversed (level 0 as the fastest digit under
// kOuterSlowest or the other way round), or inner levels splitting the full
// tensor instead of the outer level's box.
TEST(Layout, ProductOfLevelsAndRankOrder) {
  const TensorSpec spec = Spec({8, 2});
  Layout tp_fsdp{{LayoutLevel::even(0, 2), LayoutLevel::chunk(0, 2)}, RankOrder::kOuterSlowest};
  EXPECT_EQ(tp_fsdp.ranks(), 4);
  EXPECT_EQ(Ranges(spec, tp_fsdp, 0), (R{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  tp_fsdp.order = RankOrder::kOuterFastest;
  EXPECT_EQ(Ranges(spec, tp_fsdp, 0), (R{{0, 2}, {4, 6}, {2, 4}, {6, 8}}));
  EXPECT_EQ(level_indices(tp_fsdp, 1), (std::vector<int>{1, 0}));
  // TP on dim 1 x a replica level: ranks 0,1 hold the same box.
  const Layout tp_dp{{LayoutLevel::tensor_split(1, 2), LayoutLevel::replicate(2)}, RankOrder::kOuterSlowest};
  EXPECT_EQ(Ranges(spec, tp_dp, 1), (R{{0, 1}, {0, 1}, {1, 2}, {1, 2}}));
  EXPECT_EQ(tp_dp.ToString(), "tensor_split(dim 1, 2 ranks) x replicate(2 ranks)");
}

// Catches: kOwner giving the box to a rank other than its owner, or leaving
// the others a part of it (their box must be empty: 0 rows of dim 0).
TEST(Layout, OwnerHoldsTheWholeBoxAndTheOthersNothing) {
  const Layout layout = Layout::of(LayoutLevel::owned_by(2, 4));
  for (int r = 0; r < 4; ++r) {
    ASSERT_OK_AND_ASSIGN(const Box box, layout_box(Spec({6, 3}), layout, r));
    EXPECT_EQ(box.numel(), r == 2 ? 18 : 0) << "rank " << r;
    if (r == 2) {
      EXPECT_EQ(box, (Box{{0, 0}, {6, 3}}));
    }
  }
  // Under a TP level: the owner index is the inner level's.
  const Layout tp_owner{{LayoutLevel::tensor_split(1, 3), LayoutLevel::owned_by(1, 2)}, RankOrder::kOuterSlowest};
  ASSERT_OK_AND_ASSIGN(const Box box, layout_box(Spec({6, 3}), tp_owner, 3));  // TP index 1, owner index 1
  EXPECT_EQ(box, (Box{{0, 1}, {6, 2}}));
  EXPECT_EQ(layout.ToString(), "owner(rank 2 of 4 ranks)");
  EXPECT_HAS(validate_layout(Spec({}), layout).message(), "one owner among 4 ranks");
  EXPECT_HAS(validate_layout(Spec({4}), Layout::of(LayoutLevel::owned_by(4, 4))).message(), "owner(rank 4 of 4");
}

// Catches: overlapping or missing pieces in any split flavour or product: each
// element of a random tensor must be held by exactly as many ranks as the
// replicate levels multiply to (brute force over every element).
TEST(Layout, RandomLayoutsCoverEveryElementOncePerReplica) {
  std::mt19937 rng(1919);
  for (int iter = 0; iter < 400; ++iter) {
    const TensorSpec spec = testing::random_spec(rng, "t");
    const Layout layout = testing::random_layout(spec, testing::uniform(rng, 1, 8), rng);
    int replicas = 1;
    for (const LayoutLevel& level : layout.levels) replicas *= level.kind == LevelKind::kReplicate ? level.ranks : 1;
    std::vector<Box> boxes;
    for (int r = 0; r < layout.ranks(); ++r) {
      ASSERT_OK_AND_ASSIGN(Box box, layout_box(spec, layout, r));
      boxes.push_back(std::move(box));
    }
    for (std::uint64_t e = 0; e < static_cast<std::uint64_t>(spec.numel()); ++e) {
      int holders = 0;
      for (const Box& box : boxes) holders += testing::box_holds(spec, box, e) ? 1 : 0;
      ASSERT_EQ(holders, replicas) << spec.ToString() << " element " << e << " layout " << layout.ToString();
    }
  }
}

// Catches: a bad layout accepted or reported without the tensor, rank or
// level: a missing dimension, a rank out of range, a level of 0 ranks.
TEST(Layout, ErrorsNameTensorRankAndLevel) {
  const Status dim = validate_layout(Spec({4, 4}), Layout::of(LayoutLevel::chunk(2, 2)));
  EXPECT_EQ(dim.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(dim.message(), "'layer.w uint8[4, 4]'");
  EXPECT_HAS(dim.message(), "has no dimension 2");
  EXPECT_HAS(dim.message(), "chunk(dim 2, 2 ranks)");
  const auto rank = layout_box(Spec({4}), Layout::of(LayoutLevel::chunk(0, 2)), 2);
  EXPECT_HAS(rank.status().message(), "rank 2 is outside layout chunk(dim 0, 2 ranks) (ranks 0..1)");
  EXPECT_HAS(validate_layout(Spec({4}), Layout::of(LayoutLevel::chunk(0, 0))).message(), "has 0 ranks");
  EXPECT_HAS(validate_layout(Spec({}), Layout::of(LayoutLevel::tensor_split(0, 2))).message(), "has no dimension 0");
  EXPECT_OK(validate_layout(Spec({}), Layout::of(LayoutLevel::replicate(3))));
  EXPECT_OK(validate_layout(Spec({}), Layout{}));
}


// A block table (FP8 scales of a sharded weight): every rank holds exactly
// the entries of the blocks whose first element its box of the weight
// holds, so over a split every entry is held once (FSDP cuts of 1408 rows
// in 3 ranks: 470 rows each, cutting blocks 3 and 7). Random layouts of
// random shapes, stacked experts included. Catches: the box rounded down
// instead of up (the entry of a block cut by two ranks held by the rank
// that does not hold its first element), or the levels applied to the
// table's shape instead of the weight's (tried once: rounding down failed
// it).
TEST(Layout, BlockTableEntriesGoWithTheirBlocksFirstElement) {
  const Layout fsdp = Layout::of(LayoutLevel::chunk(0, 3));
  Layout scales = fsdp;
  scales.blocks = BlockTable{{1408, 2048}, 128};
  EXPECT_EQ(Ranges(Spec({11, 16}), scales, 0), (R{{0, 4}, {4, 8}, {8, 11}}));  // rows [0,470) [470,940) [940,1408)
  EXPECT_EQ(scales.ToString(), "chunk(dim 0, 3 ranks), per 128-block of [1408, 2048]");
  std::mt19937 rng(20);
  for (int iter = 0; iter < 300; ++iter) {
    const bool stacked = testing::uniform(rng, 0, 1) == 1;
    std::vector<std::int64_t> shape = {testing::uniform(rng, 0, 300), testing::uniform(rng, 1, 300)};
    if (stacked) shape.insert(shape.begin(), testing::uniform(rng, 1, 4));
    const TensorSpec weight = Spec(shape);
    const std::int64_t block = testing::uniform(rng, 1, 200);
    Layout layout = testing::random_layout(weight, testing::uniform(rng, 1, 6), rng);
    Layout table = layout;
    table.blocks = BlockTable{shape, block};
    TensorSpec scale_spec = weight;
    const std::size_t n = shape.size();
    scale_spec.shape[n - 2] = (shape[n - 2] + block - 1) / block;
    scale_spec.shape[n - 1] = (shape[n - 1] + block - 1) / block;
    for (int r = 0; r < layout.ranks(); ++r) {
      auto box = layout_box(weight, layout, r);
      auto entries = layout_box(scale_spec, table, r);
      ASSERT_TRUE(box.ok() && entries.ok()) << entries.status().ToString();
      // Every entry: held here iff its block's first element is in the box.
      for (std::size_t d = 0; d < n; ++d) {
        const std::int64_t unit = d + 2 >= n ? block : 1;
        for (std::int64_t i = 0; i < scale_spec.shape[d]; ++i) {
          const bool first_here = box->begin[d] <= i * unit && i * unit < box->end[d];
          const bool held = entries->begin[d] <= i && i < entries->end[d];
          ASSERT_EQ(held, first_here) << table.ToString() << " rank " << r << " dim " << d << " entry " << i;
        }
      }
    }
  }
}

// A block table that does not fit the tensor is refused, naming both.
// Catches: a table whose shape is not the blocked shape rounded up accepted.
TEST(Layout, ABlockTableOfAnotherShapeIsRefused) {
  Layout table = Layout::of(LayoutLevel::chunk(0, 2));
  table.blocks = BlockTable{{1408, 2048}, 128};
  EXPECT_HAS(layout_box(Spec({12, 16}), table, 0).status().message(),
             "layout chunk(dim 0, 2 ranks), per 128-block of [1408, 2048] is not a block table of that shape");
  table.blocks->shape = {1408};
  EXPECT_FALSE(layout_box(Spec({11}), table, 0).ok());
}

}  // namespace
}  // namespace refit
