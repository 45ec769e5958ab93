#include "reshard/bucket_feed.h"

#include <gtest/gtest.h>

#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "refit/layout.h"
#include "refit/mapped_transfer_plan.h"
#include "refit/plan.h"
#include "testing/expect_has.h"
#include "testing/mapped_case.h"
#include "testing/random_layout.h"
#include "testing/status_matchers.h"

namespace refit {

// Readable failures: gtest would print the structs as bytes.
void PrintTo(const FeedRun& r, std::ostream* os) {
  *os << "{tensor " << r.tensor << ", src " << r.src_offset << ", dst " << r.tensor_offset << ", bucket "
      << r.bucket_offset << ", " << r.bytes << " bytes x " << r.count << ", strides " << r.src_stride << "/"
      << r.dst_stride << "}";
}

void PrintTo(const BucketShare& s, std::ostream* os) {
  *os << "{trainer " << s.trainer_rank << ", " << s.bytes << " bytes:";
  for (const FeedRun& r : s.runs) {
    *os << " ";
    PrintTo(r, os);
  }
  *os << "}";
}

namespace {

TensorSpec BF16(std::string name, std::vector<std::int64_t> shape) {
  return TensorSpec{std::move(name), DType::kBFloat16, std::move(shape)};
}

TransferPlan MustTransfer(std::vector<TensorLayouts> tensors, int m, int n) {
  auto plan = make_transfer_plan(std::move(tensors), m, n);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  return plan.ok() ? std::move(plan).value() : TransferPlan{};
}

Box MustBox(const TensorSpec& spec, const Layout& layout, int rank) {
  auto box = layout_box(spec, layout, rank);
  EXPECT_TRUE(box.ok()) << box.status().ToString();
  return box.ok() ? *box : Box{};
}

// Engine rank e's stream: its local shard of every tensor, in order.
std::vector<TensorSpec> LocalSpecs(const TransferPlan& transfer, int e) {
  std::vector<TensorSpec> out;
  for (const SideTensor& t : transfer.engine_tensors) {
    auto spec = local_spec(t.spec, t.layout, e);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    out.push_back(spec.ok() ? *spec : TensorSpec{});
  }
  return out;
}

Plan MustPlan(std::vector<TensorSpec> specs, std::uint64_t bucket_size) {
  auto plan = make_plan(std::move(specs), bucket_size);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  return plan.ok() ? std::move(plan).value() : Plan{};
}

// A contiguous feed run.
FeedRun C(std::uint32_t tensor, std::uint64_t src, std::uint64_t dst, std::uint64_t bucket, std::uint64_t bytes) {
  return FeedRun{tensor, src, dst, bucket, bytes, 1, 0, 0, tensor};
}

// The full tensor's flat element of every element of a box's local shard.
std::vector<std::uint64_t> GlobalElements(const TensorSpec& spec, const Box& box) {
  std::vector<std::uint64_t> out(static_cast<std::size_t>(box.numel()));
  for (std::size_t k = 0; k < out.size(); ++k) out[k] = testing::global_element(spec, box, k);
  return out;
}

// What each byte of one bucket should receive: -1 for padding, else the
// entry index; and the tensor byte it is.
struct BucketMap {
  std::vector<int> entry;
  std::vector<std::uint64_t> tensor_byte;
};

BucketMap MapBucket(const Bucket& bucket, std::uint64_t bucket_size) {
  BucketMap map{std::vector<int>(bucket_size, -1), std::vector<std::uint64_t>(bucket_size, 0)};
  for (std::size_t k = 0; k < bucket.entries.size(); ++k) {
    const PlanEntry& entry = bucket.entries[k];
    for (std::uint64_t b = 0; b < entry.bytes; ++b) {
      map.entry[entry.bucket_offset + b] = static_cast<int>(k);
      map.tensor_byte[entry.bucket_offset + b] = entry.tensor_offset + b;
    }
  }
  return map;
}

// Per tensor, the global element of every element of each trainer rank's
// shard and of engine rank e's shard: byte checks become lookups.
struct ElementTables {
  std::vector<std::vector<std::vector<std::uint64_t>>> trainer;  // [tensor][t]
  std::vector<std::vector<std::uint64_t>> engine;                // [tensor]
};

ElementTables TablesFor(const TransferPlan& transfer, int e) {
  ElementTables tables;
  for (std::size_t i = 0; i < transfer.engine_tensors.size(); ++i) {
    const SideTensor& trainer = transfer.trainer_tensors[i];  // an identity plan: the same spec
    const SideTensor& engine = transfer.engine_tensors[i];
    tables.trainer.emplace_back();
    for (int t = 0; t < transfer.trainer_ranks; ++t) {
      tables.trainer.back().push_back(GlobalElements(trainer.spec, MustBox(trainer.spec, trainer.layout, t)));
    }
    tables.engine.push_back(GlobalElements(engine.spec, MustBox(engine.spec, engine.layout, e)));
  }
  return tables;
}

// Checks one share's runs byte by byte against the bucket: each byte lands
// on the entry byte of the same tensor byte, its source is inside the
// trainer's shard and holds the same element of the full tensor; runs are
// in entry order, then dst order. Counts each bucket byte written.
void ExpectShareRuns(const TransferPlan& transfer, const ElementTables& tables, const BucketMap& map,
                     const BucketShare& share, std::vector<int>& written) {
  const auto t = static_cast<std::size_t>(share.trainer_rank);
  std::uint64_t bytes = 0;
  int last_entry = -1;
  std::uint64_t last_dst = 0;
  for (const FeedRun& run : share.runs) {
    ASSERT_LT(run.tensor, transfer.engine_tensors.size());
    ASSERT_EQ(run.src_tensor, run.tensor) << "an identity plan reads the tensor it writes";
    ASSERT_GT(run.bytes, 0u);
    ASSERT_GE(run.count, 1u);
    if (run.count == 1) {
      EXPECT_EQ(run.src_stride + run.dst_stride, 0u) << "a contiguous run has strides";
    }
    const std::uint64_t elem = dtype_size(transfer.engine_tensors[run.tensor].spec.dtype);
    const std::vector<std::uint64_t>& src_elems = tables.trainer[run.tensor][t];
    const std::vector<std::uint64_t>& dst_elems = tables.engine[run.tensor];
    ASSERT_LT(run.bucket_offset, map.entry.size());
    const int entry = map.entry[run.bucket_offset];
    EXPECT_TRUE(entry > last_entry || (entry == last_entry && run.tensor_offset > last_dst)) << "runs out of order";
    last_entry = entry;
    last_dst = run.tensor_offset;
    for (std::uint64_t i = 0; i < run.count; ++i) {
      for (std::uint64_t b = 0; b < run.bytes; ++b) {
        const std::uint64_t s = run.src_offset + i * run.src_stride + b;
        const std::uint64_t d = run.tensor_offset + i * run.dst_stride + b;
        const std::uint64_t k = run.bucket_offset + i * run.dst_stride + b;
        ASSERT_LT(s, src_elems.size() * elem) << "trainer " << t << " reads outside its shard";
        ASSERT_LT(k, map.entry.size());
        ASSERT_GE(map.entry[k], 0) << "bucket byte " << k << " is padding";
        ASSERT_EQ(map.tensor_byte[k], d) << "bucket byte " << k;
        ASSERT_EQ(s % elem, d % elem);
        ASSERT_EQ(src_elems[s / elem], dst_elems[d / elem])
            << "trainer " << t << " src byte " << s << " dst byte " << d;
        ++written[k];
      }
    }
    bytes += run.total_bytes();
  }
  EXPECT_EQ(share.bytes, bytes);
}

// The header's rules for one engine rank's feed, byte by byte.
void ExpectFeedFillsEveryByteOnce(const TransferPlan& transfer, int e, const Plan& plan, const BucketFeed& feed) {
  ASSERT_EQ(feed.engine_rank, e);
  ASSERT_EQ(feed.shares.size(), plan.buckets.size());
  const ElementTables tables = TablesFor(transfer, e);
  for (std::size_t j = 0; j < plan.buckets.size(); ++j) {
    const Bucket& bucket = plan.buckets[j];
    const BucketMap map = MapBucket(bucket, plan.bucket_size);
    std::vector<int> written(plan.bucket_size, 0);
    std::uint64_t share_bytes = 0;
    for (std::size_t s = 0; s < feed.shares[j].size(); ++s) {
      const BucketShare& share = feed.shares[j][s];
      if (s > 0) {
        EXPECT_LT(feed.shares[j][s - 1].trainer_rank, share.trainer_rank) << "bucket " << j;
      }
      EXPECT_GT(share.bytes, 0u);
      ASSERT_NO_FATAL_FAILURE(ExpectShareRuns(transfer, tables, map, share, written)) << "bucket " << j;
      share_bytes += share.bytes;
    }
    std::uint64_t entry_bytes = 0;
    for (const PlanEntry& entry : bucket.entries) entry_bytes += entry.bytes;
    EXPECT_EQ(share_bytes, entry_bytes) << "bucket " << j;
    for (std::size_t k = 0; k < written.size(); ++k) {
      ASSERT_EQ(written[k], map.entry[k] >= 0 ? 1 : 0) << "bucket " << j << " byte " << k << " engine rank " << e;
    }
  }
}

// Catches: a strided run clipped wrong at a chunk boundary (the partial
// first or last piece dropped, kept whole, or cut off by one; the first or
// last overlapping piece found off by one), a src offset not advanced with
// the cut, a bucket offset not relative to the entry, a run given to two
// chunks or to none, shares out of order or empty: random transfer plans
// (M, N in 1..8, every level kind) with tensors larger than a bucket, cut by
// several bucket sizes, checked byte by byte.
TEST(BucketFeed, RandomPlansFillEveryBucketByteOnceWithTheRightElement) {
  std::mt19937 rng(2718);
  const TensorSpec kLarge[] = {BF16("big", {300, 40}), TensorSpec{"experts", DType::kFloat32, {10, 30, 20}},
                               TensorSpec{"rows", DType::kUInt8, {7, 1300}}};
  int chunked = 0;
  int strided = 0;
  for (int iter = 0; iter < 120; ++iter) {
    const int m = testing::uniform(rng, 1, 8);
    const int n = testing::uniform(rng, 1, 8);
    std::vector<TensorLayouts> tensors;
    const int count = testing::uniform(rng, 1, 4);
    for (int i = 0; i < count; ++i) {
      TensorSpec spec = testing::random_spec(rng, "t" + std::to_string(i));
      if (testing::uniform(rng, 0, 2) == 0) {
        spec = kLarge[testing::uniform(rng, 0, 2)];
        spec.name = "t" + std::to_string(i);
      }
      Layout trainer = testing::random_layout(spec, m, rng);
      Layout engine = testing::random_layout(spec, n, rng);
      tensors.push_back(TensorLayouts{std::move(spec), std::move(trainer), std::move(engine)});
    }
    const TransferPlan transfer = MustTransfer(tensors, m, n);
    for (int e = 0; e < n; ++e) {
      const auto steps = static_cast<std::uint64_t>(testing::uniform(rng, 0, 24));
      const std::uint64_t bucket_size = kMinBucketSize + kPlanAlignment * steps;
      const Plan plan = MustPlan(LocalSpecs(transfer, e), bucket_size);
      ASSERT_OK_AND_ASSIGN(const BucketFeed feed, make_bucket_feed(transfer, e, plan));
      ASSERT_NO_FATAL_FAILURE(ExpectFeedFillsEveryByteOnce(transfer, e, plan, feed))
          << "iteration " << iter << " engine rank " << e << " bucket size " << bucket_size;
      for (const Bucket& b : plan.buckets) {
        for (const PlanEntry& entry : b.entries) chunked += entry.is_chunk(plan.specs[entry.tensor]) ? 1 : 0;
      }
      for (const std::vector<BucketShare>& bucket : feed.shares) {
        for (const BucketShare& s : bucket) {
          for (const FeedRun& r : s.runs) strided += r.count > 1 ? 1 : 0;
        }
      }
    }
  }
  EXPECT_GT(chunked, 100) << "too few tensors cut into chunks to exercise the clipping";
  EXPECT_GT(strided, 100) << "too few strided runs";
}

// Feeds one bucket of engine rank `e`: copies every share's runs from the
// trainer shards `src` into the bucket (staged) and straight into `direct`
// by tensor_offset (direct mode), then unpacks the bucket's entries into
// `staged`. Checks that each run reads inside its trainer rank's shard of
// src_tensor and that each entry byte is written once, padding never.
// Returns the runs whose source is another tensor than their destination.
int FeedOneBucket(const TransferPlan& transfer, const testing::Shards& src, const Plan& plan, std::size_t j,
                  const BucketFeed& feed, std::vector<std::vector<std::uint8_t>>& staged,
                  std::vector<std::vector<std::uint8_t>>& direct) {
  std::vector<std::uint8_t> bucket(plan.bucket_size, 0);
  std::vector<int> written(plan.bucket_size, 0);
  int cross = 0;
  for (const BucketShare& share : feed.shares[j]) {
    for (const FeedRun& run : share.runs) {
      EXPECT_LT(run.src_tensor, transfer.trainer_tensors.size());
      if (run.src_tensor >= transfer.trainer_tensors.size()) return cross;
      cross += transfer.trainer_tensors[run.src_tensor].spec.name != transfer.engine_tensors[run.tensor].spec.name;
      const std::vector<std::uint8_t>& from = src[static_cast<std::size_t>(share.trainer_rank)][run.src_tensor];
      std::vector<std::uint8_t>& to = direct[run.tensor];
      for (std::uint64_t i = 0; i < run.count; ++i) {
        const std::uint64_t s = run.src_offset + i * run.src_stride;
        const std::uint64_t k = run.bucket_offset + i * run.dst_stride;
        const std::uint64_t d = run.tensor_offset + i * run.dst_stride;
        EXPECT_LE(s + run.bytes, from.size()) << "trainer " << share.trainer_rank << " reads outside its shard";
        EXPECT_LE(k + run.bytes, bucket.size());
        EXPECT_LE(d + run.bytes, to.size());
        if (s + run.bytes > from.size() || k + run.bytes > bucket.size() || d + run.bytes > to.size()) return cross;
        for (std::uint64_t b = 0; b < run.bytes; ++b) {
          bucket[k + b] = from[s + b];
          to[d + b] = from[s + b];
          ++written[k + b];
        }
      }
    }
  }
  std::vector<int> entry_bytes(plan.bucket_size, 0);
  for (const PlanEntry& entry : plan.buckets[j].entries) {
    std::copy_n(bucket.begin() + static_cast<std::ptrdiff_t>(entry.bucket_offset), entry.bytes,
                staged[entry.tensor].begin() + static_cast<std::ptrdiff_t>(entry.tensor_offset));
    for (std::uint64_t b = 0; b < entry.bytes; ++b) entry_bytes[entry.bucket_offset + b] = 1;
  }
  EXPECT_EQ(written, entry_bytes) << "bucket " << j << ": a byte written twice, never, or into padding";
  return cross;
}

// Catches: a feed run that drops src_tensor (a cut or whole piece built
// without it reads the engine tensor's index), the runs of one engine
// tensor from several trainer tensors clipped as if they were one (a later
// correspondence's runs skipped by the bisection), bucket or tensor offsets
// of a mapped stream off: random mapped cases (the mapped plan's property
// test's, at 8x width: shards larger than a bucket), every engine rank's
// stream cut by several bucket sizes, fed into the buckets (staged) and
// straight into the engine shards (direct) from the trainer shards, each
// against the hand conversion byte by byte.
TEST(BucketFeed, MappedPlansFeedTheHandConversion) {
  std::mt19937 rng(1618);
  int chunked = 0;
  int cross = 0;
  for (int iter = 0; iter < 40; ++iter) {
    const testing::MappedCase mc = testing::random_mapped_case(rng, 8);
    SCOPED_TRACE("iteration " + std::to_string(iter) + ": " + mc.what);
    ASSERT_OK_AND_ASSIGN(const TransferPlan transfer, make_mapped_transfer_plan(mc.input));
    const testing::Shards src = testing::cut_shards(transfer.trainer_tensors, transfer.trainer_ranks, mc.trainer);
    const testing::Shards want = testing::cut_shards(transfer.engine_tensors, transfer.engine_ranks, mc.engine);
    const testing::Shards empty = testing::empty_like(want);
    for (int e = 0; e < transfer.engine_ranks; ++e) {
      const auto steps = static_cast<std::uint64_t>(testing::uniform(rng, 0, 24));
      const Plan plan = MustPlan(LocalSpecs(transfer, e), kMinBucketSize + kPlanAlignment * steps);
      ASSERT_OK_AND_ASSIGN(const BucketFeed feed, make_bucket_feed(transfer, e, plan));
      std::vector<std::vector<std::uint8_t>> staged = empty[static_cast<std::size_t>(e)];
      std::vector<std::vector<std::uint8_t>> direct = staged;
      for (std::size_t j = 0; j < plan.buckets.size(); ++j) {
        cross += FeedOneBucket(transfer, src, plan, j, feed, staged, direct);
        ASSERT_FALSE(HasFailure()) << "engine rank " << e << " bucket " << j;
        for (const PlanEntry& entry : plan.buckets[j].entries) chunked += entry.is_chunk(plan.specs[entry.tensor]);
      }
      ASSERT_EQ(staged, want[static_cast<std::size_t>(e)]) << "engine rank " << e << " staged";
      ASSERT_EQ(direct, want[static_cast<std::size_t>(e)]) << "engine rank " << e << " direct";
    }
  }
  EXPECT_GT(chunked, 100) << "too few tensors cut into chunks";
  EXPECT_GT(cross, 1000) << "too few runs from another tensor";
}

// [8, 1200] bf16; trainer chunk(dim 0, 2): rows [0,4) and [4,8), local
// [4, 1200], rows of 2400 bytes; engine tensor_split(dim 1, 2): columns
// [0,600) on rank 0, local [8, 600], rows of 1200 bytes, 9600 bytes in all.
// Trainer t sends rank 0 one run: 4 pieces of 1200 bytes, src stride 2400,
// dst stride 1200, at dst 4800 t. 4096-byte buckets cut the shard at 4096
// and 8192, mid-row; "b" [8] bf16 (chunk(dim 0, 2) into replicas) joins
// the last bucket at 1536.
struct HandCase {
  TransferPlan transfer = MustTransfer(
      {TensorLayouts{BF16("w", {8, 1200}), Layout::of(LayoutLevel::chunk(0, 2)),
                     Layout::of(LayoutLevel::tensor_split(1, 2))},
       TensorLayouts{BF16("b", {8}), Layout::of(LayoutLevel::chunk(0, 2)), Layout::of(LayoutLevel::replicate(2))}},
      2, 2);
  Plan plan = MustPlan(LocalSpecs(transfer, 0), kMinBucketSize);
};

// Catches: the cut pieces' offsets off (src not advanced by the cut, the
// bucket offset of a later chunk not relative to its entry), the whole
// pieces between two cuts not kept as one strided run, a later entry's runs
// not after the earlier entry's: every FeedRun by hand.
TEST(BucketFeed, FsdpRowsIntoTpColumnsCutMidRowByHand) {
  const HandCase hc;
  ASSERT_EQ(hc.plan.buckets.size(), 3u);
  ASSERT_EQ(hc.plan.buckets[2].entries.size(), 2u);
  ASSERT_EQ(hc.plan.buckets[2].entries[1].bucket_offset, 1536u);
  ASSERT_OK_AND_ASSIGN(const BucketFeed feed, make_bucket_feed(hc.transfer, 0, hc.plan));
  ASSERT_EQ(feed.shares.size(), 3u);
  using Runs = std::vector<FeedRun>;
  using Shares = std::vector<BucketShare>;
  // Bucket 0, shard bytes [0, 4096): trainer 0's rows 0-2 whole, row 3 up to 4096.
  EXPECT_EQ(feed.shares[0],
            (Shares{{0, 4096, Runs{FeedRun{0, 0, 0, 0, 1200, 3, 2400, 1200}, C(0, 7200, 3600, 3600, 496)}}}));
  // Bucket 1, [4096, 8192): the rest of trainer 0's row 3; trainer 1's rows
  // 4-5 whole and row 6 up to 8192.
  EXPECT_EQ(feed.shares[1], (Shares{{0, 704, Runs{C(0, 7696, 4096, 0, 704)}},
                                    {1, 3392, Runs{FeedRun{0, 0, 4800, 704, 1200, 2, 2400, 1200},
                                                   C(0, 4800, 7200, 3104, 992)}}}));
  // Bucket 2, [8192, 9600) then "b": the rest of row 6, row 7 whole (one
  // piece: a contiguous run), then each trainer's half of "b".
  EXPECT_EQ(feed.shares[2], (Shares{{0, 8, Runs{C(1, 0, 0, 1536, 8)}},
                                    {1, 1416, Runs{C(0, 5792, 8192, 0, 208), C(0, 7200, 8400, 208, 1200),
                                                   C(1, 0, 8, 1544, 8)}}}));
  EXPECT_EQ(feed.trainer_ranks(), (std::vector<int>{0, 1}));
  ASSERT_NE(feed.share(1, 1), nullptr);
  EXPECT_EQ(feed.share(1, 1)->bytes, 3392u);
  EXPECT_EQ(feed.share(0, 1), nullptr);
  EXPECT_EQ(feed.share(3, 0), nullptr);
  ExpectFeedFillsEveryByteOnce(hc.transfer, 0, hc.plan, feed);
  const Plan plan1 = MustPlan(LocalSpecs(hc.transfer, 1), kMinBucketSize);
  ASSERT_OK_AND_ASSIGN(const BucketFeed rank1, make_bucket_feed(hc.transfer, 1, plan1));
  ExpectFeedFillsEveryByteOnce(hc.transfer, 1, plan1, rank1);
}

// Catches: a piece that ends exactly at the chunk's end taken for a cut
// one (> written >=), or the whole pieces of a chunk split in two: [8, 1024]
// bf16 into tensor_split(dim 1, 2) has rows of 1024 bytes on the engine, so
// 4096-byte buckets end on row edges and each chunk is one strided run.
TEST(BucketFeed, ChunksEndingOnPieceEdgesKeepOneStridedRun) {
  const TransferPlan transfer = MustTransfer(
      {TensorLayouts{BF16("w", {8, 1024}), Layout{}, Layout::of(LayoutLevel::tensor_split(1, 2))}}, 1, 2);
  const Plan plan = MustPlan(LocalSpecs(transfer, 1), kMinBucketSize);
  ASSERT_EQ(plan.buckets.size(), 2u);
  ASSERT_OK_AND_ASSIGN(const BucketFeed feed, make_bucket_feed(transfer, 1, plan));
  using Shares = std::vector<BucketShare>;
  EXPECT_EQ(feed.shares[0], (Shares{{0, 4096, {FeedRun{0, 1024, 0, 0, 1024, 4, 2048, 1024}}}}));
  EXPECT_EQ(feed.shares[1], (Shares{{0, 4096, {FeedRun{0, 1024 + 4 * 2048, 4096, 0, 1024, 4, 2048, 1024}}}}));
  ExpectFeedFillsEveryByteOnce(transfer, 1, plan, feed);
}

// Catches: bad input accepted, or an error that does not name the value: an
// engine rank outside the plan, a bucket plan of other specs (the full
// tensors, a missing tensor, a renamed one), a transfer plan whose runs do
// not cover the engine rank's shard.
TEST(BucketFeed, ErrorsNameTheRankAndTheTensor) {
  const HandCase hc;
  for (int e : {-1, 2}) {
    const Status s = make_bucket_feed(hc.transfer, e, hc.plan).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_HAS(s.message(), "engine rank " + std::to_string(e) + " is outside the transfer plan's 2 engine ranks");
  }
  const Plan full = MustPlan({BF16("w", {8, 1200}), BF16("b", {8})}, kMinBucketSize);
  const Status other = make_bucket_feed(hc.transfer, 0, full).status();
  EXPECT_EQ(other.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(other.message(), "stream position 0 of the bucket plan is 'w bfloat16[8, 1200]'");
  EXPECT_HAS(other.message(), "engine rank 0's local shard of tensor 'w' is 'w bfloat16[8, 600]'");
  const Plan shorter = MustPlan({BF16("w", {8, 600})}, kMinBucketSize);
  EXPECT_HAS(make_bucket_feed(hc.transfer, 0, shorter).status().message(),
             "the bucket plan's stream has 1 tensors, the transfer plan 2 (tensor 'b' is missing)");
  const Plan renamed = MustPlan({BF16("w", {8, 600}), BF16("c", {8})}, kMinBucketSize);
  EXPECT_HAS(make_bucket_feed(hc.transfer, 0, renamed).status().message(), "tensor 'b' is 'b bfloat16[8]'");
  TransferPlan dropped = hc.transfer;
  dropped.pairs[1].runs.clear();  // trainer 0 -> engine rank 1
  const Status gap = make_bucket_feed(dropped, 1, MustPlan(LocalSpecs(hc.transfer, 1), kMinBucketSize)).status();
  EXPECT_HAS(gap.message(), "runs of tensor 'w' into engine rank 1 cover 0 of the 4096 bytes [0, 4096)");
}

// Catches: deal_whole_buckets dealing by share instead of by bucket (a
// 0-byte bucket must still count in j % feeders), changing the runs, or
// giving a 0-byte bucket a share: a one-trainer feed dealt to two feeders.
TEST(BucketFeed, DealWholeBucketsRoundRobinsByBucket) {
  // "z" [0] alone in bucket 0 (the chunked "w" closes it), then w's 3 chunks.
  const TransferPlan transfer = MustTransfer(
      {TensorLayouts{BF16("z", {0}), Layout{}, Layout::of(LayoutLevel::replicate(2))},
       TensorLayouts{BF16("w", {8, 1200}), Layout{}, Layout::of(LayoutLevel::tensor_split(1, 2))}},
      1, 2);
  const Plan plan = MustPlan(LocalSpecs(transfer, 1), kMinBucketSize);
  ASSERT_EQ(plan.buckets.size(), 4u);
  ASSERT_OK_AND_ASSIGN(const BucketFeed feed, make_bucket_feed(transfer, 1, plan));
  ExpectFeedFillsEveryByteOnce(transfer, 1, plan, feed);
  EXPECT_TRUE(feed.shares[0].empty()) << "a 0-byte bucket has no contributor";
  const BucketFeed dealt = deal_whole_buckets(feed, {3, 5});
  EXPECT_EQ(dealt.engine_rank, 1);
  ASSERT_EQ(dealt.shares.size(), 4u);
  EXPECT_TRUE(dealt.shares[0].empty());
  for (std::size_t j = 1; j < 4; ++j) {
    ASSERT_EQ(dealt.shares[j].size(), 1u) << "bucket " << j;
    EXPECT_EQ(dealt.shares[j][0].trainer_rank, j % 2 == 0 ? 3 : 5) << "bucket " << j;
    EXPECT_EQ(dealt.shares[j][0].runs, feed.shares[j][0].runs);
    EXPECT_EQ(dealt.shares[j][0].bytes, plan.buckets[j].bytes);
  }
  EXPECT_EQ(dealt.trainer_ranks(), (std::vector<int>{3, 5}));
  EXPECT_EQ(dealt.share(2, 5), nullptr);
  EXPECT_EQ(deal_whole_buckets(feed, {7}).trainer_ranks(), (std::vector<int>{7}));
}

}  // namespace
}  // namespace refit
