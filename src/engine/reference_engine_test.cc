// Tests of the ReferenceEngine's contract: DESIGN.md rules 5, 6, 8 and 9.
// Each test names the engine mutation it catches (tried once, seen failing,
// reverted).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "refit/reference_engine.h"

namespace refit {
namespace {

// Owns the bytes and specs behind a hand-built AlignedBatch.
struct Fixture {
  // streams[r]: rank r's shard specs; shards are uneven (rank 0 gets more rows).
  std::vector<std::vector<TensorSpec>> streams;
  std::vector<std::vector<std::vector<std::byte>>> bytes;  // [rank][tensor]

  explicit Fixture(int ranks) {
    const std::vector<std::pair<std::string, DType>> names = {
        {"embed", DType::kBFloat16}, {"norm", DType::kFloat32}, {"q", DType::kBFloat16},
        {"scale", DType::kInt8},     {"o", DType::kFloat32},     {"k", DType::kInt8}};
    streams.resize(ranks);
    bytes.resize(ranks);
    for (int r = 0; r < ranks; ++r) {
      for (std::size_t i = 0; i < names.size(); ++i) {
        // 7 rows over the ranks, unevenly: rank 0 holds the remainder.
        const std::int64_t rows = 7 / ranks + (r < 7 % ranks ? 1 : 0);
        TensorSpec spec{names[i].first, names[i].second, {rows, 5}};
        streams[r].push_back(spec);
        std::vector<std::byte> b(spec.nbytes());
        for (std::size_t k = 0; k < b.size(); ++k) b[k] = std::byte((r * 131 + i * 17 + k * 7 + 1) & 0xff);
        bytes[r].push_back(std::move(b));
      }
    }
  }

  // An aligned batch of tensors [first, last), payload[r] = rank r's views;
  // `order` permutes the payload lists (order[r] = the rank whose views are
  // put at index r).
  AlignedBatch batch(std::size_t first, std::size_t last, std::vector<int> order = {}) {
    const int ranks = static_cast<int>(streams.size());
    if (order.empty()) {
      for (int r = 0; r < ranks; ++r) order.push_back(r);
    }
    AlignedBatch out;
    out.sequence = first;
    for (std::size_t i = first; i < last; ++i) out.specs.push_back(&streams[0][i]);
    out.payload.resize(ranks);
    for (int r = 0; r < ranks; ++r) {
      const int src = order[r];
      for (std::size_t i = first; i < last; ++i) {
        out.payload[r].push_back(TensorView{&streams[src][i], bytes[src][i].data(), MemoryKind::kHost, -1});
      }
    }
    return out;
  }
};

// Rule 5. Catches: one post per tensor (posts would be 6) or one per batch
// (posts would be 1).
TEST(ReferenceEngine, OnePostPerDTypeGroup) {
  Fixture f(2);
  ReferenceEngine engine(f.streams, {0, 1});
  ASSERT_TRUE(engine.begin(1).ok());
  AlignedBatch batch = f.batch(0, 6);
  ASSERT_EQ(batch.groups().size(), 3u);  // bfloat16, float32, int8
  for (const auto& g : batch.groups()) {
    for (std::size_t i : g.indices) EXPECT_EQ(batch.specs[i]->dtype, g.dtype);
  }
  Status s = engine.apply(batch);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(engine.stats().posts, 3u);
  EXPECT_EQ(engine.stats().tensors_applied, 12u);
  // A single-dtype batch is a single post.
  ASSERT_TRUE(engine.apply(f.batch(0, 1)).ok());
  EXPECT_EQ(engine.stats().posts, 4u);
  ASSERT_TRUE(engine.commit(1).ok());
}

// Rule 5: a post never promotes or mixes dtypes. Catches an engine that
// checks only rank 0's spec (batch.specs) and not each rank's payload dtype.
TEST(ReferenceEngine, RejectsPayloadWhoseDTypeDiffersFromItsPost) {
  Fixture f(1);
  ReferenceEngine engine(f.streams, {0});
  ASSERT_TRUE(engine.begin(1).ok());
  AlignedBatch batch = f.batch(0, 6);
  TensorSpec wrong = f.streams[0][3];  // "scale" int8
  wrong.dtype = DType::kFloat32;
  wrong.shape = {f.streams[0][3].shape[0], 5};
  batch.payload[0][3].spec = &wrong;
  Status s = engine.apply(batch);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("scale"), std::string::npos) << s.message();
  EXPECT_EQ(engine.stats().posts, 0u);
}

// Rule 6. Catches: bumping the version in apply() (version would be 1 or 2
// before commit) or bumping it in abort().
TEST(ReferenceEngine, VersionBumpsOncePerRefitAfterCommit) {
  Fixture f(2);
  ReferenceEngine engine(f.streams, {0, 1});
  EXPECT_EQ(engine.weight_version(), 0u);
  ASSERT_TRUE(engine.begin(1).ok());
  ASSERT_TRUE(engine.apply(f.batch(0, 2)).ok());
  EXPECT_EQ(engine.weight_version(), 0u);
  ASSERT_TRUE(engine.apply(f.batch(2, 6)).ok());
  EXPECT_EQ(engine.weight_version(), 0u);
  ASSERT_TRUE(engine.commit(1).ok());
  EXPECT_EQ(engine.weight_version(), 1u);
  EXPECT_TRUE(engine.weights_complete());

  // A failed refit keeps version 1 and reports the weights incomplete.
  ASSERT_TRUE(engine.begin(2).ok());
  ASSERT_TRUE(engine.apply(f.batch(0, 3)).ok());
  engine.abort(2, Aborted("trainer rank 0 died"));
  EXPECT_EQ(engine.weight_version(), 1u);
  EXPECT_FALSE(engine.weights_complete());
  EXPECT_FALSE(engine.commit(2).ok());  // no refit open any more
  EXPECT_EQ(engine.weight_version(), 1u);

  // The retry succeeds.
  ASSERT_TRUE(engine.begin(2).ok());
  ASSERT_TRUE(engine.apply(f.batch(0, 6)).ok());
  ASSERT_TRUE(engine.commit(2).ok());
  EXPECT_EQ(engine.weight_version(), 2u);
  EXPECT_TRUE(engine.weights_complete());
}

TEST(ReferenceEngine, ProtocolMisuseFails) {
  Fixture f(1);
  ReferenceEngine engine(f.streams, {0});
  EXPECT_EQ(engine.apply(f.batch(0, 1)).code(), StatusCode::kFailedPrecondition);  // before begin
  EXPECT_EQ(engine.commit(1).code(), StatusCode::kFailedPrecondition);             // without begin
  ASSERT_TRUE(engine.begin(1).ok());
  EXPECT_FALSE(engine.begin(1).ok());   // twice
  Status s = engine.commit(3);          // a different version
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("3"), std::string::npos);
  ASSERT_TRUE(engine.commit(1).ok());
  EXPECT_EQ(engine.apply(f.batch(0, 1)).code(), StatusCode::kFailedPrecondition);  // after commit
  EXPECT_FALSE(engine.begin(1).ok());   // does not advance the version
  EXPECT_EQ(engine.weight_version(), 1u);
}

// Rule 8: a transposed payload list with uneven shards fails, naming tensor
// and rank. Catches an engine that skips the per-rank shape check.
TEST(ReferenceEngine, TransposedPayloadFailsNamingTensorAndRank) {
  Fixture f(2);
  ReferenceEngine engine(f.streams, {0, 1});
  ASSERT_TRUE(engine.begin(1).ok());
  Status s = engine.apply(f.batch(0, 6, /*order=*/{1, 0}));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("'embed'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("rank 0"), std::string::npos) << s.message();
  EXPECT_EQ(engine.stats().posts, 0u);
  // Nothing was written.
  std::vector<std::byte> zeros(f.streams[0][0].nbytes());
  EXPECT_EQ(std::memcmp(engine.weight(0, "embed"), zeros.data(), zeros.size()), 0);
}

// Rule 8 with one process per engine rank: an engine hosting only rank 1 must
// take payload[1]. Catches an engine that indexes the payload by its hosted
// index (payload[0]) instead of by TP rank: the shape check fails on a good
// batch, and with even shards the bytes would be rank 0's.
TEST(ReferenceEngine, HostedRankTakesItsOwnPayload) {
  for (int ranks : {2, 7}) {  // 7 rows over 2 ranks: uneven; over 7: even
    Fixture f(ranks);
    ReferenceEngine engine(f.streams, {1});
    for (bool elsewhere_has_data : {true, false}) {
      const std::uint64_t version = elsewhere_has_data ? 1 : 2;
      ASSERT_TRUE(engine.begin(version).ok());
      AlignedBatch batch = f.batch(0, 6);
      if (!elsewhere_has_data) {
        for (auto& v : batch.payload[0]) v.data = nullptr;  // hosted elsewhere: ignored
      }
      Status s = engine.apply(batch);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_TRUE(engine.commit(version).ok());
      for (std::size_t i = 0; i < 6; ++i) {
        const TensorSpec& spec = f.streams[1][i];
        const std::byte* w = engine.weight(1, spec.name);
        ASSERT_NE(w, nullptr);
        EXPECT_EQ(std::memcmp(w, f.bytes[1][i].data(), spec.nbytes()), 0) << spec.name << " ranks=" << ranks;
      }
    }
    EXPECT_EQ(engine.weight(0, "embed"), nullptr);  // not hosted here
    EXPECT_EQ(engine.stats().tensors_applied, 12u);
  }
}

TEST(ReferenceEngine, ChecksNamesCountsAndBytes) {
  Fixture f(2);
  ReferenceEngine engine(f.streams, {0, 1});
  ASSERT_TRUE(engine.begin(1).ok());
  {
    AlignedBatch b = f.batch(0, 2);
    b.payload[1][1].spec = &f.streams[1][2];  // "q" where "norm" belongs
    Status s = engine.apply(b);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("'norm' on rank 1"), std::string::npos) << s.message();
  }
  {
    AlignedBatch b = f.batch(0, 2);
    b.payload.pop_back();
    EXPECT_EQ(engine.apply(b).code(), StatusCode::kFailedPrecondition);
  }
  {
    AlignedBatch b = f.batch(0, 2);
    b.payload[1][0].data = nullptr;  // hosted rank without bytes
    Status s = engine.apply(b);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("'embed' on hosted rank 1"), std::string::npos) << s.message();
  }
  EXPECT_EQ(engine.stats().posts, 0u);
  // The good batch lands on both ranks bit-exact.
  ASSERT_TRUE(engine.apply(f.batch(0, 6)).ok());
  for (int r = 0; r < 2; ++r) {
    for (std::size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(std::memcmp(engine.weight(r, f.streams[r][i].name), f.bytes[r][i].data(), f.bytes[r][i].size()), 0);
    }
  }
}

// Rule 9. Catches: a flush per apply (would be 3 after the first refit) or no
// flush at commit.
TEST(ReferenceEngine, OneCacheFlushPerCommit) {
  Fixture f(2);
  ReferenceEngine engine(f.streams, {0, 1});
  ASSERT_TRUE(engine.begin(1).ok());
  for (std::size_t i = 0; i < 6; i += 2) ASSERT_TRUE(engine.apply(f.batch(i, i + 2)).ok());
  EXPECT_EQ(engine.stats().cache_flushes, 0u);
  ASSERT_TRUE(engine.commit(1).ok());
  EXPECT_EQ(engine.stats().cache_flushes, 1u);
  ASSERT_TRUE(engine.begin(2).ok());
  ASSERT_TRUE(engine.apply(f.batch(0, 6)).ok());
  engine.abort(2, Aborted("test"));
  EXPECT_EQ(engine.stats().cache_flushes, 1u);  // an aborted refit flushes nothing here
  ASSERT_TRUE(engine.begin(2).ok());
  ASSERT_TRUE(engine.apply(f.batch(0, 6)).ok());
  ASSERT_TRUE(engine.commit(2).ok());
  EXPECT_EQ(engine.stats().cache_flushes, 2u);
  EXPECT_EQ(engine.stats().begins, 3u);
}

}  // namespace
}  // namespace refit
