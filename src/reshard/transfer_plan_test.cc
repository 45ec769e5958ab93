#include "refit/transfer_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "refit/model.h"
#include "refit/plan.h"
#include "testing/expect_has.h"
#include "testing/random_layout.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

TensorSpec U8(std::string name, std::vector<std::int64_t> shape) {
  return TensorSpec{std::move(name), DType::kUInt8, std::move(shape)};
}

TransferPlan MustPlan(std::vector<TensorLayouts> tensors, int m, int n, TransferPlanOptions options = {}) {
  auto plan = make_transfer_plan(std::move(tensors), m, n, options);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  return plan.ok() ? std::move(plan).value() : TransferPlan{};
}

Box MustBox(const TensorSpec& spec, const Layout& layout, int rank) {
  auto box = layout_box(spec, layout, rank);
  EXPECT_TRUE(box.ok()) << box.status().ToString();
  return box.ok() ? *box : Box{};
}

using Runs = std::vector<TransferRun>;

// Every run's contiguous pieces, in order.
Runs Pieces(const Runs& runs) {
  Runs out;
  for (const TransferRun& run : runs) {
    const Runs pieces = contiguous_pieces(run);
    out.insert(out.end(), pieces.begin(), pieces.end());
  }
  return out;
}

// A contiguous run.
TransferRun C(std::uint32_t tensor, std::uint64_t src, std::uint64_t dst, std::uint64_t bytes) {
  return TransferRun{tensor, src, dst, bytes, 1, 0, 0, tensor};
}

// Checks, byte by byte, that every byte of every engine rank's shards arrives
// exactly once, from a trainer rank whose shard holds that same byte of the
// full tensor; that runs stay inside both shards, are in order and maximal;
// and that the pair streams cover the same runs.
void ExpectExactlyOnce(const TransferPlan& plan) {
  const int m = plan.trainer_ranks;
  const int n = plan.engine_ranks;
  std::uint64_t total = 0;
  for (int e = 0; e < n; ++e) {
    for (std::uint32_t i = 0; i < plan.engine_tensors.size(); ++i) {
      const TensorLayouts tl{plan.engine_tensors[i].spec, plan.trainer_tensors[i].layout,
                             plan.engine_tensors[i].layout};
      ASSERT_EQ(plan.trainer_tensors[i].spec, tl.spec);
      const std::uint64_t elem = dtype_size(tl.spec.dtype);
      const Box dst = MustBox(tl.spec, tl.engine, e);
      std::vector<int> count(static_cast<std::size_t>(dst.numel()) * elem, 0);
      for (int t = 0; t < m; ++t) {
        const Box src = MustBox(tl.spec, tl.trainer, t);
        for (const TransferRun& run : Pieces(plan.pair(t, e).runs)) {
          if (run.tensor != i) continue;
          ASSERT_EQ(run.src_tensor, i) << "an identity plan reads the tensor it writes";
          ASSERT_LE(run.src_offset + run.bytes, static_cast<std::uint64_t>(src.numel()) * elem) << "trainer " << t;
          ASSERT_LE(run.dst_offset + run.bytes, count.size()) << "engine " << e;
          for (std::uint64_t b = 0; b < run.bytes; ++b) {
            const std::uint64_t s = run.src_offset + b;
            const std::uint64_t d = run.dst_offset + b;
            ASSERT_EQ(s % elem, d % elem);
            ASSERT_EQ(testing::global_element(tl.spec, src, s / elem), testing::global_element(tl.spec, dst, d / elem))
                << tl.spec.ToString() << " trainer " << t << " engine " << e;
            ++count[d];
          }
        }
      }
      for (std::size_t d = 0; d < count.size(); ++d) {
        ASSERT_EQ(count[d], 1) << tl.spec.ToString() << " engine " << e << " byte " << d << " trainer layout "
                               << tl.trainer.ToString() << " engine layout " << tl.engine.ToString();
      }
      total += count.size();
    }
  }
  EXPECT_EQ(plan.total_bytes, total);
  for (const TransferPair& p : plan.pairs) {
    std::uint64_t bytes = 0;
    for (const TransferRun& run : p.runs) {
      bytes += run.total_bytes();
      EXPECT_GE(run.count, 1u);
      if (run.count == 1) {
        EXPECT_EQ(run.src_stride + run.dst_stride, 0u) << "a contiguous run has strides";
      }
    }
    const Runs pieces = Pieces(p.runs);
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      EXPECT_GT(pieces[k].bytes, 0u);
      if (k == 0) continue;
      const TransferRun& a = pieces[k - 1];
      const TransferRun& b = pieces[k];
      EXPECT_TRUE(a.tensor < b.tensor || (a.tensor == b.tensor && a.dst_offset < b.dst_offset)) << "runs out of order";
      EXPECT_FALSE(a.tensor == b.tensor && a.src_offset + a.bytes == b.src_offset &&
                   a.dst_offset + a.bytes == b.dst_offset)
          << "runs " << k - 1 << " and " << k << " of pair " << p.trainer_rank << "->" << p.engine_rank
          << " should be one";
    }
    EXPECT_EQ(p.bytes, bytes);
  }
}

// Pair streams: non-empty pairs only, entries in tensor order, each spec's
// size the sum of its runs, and make_plan accepts every stream.
void ExpectPairStreamsMatch(const TransferPlan& plan) {
  std::size_t non_empty = 0;
  for (const TransferPair& p : plan.pairs) non_empty += p.bytes > 0 ? 1 : 0;
  const std::vector<PairStream> streams = pair_streams(plan);
  ASSERT_EQ(streams.size(), non_empty);
  for (const PairStream& s : streams) {
    Runs flat;
    for (const PairStreamEntry& entry : s.entries) {
      std::uint64_t bytes = 0;
      for (const TransferRun& run : entry.runs) bytes += run.total_bytes();
      EXPECT_EQ(entry.spec.nbytes(), bytes);
      EXPECT_EQ(entry.spec.name, plan.engine_tensors[entry.runs.front().tensor].spec.name);
      flat.insert(flat.end(), entry.runs.begin(), entry.runs.end());
    }
    EXPECT_EQ(flat, plan.pair(s.trainer_rank, s.engine_rank).runs);
    EXPECT_OK(make_plan(s.specs(), kMinBucketSize));
  }
}

// Catches: a byte sent twice or never (replicated boxes not deduplicated, an
// intersection off by one, a chunk's empty tail mishandled), or taken from a
// trainer rank that does not hold it (offsets computed in the wrong box or
// strides): random specs of 0-3 dims with uneven and empty splits, every level
// kind and products, M and N in 1..8, checked byte by byte.
TEST(TransferPlan, RandomLayoutsDeliverEveryEngineByteExactlyOnce) {
  std::mt19937 rng(4242);
  std::set<LevelKind> trainer_kinds;
  std::set<LevelKind> engine_kinds;
  const std::uint64_t kSplits[] = {0, 1, 16, 1ull << 20};
  for (int iter = 0; iter < 250; ++iter) {
    const int m = testing::uniform(rng, 1, 8);
    const int n = testing::uniform(rng, 1, 8);
    std::vector<TensorLayouts> tensors;
    const int count = testing::uniform(rng, 1, 4);
    for (int i = 0; i < count; ++i) {
      TensorSpec spec = testing::random_spec(rng, "t" + std::to_string(i));
      if (testing::uniform(rng, 0, 3) == 0) spec.shape = {testing::uniform(rng, 8, 12), 3, 2};  // experts [E, 3, 2]
      Layout trainer = testing::random_layout(spec, m, rng);
      Layout engine = testing::random_layout(spec, n, rng);
      for (const LayoutLevel& l : trainer.levels) trainer_kinds.insert(l.kind);
      for (const LayoutLevel& l : engine.levels) engine_kinds.insert(l.kind);
      tensors.push_back(TensorLayouts{std::move(spec), std::move(trainer), std::move(engine)});
    }
    const TransferPlan plan = MustPlan(tensors, m, n, TransferPlanOptions{kSplits[testing::uniform(rng, 0, 3)]});
    ASSERT_NO_FATAL_FAILURE(ExpectExactlyOnce(plan)) << "iteration " << iter;
    ASSERT_NO_FATAL_FAILURE(ExpectPairStreamsMatch(plan)) << "iteration " << iter;
  }
  EXPECT_EQ(trainer_kinds.size(), 6u);  // every LevelKind, kOwner included
  EXPECT_EQ(engine_kinds.size(), 6u);
}

// Catches: source and destination offsets (or strides) swapped, or M < N and
// M > N pairs assigned to the wrong rank: FSDP rows into TP columns, by hand.
TEST(TransferPlan, FsdpRowsIntoTpColumnsByHand) {
  // [4, 6] u8; trainer chunk(dim 0, 2): rows [0,2) and [2,4), local [2, 6];
  // engine tensor_split(dim 1, 3): columns [0,2) [2,4) [4,6), local [4, 2].
  const TensorLayouts w{U8("w", {4, 6}), Layout::of(LayoutLevel::chunk(0, 2)),
                        Layout::of(LayoutLevel::tensor_split(1, 3))};
  const TransferPlan plan = MustPlan({w}, 2, 3);
  EXPECT_EQ(plan.pair(0, 0).runs, (Runs{TransferRun{0, 0, 0, 2, 2, 6, 2}}));  // 2 rows, strides 6 and 2
  EXPECT_EQ(Pieces(plan.pair(1, 0).runs), (Runs{C(0, 0, 4, 2), C(0, 6, 6, 2)}));
  EXPECT_EQ(Pieces(plan.pair(1, 2).runs), (Runs{C(0, 4, 4, 2), C(0, 10, 6, 2)}));
  // M > N: four trainer ranks of one row each into one engine rank.
  const TensorLayouts rows{U8("w", {4, 6}), Layout::of(LayoutLevel::chunk(0, 4)), Layout{}};
  const TransferPlan gather = MustPlan({rows}, 4, 1);
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(gather.pair(t, 0).runs, (Runs{C(0, 0, static_cast<std::uint64_t>(6 * t), 6)})) << "trainer " << t;
  }
  ExpectExactlyOnce(plan);
  ExpectExactlyOnce(gather);
}

// Catches: engines not keeping today's TP rules: a full trainer into engine
// layouts from the shard rules must move exactly for_each_shard_run's runs
// (full offset -> shard offset) for every weight of a preset.
TEST(TransferPlan, FullTrainerReproducesEngineShardRuns) {
  ASSERT_OK_AND_ASSIGN(const Model model, make_model("tiny-moe", 1));
  for (int n : {2, 3}) {
    std::vector<TensorLayouts> tensors;
    for (const Weight& w : model.weights) {
      tensors.push_back(TensorLayouts{w.spec, Layout{}, layout_from_shard_rule(w.rule, n)});
    }
    const TransferPlan plan = MustPlan(tensors, 1, n);
    for (int e = 0; e < n; ++e) {
      Runs expected;
      for (std::uint32_t i = 0; i < model.weights.size(); ++i) {
        for_each_shard_run(model.weights[i], e, n, [&](std::uint64_t full, std::uint64_t shard, std::uint64_t bytes) {
          expected.push_back(C(i, full, shard, bytes));
        });
      }
      EXPECT_EQ(Pieces(plan.pair(0, e).runs), expected) << "engine rank " << e << " of " << n;
    }
  }
}

// Catches: replicated sources not balanced (always the first holder chosen):
// with every trainer rank holding everything, each sends an equal share; with
// no splitting, whole tensors are dealt so loads differ by at most one tensor.
TEST(TransferPlan, ReplicatedSourcesShareTheLoad) {
  const TensorLayouts big{TensorSpec{"big", DType::kFloat32, {64, 16}}, Layout::of(LayoutLevel::replicate(4)),
                          Layout::of(LayoutLevel::tensor_split(1, 2))};
  const TransferPlan split = MustPlan({big}, 4, 2, TransferPlanOptions{1});
  EXPECT_EQ(split.bytes_per_trainer_rank(), (std::vector<std::uint64_t>(4, 64 * 16 * 4 / 4)));
  ExpectExactlyOnce(split);

  std::vector<TensorLayouts> small;
  for (int i = 0; i < 10; ++i) {
    const Layout replicas = Layout::of(LayoutLevel::replicate(3));
    small.push_back(TensorLayouts{U8("s" + std::to_string(i), {100}), replicas, Layout{}});
  }
  const TransferPlan dealt = MustPlan(small, 3, 1);  // 100-byte tensors stay whole under 1 MiB
  const std::vector<std::uint64_t> load = dealt.bytes_per_trainer_rank();
  EXPECT_EQ(load, (std::vector<std::uint64_t>{400, 300, 300}));
  // TP 2 x replica 2 trainers: each replica pair shares its TP shard.
  const TensorLayouts tp_dp{U8("w", {8, 8}),
                            Layout{{LayoutLevel::even(1, 2), LayoutLevel::replicate(2)}, RankOrder::kOuterSlowest},
                            Layout::of(LayoutLevel::chunk(0, 2))};
  EXPECT_EQ(MustPlan({tp_dp}, 4, 2, TransferPlanOptions{1}).bytes_per_trainer_rank(),
            (std::vector<std::uint64_t>{16, 16, 16, 16}));
}

// Catches: a digest that is not a pure function of the inputs (pointer or
// hash-order dependent), or that leaves out the layouts, the rank order, the
// shapes or the options.
TEST(TransferPlan, DigestIsDeterministicAndCoversTheInputs) {
  const Layout tp_fsdp{{LayoutLevel::tensor_split(1, 2), LayoutLevel::chunk(0, 2)}, RankOrder::kOuterSlowest};
  const TensorLayouts base{U8("w", {8, 6}), tp_fsdp, Layout::of(LayoutLevel::even(0, 2))};
  const TransferPlan a = MustPlan({base}, 4, 2);
  const TransferPlan b = MustPlan({base}, 4, 2);
  EXPECT_EQ(a.digest, b.digest);
  EXPECT_EQ(a.digest_hex().size(), 16u);
  EXPECT_EQ(a.digest_hex().find_first_not_of("0123456789abcdef"), std::string::npos);
  std::set<std::uint64_t> digests{a.digest};
  TensorLayouts order = base;
  order.trainer.order = RankOrder::kOuterFastest;
  digests.insert(MustPlan({order}, 4, 2).digest);
  TensorLayouts engine = base;
  engine.engine = Layout::of(LayoutLevel::chunk(0, 2));  // same boxes as even(0, 2) here
  digests.insert(MustPlan({engine}, 4, 2).digest);
  TensorLayouts shape = base;
  shape.spec.shape = {8, 8};
  digests.insert(MustPlan({shape}, 4, 2).digest);
  digests.insert(MustPlan({base}, 4, 2, TransferPlanOptions{1}).digest);
  EXPECT_EQ(digests.size(), 5u);
}

// Catches: an identity plan whose runs or digest changed when the planner
// was shared with the mapped plan (src_tensor encoded in an identity digest,
// a unit dimension's stride computed the mapped way, runs merged across
// walked dimensions): two plans' digests as make_transfer_plan gave them
// before mapped plans existed (a unit dimension, replicas, random layouts).
TEST(TransferPlan, IdentityDigestsAreUnchangedByMappedPlans) {
  const Layout tp_fsdp{{LayoutLevel::tensor_split(1, 2), LayoutLevel::chunk(0, 2)}, RankOrder::kOuterSlowest};
  const std::vector<TensorLayouts> fixed{
      {TensorSpec{"w", DType::kBFloat16, {8, 6}}, tp_fsdp, Layout::of(LayoutLevel::even(0, 2))},
      {TensorSpec{"e", DType::kFloat32, {4, 1, 6}}, Layout::of(LayoutLevel::replicate(4)),
       Layout::of(LayoutLevel::experts(2))}};
  EXPECT_EQ(MustPlan(fixed, 4, 2, TransferPlanOptions{1}).digest_hex(), "7d729cf962083256");
  std::mt19937 rng(99);
  std::vector<TensorLayouts> random;
  for (int i = 0; i < 6; ++i) {
    TensorSpec spec = testing::random_spec(rng, "t" + std::to_string(i));
    Layout trainer = testing::random_layout(spec, 3, rng);
    Layout engine = testing::random_layout(spec, 5, rng);
    random.push_back(TensorLayouts{std::move(spec), std::move(trainer), std::move(engine)});
  }
  EXPECT_EQ(MustPlan(random, 3, 5, TransferPlanOptions{16}).digest_hex(), "8a0cb572863b4fa7");
}

// Catches: bad input accepted, or an error that does not name the tensor and
// the value: no tensors, no ranks, a layout over the wrong number of ranks, a
// duplicate name, a layout the tensor does not fit.
TEST(TransferPlan, ErrorsNameTheTensorAndTheValue) {
  const Layout two = Layout::of(LayoutLevel::chunk(0, 2));
  EXPECT_HAS(make_transfer_plan({}, 2, 2).status().message(), "no tensors");
  EXPECT_HAS(make_transfer_plan({{U8("w", {4}), two, two}}, 0, 2).status().message(), "trainer ranks 0");
  const Status ranks = make_transfer_plan({{U8("w", {4}), two, two}}, 2, 3).status();
  EXPECT_EQ(ranks.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(ranks.message(), "tensor 'w': the engine layout chunk(dim 0, 2 ranks) has 2 ranks, the engine side has 3");
  EXPECT_HAS(make_transfer_plan({{U8("w", {4}), two, two}, {U8("w", {2}), two, two}}, 2, 2).status().message(),
             "duplicate tensor name 'w' at positions 0 and 1");
  const Status even =
      make_transfer_plan({{U8("x", {4, 3}), Layout::of(LayoutLevel::even(1, 2)), two}}, 2, 2).status();
  EXPECT_HAS(even.message(), "trainer layout: tensor 'x uint8[4, 3]', rank 0");
  EXPECT_HAS(even.message(), "even(dim 1, 2 ranks)");
  EXPECT_HAS(make_transfer_plan({{U8("", {4}), two, two}}, 2, 2).status().message(), "tensor position 0");
}

}  // namespace
}  // namespace refit
