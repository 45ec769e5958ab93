#include "aligner/aligner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "refit/batch.h"
#include "refit/plan.h"

namespace refit {
namespace {

constexpr std::uint64_t kBucket = 4096;
constexpr unsigned char kPoison = 0xA5;

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

Plan MustPlan(std::vector<TensorSpec> specs, std::uint64_t bucket_size = kBucket) {
  auto plan = make_plan(std::move(specs), bucket_size);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  return plan.ok() ? std::move(plan).value() : Plan{};
}

// One engine's stream, sharded unevenly over 3 ranks: tensor i has a
// different byte size on each rank, so the ranks' bucket (and batch)
// boundaries differ. Mixed dtypes; one tensor is chunked on rank 2.
std::vector<TensorSpec> Shard(int rank, int n = 24) {
  std::vector<TensorSpec> specs;
  for (int i = 0; i < n; ++i) {
    TensorSpec s;
    s.name = "layers." + std::to_string(i / 3) + ".w" + std::to_string(i % 3);
    s.dtype = i % 4 == 3 ? DType::kFloat32 : DType::kBFloat16;
    const std::int64_t per_rank[3] = {100 + 37 * ((i * 7) % 11), 300 + 150 * ((i * 5) % 13), 40 + 90 * ((i * 3) % 17)};
    s.shape = {per_rank[rank], 2};
    if (rank == 2 && i == 10) s.shape = {3000, 2};  // 12000 bytes of bf16: chunked
    specs.push_back(s);
  }
  return specs;
}

std::vector<std::size_t> BatchSizes(const Plan& plan) {
  std::vector<std::size_t> out;
  for (const Bucket& b : plan.buckets)
    if (!b.completes.empty()) out.push_back(b.completes.size());
  return out;
}

// ---------------------------------------------------------------- sources

// Wraps a source and counts what it delivered (for the no-spin test).
class CountingSource : public BatchSource {
 public:
  explicit CountingSource(BatchSource* inner) : inner_(inner) {}
  StatusOr<std::optional<Batch>> next(Deadline d) override {
    auto b = inner_->next(d);
    if (b.ok() && b->has_value()) delivered += (*b)->tensors.size();
    if (b.ok() && !b->has_value()) ended = true;
    return b;
  }
  int rank() const override { return inner_->rank(); }
  const Plan& plan() const override { return inner_->plan(); }
  std::uint64_t delivered = 0;
  bool ended = false;

 private:
  BatchSource* inner_;
};

// Yields the batches of a plan, then fails or misbehaves at batch `at`.
class ScriptedSource : public BatchSource {
 public:
  ScriptedSource(const Plan* plan, int rank, std::uint64_t at, std::function<StatusOr<std::optional<Batch>>()> act)
      : replay_(plan, rank), at_(at), act_(std::move(act)) {}
  StatusOr<std::optional<Batch>> next(Deadline d) override {
    if (calls_++ == at_) return act_();
    return replay_.next(d);
  }
  int rank() const override { return replay_.rank(); }
  const Plan& plan() const override { return replay_.plan(); }

 private:
  PlanReplay replay_;
  std::uint64_t at_;
  std::uint64_t calls_ = 0;
  std::function<StatusOr<std::optional<Batch>>()> act_;
};

// Expected byte `offset` of tensor `name` on engine rank `rank`.
unsigned char ExpectedByte(int rank, const std::string& name, std::uint64_t offset) {
  std::uint64_t h = std::hash<std::string>{}(name) ^ (0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(rank + 1));
  h += offset * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  unsigned char b = static_cast<unsigned char>(h);
  return b == kPoison ? 0x5A : b;  // real content never equals the poison byte
}

// The receiver's lifetime contract (receiver.h, DESIGN.md rule 3) with real
// bytes: two staging buffers, batch n lives in buffer n % 2, and when batch
// n + 2 is requested the buffer of batch n is poisoned (0xA5) before it is
// refilled. A consumer that holds a view past its lifetime reads poison or the
// wrong tensor's bytes.
class PoisoningSource : public BatchSource {
 public:
  PoisoningSource(const Plan* plan, int rank) : replay_(plan, rank) {
    std::uint64_t largest = 0;
    for (const Bucket& b : plan->buckets) {
      std::uint64_t bytes = 0;
      for (std::uint32_t t : b.completes) bytes += plan->specs[t].nbytes();
      largest = std::max(largest, bytes);
    }
    for (auto& buf : buffers_) buf.assign(largest, std::byte{kPoison});  // never reallocated
  }
  StatusOr<std::optional<Batch>> next(Deadline d) override {
    auto b = replay_.next(d);
    if (!b.ok() || !b->has_value()) return b;
    Batch& batch = **b;
    std::vector<std::byte>& buf = buffers_[batch.sequence % 2];
    if (batch.sequence >= 2) ++poisoned;  // recycles the buffer of batch sequence - 2
    std::memset(buf.data(), kPoison, buf.size());
    std::uint64_t at = 0;
    for (TensorView& v : batch.tensors) {
      v.data = buf.data() + at;
      for (std::uint64_t o = 0; o < v.spec->nbytes(); ++o)
        v.data[o] = std::byte{ExpectedByte(rank(), v.spec->name, o)};
      at += v.spec->nbytes();
    }
    return b;
  }
  int rank() const override { return replay_.rank(); }
  const Plan& plan() const override { return replay_.plan(); }
  int poisoned = 0;

 private:
  PlanReplay replay_;
  std::array<std::vector<std::byte>, 2> buffers_;
};

// Drains an aligner; returns the error or the aligned batches' names.
struct Drained {
  Status status;
  std::vector<std::vector<std::string>> batches;
};
Drained Drain(Aligner& aligner) {
  Drained out;
  for (int guard = 0; guard < 10000; ++guard) {
    auto b = aligner.next(Deadline::Never());
    if (!b.ok()) {
      out.status = b.status();
      return out;
    }
    if (!b->has_value()) return out;
    std::vector<std::string> names;
    for (const TensorSpec* s : (*b)->specs) names.push_back(s->name);
    out.batches.push_back(names);
  }
  ADD_FAILURE() << "aligner did not end";
  return out;
}

Drained DrainPlans(const std::vector<Plan>& plans) {
  std::vector<PlanReplay> replays;
  for (std::size_t r = 0; r < plans.size(); ++r) replays.emplace_back(&plans[r], static_cast<int>(r));
  std::vector<BatchSource*> sources;
  for (auto& p : replays) sources.push_back(&p);
  auto aligner = Aligner::Create(sources);
  EXPECT_TRUE(aligner.ok()) << aligner.status().ToString();
  return Drain(*aligner);
}

// ---------------------------------------------------------------- PlanReplay

// catches: replay yielding the empty batch of a middle-chunk bucket, wrong
// bucket index, views not pointing into plan.specs.
TEST(PlanReplay, YieldsCompletedTensorsPerBucket) {
  Plan plan = MustPlan({TensorSpec{"a", DType::kUInt8, {100}}, TensorSpec{"big", DType::kUInt8, {10000}},
                        TensorSpec{"c", DType::kUInt8, {100}}});
  PlanReplay replay(&plan, 3);
  EXPECT_EQ(replay.rank(), 3);
  std::vector<std::pair<std::uint64_t, std::vector<const TensorSpec*>>> got;
  for (;;) {
    auto b = replay.next(Deadline::Never());
    ASSERT_TRUE(b.ok());
    if (!b->has_value()) break;
    EXPECT_EQ((*b)->sequence, got.size());
    std::vector<const TensorSpec*> specs;
    for (const TensorView& v : (*b)->tensors) {
      EXPECT_EQ(v.data, nullptr);
      specs.push_back(v.spec);
    }
    got.emplace_back((*b)->bucket, specs);
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].first, 0u);
  EXPECT_EQ(got[0].second, (std::vector<const TensorSpec*>{&plan.specs[0]}));
  EXPECT_EQ(got[1].first, 3u);
  EXPECT_EQ(got[1].second, (std::vector<const TensorSpec*>{&plan.specs[1], &plan.specs[2]}));
  auto again = replay.next(Deadline::Never());
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());
  replay.reset();
  auto first = replay.next(Deadline::Never());
  ASSERT_TRUE(first.ok() && first->has_value());
  EXPECT_EQ((*first)->sequence, 0u);
  EXPECT_EQ((*first)->tensors[0].spec, &plan.specs[0]);
}

// ---------------------------------------------------------------- alignment

// catches: rank sources accepted in the wrong order (payload index != TP rank, rule 8).
TEST(Aligner, CreateChecksRanks) {
  Plan plan = MustPlan(Shard(0));
  PlanReplay r0(&plan, 0), r1(&plan, 1);
  EXPECT_TRUE(Aligner::Create({&r0, &r1}).ok());
  auto swapped = Aligner::Create({&r1, &r0});
  ASSERT_FALSE(swapped.ok());
  EXPECT_EQ(swapped.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(swapped.status().message(), "engine rank 1")) << swapped.status().message();
  EXPECT_FALSE(Aligner::Create({}).ok());
  EXPECT_FALSE(Aligner::Create({&r0, nullptr}).ok());
}

// catches: lost or repeated tensors, global order broken, payload[r] taken
// from the wrong rank, specs not rank 0's, aligned batches that are not the
// common prefix.
TEST(Aligner, UnevenShardsKeepGlobalOrder) {
  std::vector<Plan> plans = {MustPlan(Shard(0)), MustPlan(Shard(1)), MustPlan(Shard(2))};
  // The test only means something if the ranks' batch boundaries differ.
  ASSERT_NE(BatchSizes(plans[0]), BatchSizes(plans[1]));
  ASSERT_NE(BatchSizes(plans[1]), BatchSizes(plans[2]));
  ASSERT_GT(plans[2].largest_chunked_tensor, 0u);

  std::vector<PlanReplay> replays;
  for (int r = 0; r < 3; ++r) replays.emplace_back(&plans[r], r);
  auto aligner = Aligner::Create({&replays[0], &replays[1], &replays[2]});
  ASSERT_TRUE(aligner.ok());
  std::size_t pos = 0;
  std::uint64_t seq = 0;
  for (;;) {
    auto b = aligner->next(Deadline::Never());
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    if (!b->has_value()) break;
    const AlignedBatch& ab = **b;
    EXPECT_EQ(ab.sequence, seq++);
    ASSERT_GE(ab.size(), 1u);
    ASSERT_EQ(ab.payload.size(), 3u);
    for (std::size_t i = 0; i < ab.size(); ++i, ++pos) {
      ASSERT_LT(pos, plans[0].specs.size());
      EXPECT_EQ(ab.specs[i], &plans[0].specs[pos]);
      for (int r = 0; r < 3; ++r) {
        ASSERT_EQ(ab.payload[r].size(), ab.size());
        EXPECT_EQ(ab.payload[r][i].spec, &plans[r].specs[pos]) << "rank " << r << " position " << pos;
      }
    }
  }
  EXPECT_EQ(pos, plans[0].specs.size());
  EXPECT_GT(seq, BatchSizes(plans[0]).size());  // cut finer than any single rank's batches
  auto after = aligner->next(Deadline::Never());
  ASSERT_TRUE(after.ok());
  EXPECT_FALSE(after->has_value());
}

// catches: the aligner pulling from a rank whose queue still holds tensors
// (rule 3), more than one pull per rank per call, a call that yields nothing
// without ending or failing (spin).
TEST(Aligner, PullsOnlyEmptyRanksOncePerCall) {
  std::vector<Plan> plans = {MustPlan(Shard(0)), MustPlan(Shard(1)), MustPlan(Shard(2))};
  std::vector<PlanReplay> replays;
  for (int r = 0; r < 3; ++r) replays.emplace_back(&plans[r], r);
  std::vector<CountingSource> counted;
  for (int r = 0; r < 3; ++r) counted.emplace_back(&replays[r]);
  auto aligner = Aligner::Create({&counted[0], &counted[1], &counted[2]});
  ASSERT_TRUE(aligner.ok());
  std::uint64_t yielded = 0;
  int calls = 0;
  for (;; ++calls) {
    ASSERT_LT(calls, 1000);
    std::vector<std::uint64_t> before = aligner->pulls();
    std::vector<std::uint64_t> queued;
    for (auto& c : counted) queued.push_back(c.delivered - yielded);
    std::vector<bool> ended;
    for (auto& c : counted) ended.push_back(c.ended);
    auto b = aligner->next(Deadline::Never());
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    for (int r = 0; r < 3; ++r) {
      const std::uint64_t pulled = aligner->pulls()[r] - before[r];
      const std::uint64_t want = (queued[r] == 0 && !ended[r]) ? 1 : 0;
      EXPECT_EQ(pulled, want) << "call " << calls << ", rank " << r << " had " << queued[r] << " queued";
    }
    if (!b->has_value()) break;
    ASSERT_GE((*b)->size(), 1u);
    yielded += (*b)->size();
  }
  EXPECT_EQ(yielded, plans[0].specs.size());
  for (int r = 0; r < 3; ++r) EXPECT_EQ(aligner->pulls()[r], BatchSizes(plans[r]).size() + 1) << "rank " << r;
}

// catches: rule 3 broken in any way that lets a consumed view outlive its
// buffer: e.g. the aligner pulling a new batch from every rank on each next()
// even if its queue is not empty; checks every payload byte when consumed.
TEST(Aligner, ViewsStayValidWithRotatingPoisonedBuffers) {
  std::vector<Plan> plans = {MustPlan(Shard(0, 60)), MustPlan(Shard(1, 60)), MustPlan(Shard(2, 60))};
  std::vector<std::unique_ptr<PoisoningSource>> sources;
  for (int r = 0; r < 3; ++r) sources.push_back(std::make_unique<PoisoningSource>(&plans[r], r));
  auto aligner = Aligner::Create({sources[0].get(), sources[1].get(), sources[2].get()});
  ASSERT_TRUE(aligner.ok());
  std::size_t tensors = 0;
  for (;;) {
    auto b = aligner->next(Deadline::Never());
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    if (!b->has_value()) break;
    const AlignedBatch& ab = **b;
    for (int r = 0; r < 3; ++r) {
      for (const TensorView& v : ab.payload[r]) {
        ASSERT_NE(v.data, nullptr);
        std::uint64_t bad = 0;
        for (std::uint64_t o = 0; o < v.spec->nbytes(); ++o)
          bad += v.data[o] != std::byte{ExpectedByte(r, v.spec->name, o)};
        ASSERT_EQ(bad, 0u) << "rank " << r << " tensor '" << v.spec->name << "' read " << bad
                           << " stale bytes in aligned batch " << ab.sequence;
      }
    }
    tensors += ab.size();
  }
  EXPECT_EQ(tensors, 60u);
  for (int r = 0; r < 3; ++r) EXPECT_GT(sources[r]->poisoned, 2) << "rank " << r << ": buffers never recycled";
}

// ---------------------------------------------------------------- rule 4 errors

// catches: a name mismatch not detected, or an error without position/ranks/names.
TEST(AlignerErrors, DifferentNames) {
  std::vector<std::vector<TensorSpec>> shards = {Shard(0), Shard(1), Shard(2)};
  shards[2][7].name = "intruder";
  std::vector<Plan> plans;
  for (auto& s : shards) plans.push_back(MustPlan(s));
  Drained d = DrainPlans(plans);
  ASSERT_FALSE(d.status.ok());
  EXPECT_EQ(d.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.status.message(), "engine ranks disagree at stream position 7: rank 0 has '" + shards[0][7].name +
                                    "' (float32), rank 2 has 'intruder' (float32)");
  std::size_t yielded = 0;
  for (auto& b : d.batches) yielded += b.size();
  EXPECT_LE(yielded, 7u);  // nothing at or past the mismatch was yielded
}

// catches: order differences missed (e.g. matching by name set instead of position).
TEST(AlignerErrors, DifferentOrder) {
  std::vector<std::vector<TensorSpec>> shards = {Shard(0), Shard(1), Shard(2)};
  std::swap(shards[1][4], shards[1][5]);
  std::vector<Plan> plans;
  for (auto& s : shards) plans.push_back(MustPlan(s));
  Drained d = DrainPlans(plans);
  ASSERT_FALSE(d.status.ok());
  EXPECT_EQ(d.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.status.message(), "engine ranks disagree at stream position 4: rank 0 has '" + shards[0][4].name +
                                    "' (bfloat16), rank 1 has '" + shards[0][5].name + "' (bfloat16)");
}

// catches: dtypes not compared (a silent promotion or reinterpretation, rule 5).
TEST(AlignerErrors, DifferentDType) {
  std::vector<std::vector<TensorSpec>> shards = {Shard(0), Shard(1), Shard(2)};
  shards[1][9].dtype = DType::kFloat16;
  std::vector<Plan> plans;
  for (auto& s : shards) plans.push_back(MustPlan(s));
  Drained d = DrainPlans(plans);
  ASSERT_FALSE(d.status.ok());
  EXPECT_EQ(d.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.status.message(), "engine ranks disagree at stream position 9: tensor '" + shards[0][9].name +
                                    "' is bfloat16 on rank 0 but float16 on rank 1");
}

// catches: a shorter stream silently truncating the refit (returning nullopt
// early), or an error naming the wrong ranks/tensors.
TEST(AlignerErrors, StreamsEndAtDifferentPoints) {
  std::vector<std::vector<TensorSpec>> shards = {Shard(0), Shard(1), Shard(2)};
  shards[1].resize(12);
  std::vector<Plan> plans;
  for (auto& s : shards) plans.push_back(MustPlan(s));
  Drained d = DrainPlans(plans);
  ASSERT_FALSE(d.status.ok());
  EXPECT_EQ(d.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.status.message(), "streams end at different points: engine rank 1 ended after 12 tensors (last '" +
                                    shards[0][11].name + "') while engine rank 0 still has '" + shards[0][12].name +
                                    "' at position 12");

  // Rank 0 is the short one.
  std::vector<std::vector<TensorSpec>> short0 = {Shard(0), Shard(1)};
  short0[0].resize(5);
  std::vector<Plan> plans0;
  for (auto& s : short0) plans0.push_back(MustPlan(s));
  Drained d0 = DrainPlans(plans0);
  ASSERT_FALSE(d0.status.ok());
  EXPECT_EQ(d0.status.message(), "streams end at different points: engine rank 0 ended after 5 tensors (last '" +
                                     short0[1][4].name + "') while engine rank 1 still has '" + short0[1][5].name +
                                     "' at position 5");
}

// catches: a source error returned without the rank, or swallowed as an end.
TEST(AlignerErrors, SourceErrorNamesTheRank) {
  Plan p0 = MustPlan(Shard(0)), p1 = MustPlan(Shard(1));
  PlanReplay r0(&p0, 0);
  ScriptedSource r1(&p1, 1, 1, [] { return StatusOr<std::optional<Batch>>(Unavailable("connection to trainer 3 closed")); });
  auto aligner = Aligner::Create({&r0, &r1});
  ASSERT_TRUE(aligner.ok());
  Drained d = Drain(*aligner);
  ASSERT_FALSE(d.status.ok());
  EXPECT_EQ(d.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(d.status.message(), "engine rank 1: connection to trainer 3 closed");
}

// catches: spinning (or looping forever) on a source that yields an empty batch.
TEST(AlignerErrors, EmptyBatchFailsInsteadOfSpinning) {
  Plan p0 = MustPlan(Shard(0)), p1 = MustPlan(Shard(1));
  PlanReplay r0(&p0, 0);
  ScriptedSource r1(&p1, 1, 0, [] { return StatusOr<std::optional<Batch>>(std::optional<Batch>(Batch{})); });
  auto aligner = Aligner::Create({&r0, &r1});
  ASSERT_TRUE(aligner.ok());
  auto b = aligner->next(Deadline::Never());
  ASSERT_FALSE(b.ok());
  EXPECT_TRUE(Contains(b.status().message(), "engine rank 1") && Contains(b.status().message(), "empty batch"))
      << b.status().message();
  EXPECT_EQ(aligner->pulls(), (std::vector<std::uint64_t>{1, 1}));
}

// ---------------------------------------------------------------- groups, schedule

// catches: groups not stable (stream order inside a group) or not in order of first appearance.
TEST(AlignedBatch, GroupsByDType) {
  TensorSpec a{"a", DType::kBFloat16, {1}}, b{"b", DType::kFloat32, {1}}, c{"c", DType::kBFloat16, {1}},
      d{"d", DType::kUInt8, {1}}, e{"e", DType::kFloat32, {1}};
  AlignedBatch ab;
  ab.specs = {&a, &b, &c, &d, &e};
  auto groups = ab.groups();
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].dtype, DType::kBFloat16);
  EXPECT_EQ(groups[0].indices, (std::vector<std::size_t>{0, 2}));
  EXPECT_EQ(groups[1].dtype, DType::kFloat32);
  EXPECT_EQ(groups[1].indices, (std::vector<std::size_t>{1, 4}));
  EXPECT_EQ(groups[2].dtype, DType::kUInt8);
  EXPECT_EQ(groups[2].indices, (std::vector<std::size_t>{3}));
  EXPECT_TRUE(AlignedBatch{}.groups().empty());
}

TensorSpec U8(std::string name, std::int64_t n) { return TensorSpec{std::move(name), DType::kUInt8, {n}}; }

// catches: a schedule that is not the common prefix (e.g. rank 0's batches), or
// errors lost at setup.
TEST(AlignedSchedule, UnevenPlans) {
  // rank 0: six tensors of 2048 B -> batches [2, 2, 2].
  Plan p0 = MustPlan({U8("t0", 2048), U8("t1", 2048), U8("t2", 2048), U8("t3", 2048), U8("t4", 2048), U8("t5", 2048)});
  // rank 1: 4096, 4 x 1024, 4096 -> batches [1, 4, 1].
  Plan p1 = MustPlan({U8("t0", 4096), U8("t1", 1024), U8("t2", 1024), U8("t3", 1024), U8("t4", 1024), U8("t5", 4096)});
  ASSERT_EQ(BatchSizes(p0), (std::vector<std::size_t>{2, 2, 2}));
  ASSERT_EQ(BatchSizes(p1), (std::vector<std::size_t>{1, 4, 1}));
  auto s = aligned_schedule({&p0, &p1});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(*s, (std::vector<std::size_t>{1, 1, 2, 1, 1}));

  auto alone = aligned_schedule({&p1});
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(*alone, (std::vector<std::size_t>{1, 4, 1}));

  Plan bad = MustPlan({U8("t0", 4096), U8("t1", 1024), U8("tX", 1024), U8("t3", 1024), U8("t4", 1024), U8("t5", 4096)});
  auto e = aligned_schedule({&p0, &bad});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(e.status().message(), "position 2: rank 0 has 't2' (uint8), rank 1 has 'tX' (uint8)"))
      << e.status().message();
  EXPECT_FALSE(aligned_schedule({}).ok());
  EXPECT_FALSE(aligned_schedule({&p0, nullptr}).ok());
}

}  // namespace
}  // namespace refit
