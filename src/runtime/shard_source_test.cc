// make_synthetic_shard_source (weight_source.h), host memory: every local
// shard byte against the full synthetic tensor's byte at the same position.
#include "refit/weight_source.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "refit/trainer_layout.h"
#include "testing/expect_has.h"
#include "testing/random_layout.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

constexpr std::uint64_t kSeed = 1919;

// Checks every element of `shard`'s local shards (rank `rank` of `layouts`)
// against the element of `full` at the same position. The position is worked
// out element by element from layout_box: an odometer over the box's index,
// ravelled in the full shape, independent of how the source cut its pieces.
void ExpectShardsHoldFullBytes(const WeightSource& shard, const WeightSource& full,
                               const std::vector<Layout>& layouts, int rank, const std::string& context) {
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    const TensorSpec& spec = full.model().weights[i].spec;
    ASSERT_OK_AND_ASSIGN(const Box box, layout_box(spec, layouts[i], rank));
    const std::size_t elem = dtype_size(spec.dtype);
    const std::size_t nd = spec.shape.size();
    std::vector<std::int64_t> index = box.begin;
    for (std::int64_t e = 0; e < box.numel(); ++e) {
      std::uint64_t flat = 0;
      for (std::size_t d = 0; d < nd; ++d) {
        flat = flat * static_cast<std::uint64_t>(spec.shape[d]) + static_cast<std::uint64_t>(index[d]);
      }
      if (std::memcmp(shard.data(i) + e * elem, full.data(i) + flat * elem, elem) != 0) {
        ADD_FAILURE() << context << ": rank " << rank << " of " << layouts[i].ToString() << ", tensor "
                      << spec.ToString() << ": local element " << e << " differs from full element " << flat;
        return;
      }
      for (std::size_t d = nd; d-- > 0;) {  // last dim fastest, wrapping back to the box's begin
        if (++index[d] < box.end[d]) break;
        index[d] = box.begin[d];
      }
    }
  }
}

// Makes every rank's shard source of `layouts` and checks each against the
// full synthetic source at two versions, prepared on the same objects.
void ExpectEveryRankHoldsFullBytes(const std::string& preset, int layers, const std::vector<Layout>& layouts,
                                   const std::string& context) {
  ASSERT_OK_AND_ASSIGN(auto full, make_synthetic_source(preset, layers, MemoryKind::kHost, -1));
  std::vector<std::unique_ptr<WeightSource>> shards;
  for (int r = 0; r < layouts.at(0).ranks(); ++r) {
    ASSERT_OK_AND_ASSIGN(auto shard, make_synthetic_shard_source(preset, layers, layouts, r, MemoryKind::kHost, -1));
    shards.push_back(std::move(shard));
  }
  for (const std::uint64_t version : {1, 2}) {
    ASSERT_OK(full->prepare(version, kSeed));
    for (int r = 0; r < static_cast<int>(shards.size()); ++r) {
      ASSERT_OK(shards[static_cast<std::size_t>(r)]->prepare(version, kSeed));
      ExpectShardsHoldFullBytes(*shards[static_cast<std::size_t>(r)], *full, layouts, r,
                                context + ", version " + std::to_string(version));
    }
  }
}

// Catches: a piece filled with the content at its local offset instead of
// its full-tensor offset (every rank but the first, every row after the
// first, would hold the wrong bytes), pieces cut along the wrong stride or
// carried wrongly across dimensions, a piece filled under the shard's own
// key, or prepare() leaving the previous version in place.
TEST(ShardSource, RandomLayoutsHoldTheFullTensorsBytes) {
  std::mt19937 rng(19);
  ASSERT_OK_AND_ASSIGN(const Model model, make_model("tiny", 1));
  for (int iter = 0; iter < 4; ++iter) {
    const int ranks = testing::uniform(rng, 1, 4);
    std::vector<Layout> layouts;
    std::string described;
    for (const Weight& w : model.weights) {
      layouts.push_back(testing::random_layout(w.spec, ranks, rng));
      described += "\n  " + w.spec.name + ": " + layouts.back().ToString();
    }
    SCOPED_TRACE("the layouts:" + described);
    ExpectEveryRankHoldsFullBytes("tiny", 1, layouts, "random layouts over " + std::to_string(ranks) + " ranks");
  }
}

// Catches: the same mistakes on the layouts real trainers use: FSDP dim-0
// chunks (one contiguous piece each), Megatron row splits (one piece per
// row), and the TP x FSDP product whose ranks run TP fastest.
TEST(ShardSource, TinyFsdpAndTpShardsHoldTheFullTensorsBytes) {
  ASSERT_OK_AND_ASSIGN(const Model model, make_model("tiny", 1));
  for (const auto& [text, ranks] : {std::pair<std::string, int>{"fsdp", 4}, {"tp", 2}, {"tp:2,fsdp:2", 4}}) {
    ASSERT_OK_AND_ASSIGN(const TrainerLayout t, parse_trainer_layout(text, ranks));
    ASSERT_OK_AND_ASSIGN(const std::vector<Layout> layouts, trainer_layouts(t, model));
    ExpectEveryRankHoldsFullBytes("tiny", 1, layouts, "trainer layout " + t.ToString());
  }
}

// Catches: model() answering the local specs (a trainer would plan the full
// tensors' bytes out of a shard), trainer_layouts() empty (it would read
// data(i) as the full tensor), or a shard outside the stable host range a
// trainer registers.
TEST(ShardSource, ReportsTheFullModelItsLayoutsAndItsArena) {
  ASSERT_OK_AND_ASSIGN(const Model model, make_model("tiny", 1));
  ASSERT_OK_AND_ASSIGN(const TrainerLayout t, parse_trainer_layout("tp:2,fsdp:2", 4));
  ASSERT_OK_AND_ASSIGN(const std::vector<Layout> layouts, trainer_layouts(t, model));
  ASSERT_OK_AND_ASSIGN(auto source, make_synthetic_shard_source("tiny", 1, layouts, 3, MemoryKind::kHost, -1));
  EXPECT_EQ(source->memory(), MemoryKind::kHost);
  EXPECT_EQ(source->device(), -1);
  EXPECT_EQ(source->trainer_layouts(), layouts);
  ASSERT_EQ(source->model().weights.size(), model.weights.size());
  const auto ranges = source->stable_host_ranges();
  ASSERT_EQ(ranges.size(), 1u);
  const std::byte* next = ranges[0].first;  // shards lie in model order, none overlapping the one before
  for (std::size_t i = 0; i < model.weights.size(); ++i) {
    EXPECT_EQ(source->model().weights[i].spec, model.weights[i].spec);
    ASSERT_OK_AND_ASSIGN(const TensorSpec local, local_spec(model.weights[i].spec, layouts[i], 3));
    EXPECT_GE(source->data(i), next) << local.ToString();
    next = source->data(i) + local.nbytes();
    EXPECT_LE(next, ranges[0].first + ranges[0].second) << local.ToString();
  }
}

// Catches: a source made from layouts that do not describe this model's
// trainer (too few or too many, one the tensor does not fit, two rank
// counts, a rank outside them) instead of refused with the tensor named.
TEST(ShardSource, RefusesLayoutsThatDoNotFitNamingTheTensor) {
  ASSERT_OK_AND_ASSIGN(const Model model, make_model("tiny", 1));
  const std::vector<Layout> good(model.weights.size(), Layout::of(LayoutLevel::chunk(0, 2)));
  const auto refusal = [](std::vector<Layout> layouts, int rank) {
    return make_synthetic_shard_source("tiny", 1, std::move(layouts), rank, MemoryKind::kHost, -1).status();
  };
  const std::string n = std::to_string(model.weights.size());
  std::vector<Layout> fewer(good.begin(), good.end() - 1);
  EXPECT_HAS(refusal(fewer, 0).message(), std::to_string(model.weights.size() - 1) + " trainer layouts for " + n +
                                              " weights; tensor 'lm_head.weight' has none");
  std::vector<Layout> more = good;
  more.push_back(good[0]);
  EXPECT_HAS(refusal(more, 0).message(), std::to_string(model.weights.size() + 1) + " trainer layouts for " + n);
  std::vector<Layout> unfit = good;
  unfit[1] = Layout::of(LayoutLevel::chunk(1, 2));
  const Status s = refusal(unfit, 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "synthetic shard source (preset \"tiny\")");
  EXPECT_HAS(s.message(), "'model.layers.0.input_layernorm.weight float32[512]'");
  EXPECT_HAS(s.message(), "has no dimension 1");
  std::vector<Layout> mixed = good;
  mixed[2] = Layout::of(LayoutLevel::chunk(0, 4));
  EXPECT_HAS(refusal(mixed, 0).message(), "tensor 'model.layers.0.self_attn.q_proj.weight' is laid out as "
                                          "chunk(dim 0, 4 ranks) over 4 trainer ranks, but tensor "
                                          "'model.embed_tokens.weight' over 2");
  for (const int rank : {-1, 2}) {
    EXPECT_HAS(refusal(good, rank).message(), "trainer rank " + std::to_string(rank) +
                                                  " is outside the layouts' 2 ranks (0..1; tensor "
                                                  "'model.embed_tokens.weight'");
  }
  EXPECT_OK(refusal(good, 1));
}

}  // namespace
}  // namespace refit
