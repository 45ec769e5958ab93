#include <cstring>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "refit/model.h"

namespace refit {
namespace {

Weight make_weight(std::vector<std::int64_t> shape, ShardRule rule, DType dtype = DType::kBFloat16) {
  return Weight{TensorSpec{"w", dtype, std::move(shape)}, rule};
}

// Reference: the full-tensor byte offset of every shard byte, in shard order,
// by walking the shard's elements in C order (independent of the run logic).
std::vector<std::uint64_t> reference_offsets(const Weight& w, int rank, int ranks) {
  const ShardSlice s = shard_slice(w, rank, ranks);
  const TensorSpec shard = shard_spec(w, rank, ranks);
  const std::uint64_t elem = dtype_size(w.spec.dtype);
  const std::size_t nd = w.spec.shape.size();
  std::vector<std::uint64_t> out;
  std::vector<std::int64_t> idx(nd, 0);
  for (std::int64_t e = 0; e < shard.numel(); ++e) {
    std::int64_t rem = e;
    for (std::size_t d = nd; d-- > 0;) {
      idx[d] = rem % shard.shape[d];
      rem /= shard.shape[d];
    }
    if (s.dim >= 0) idx[static_cast<std::size_t>(s.dim)] += s.begin;
    std::uint64_t flat = 0;
    for (std::size_t d = 0; d < nd; ++d) flat = flat * static_cast<std::uint64_t>(w.spec.shape[d]) + static_cast<std::uint64_t>(idx[d]);
    for (std::uint64_t b = 0; b < elem; ++b) out.push_back(flat * elem + b);
  }
  return out;
}

std::vector<std::uint64_t> run_offsets(const Weight& w, int rank, int ranks) {
  std::vector<std::uint64_t> out;
  std::uint64_t expect_shard = 0;
  for_each_shard_run(w, rank, ranks, [&](std::uint64_t full, std::uint64_t shard, std::uint64_t bytes) {
    EXPECT_EQ(shard, expect_shard) << "runs must come in shard order, back to back";
    expect_shard += bytes;
    for (std::uint64_t b = 0; b < bytes; ++b) out.push_back(full + b);
  });
  return out;
}

// Catches: an even split that drops D % N (ranks sum short), remainder given
// to the last rank instead of the first, begin not after the previous ranks.
TEST(ShardingTest, UnevenSplitsAreContiguousAndSumToTheDimension) {
  for (std::int64_t dim : {1, 2, 3, 7, 10, 64, 1000, 16000}) {
    for (int ranks = 1; ranks <= 9; ++ranks) {
      const Weight w = make_weight({dim, 3}, ShardRule::kColumn);
      std::int64_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        const ShardSlice s = shard_slice(w, r, ranks);
        EXPECT_EQ(s.dim, 0);
        EXPECT_EQ(s.begin, next) << dim << " over " << ranks << " rank " << r;
        EXPECT_EQ(s.end - s.begin, dim / ranks + (r < dim % ranks ? 1 : 0)) << dim << " over " << ranks;
        next = s.end;
      }
      EXPECT_EQ(next, dim);
    }
  }
  // Examples by hand: 10 over 3 is 4, 3, 3; 2 over 5 is 1, 1, 0, 0, 0.
  const Weight w10 = make_weight({10, 2}, ShardRule::kVocab);
  EXPECT_EQ(shard_slice(w10, 0, 3).end, 4);
  EXPECT_EQ(shard_slice(w10, 1, 3).begin, 4);
  EXPECT_EQ(shard_slice(w10, 2, 3).begin, 7);
  const Weight w2 = make_weight({2, 2}, ShardRule::kColumn);
  EXPECT_EQ(shard_spec(w2, 1, 5).shape, (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(shard_spec(w2, 4, 5).shape, (std::vector<std::int64_t>{0, 2}));
  EXPECT_EQ(shard_spec(w2, 4, 5).nbytes(), 0u);
}

// Catches: kRow splitting dim 0, kColumn splitting dim 1, replicated being split.
TEST(ShardingTest, RulesPickTheDimension) {
  EXPECT_EQ(shard_spec(make_weight({6, 9}, ShardRule::kColumn), 0, 3).shape, (std::vector<std::int64_t>{2, 9}));
  EXPECT_EQ(shard_spec(make_weight({6, 9}, ShardRule::kVocab), 0, 3).shape, (std::vector<std::int64_t>{2, 9}));
  EXPECT_EQ(shard_spec(make_weight({6, 9}, ShardRule::kRow), 0, 3).shape, (std::vector<std::int64_t>{6, 3}));
  EXPECT_EQ(shard_spec(make_weight({6, 9}, ShardRule::kReplicated), 2, 3).shape, (std::vector<std::int64_t>{6, 9}));
  EXPECT_EQ(shard_slice(make_weight({6, 9}, ShardRule::kReplicated), 2, 3).dim, -1);
  const TensorSpec s = shard_spec(make_weight({6, 9}, ShardRule::kRow, DType::kFloat32), 1, 2);
  EXPECT_EQ(s.name, "w");
  EXPECT_EQ(s.dtype, DType::kFloat32);
}

// Uneven shards make the ranks' streams differ in size, so the plan's bucket
// boundaries differ per rank (DESIGN rule 4). Catches: even splits that round down.
TEST(ShardingTest, TinyOverThreeRanksGivesStreamsOfDifferentSizes) {
  StatusOr<Model> m = make_model("tiny", -1);
  ASSERT_TRUE(m.ok());
  std::set<std::uint64_t> sizes;
  std::uint64_t replicated = 0;
  for (const Weight& w : m->weights) {
    if (w.rule == ShardRule::kReplicated) replicated += w.spec.nbytes();
  }
  std::uint64_t sum = 0;
  for (int r = 0; r < 3; ++r) {
    const std::vector<TensorSpec> stream = engine_stream(*m, r, 3);
    ASSERT_EQ(stream.size(), m->weights.size());
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; i < stream.size(); ++i) {
      EXPECT_EQ(stream[i].name, m->weights[i].spec.name);
      bytes += stream[i].nbytes();
    }
    sizes.insert(bytes);
    sum += bytes;
  }
  EXPECT_EQ(sizes.size(), 3u);
  // Split bytes add up to the full model; replicated ones count once per rank.
  EXPECT_EQ(sum, m->total_bytes() + 2 * replicated);
}

// Catches: a wrong run stride for dim-1 splits, runs of the wrong size, runs
// out of order, a replicated tensor reported as many runs.
TEST(ShardingTest, RunsCoverExactlyTheShardBytesForEachRule) {
  const struct {
    Weight w;
    int ranks;
  } cases[] = {
      {make_weight({7, 5}, ShardRule::kColumn), 3},
      {make_weight({7, 5}, ShardRule::kVocab), 4},
      {make_weight({7, 5}, ShardRule::kRow), 3},
      {make_weight({3, 10, 2}, ShardRule::kRow, DType::kFloat32), 4},
      {make_weight({2, 3, 4}, ShardRule::kColumn, DType::kInt8), 5},
      {make_weight({9}, ShardRule::kReplicated, DType::kFloat32), 3},
      {make_weight({4, 6}, ShardRule::kReplicated), 2},
      {make_weight({2, 3}, ShardRule::kRow), 5},  // ranks 3 and 4 get 0 columns
  };
  for (const auto& c : cases) {
    for (int r = 0; r < c.ranks; ++r) {
      SCOPED_TRACE(c.w.spec.ToString() + " rank " + std::to_string(r) + "/" + std::to_string(c.ranks));
      const std::vector<std::uint64_t> got = run_offsets(c.w, r, c.ranks);
      EXPECT_EQ(got, reference_offsets(c.w, r, c.ranks));
      EXPECT_EQ(got.size(), shard_spec(c.w, r, c.ranks).nbytes());
    }
  }
  // Run counts: one for dim-0 and replicated, one per row for dim 1.
  int runs = 0;
  for_each_shard_run(make_weight({7, 5}, ShardRule::kRow), 1, 3, [&](auto, auto, std::uint64_t b) {
    ++runs;
    EXPECT_EQ(b, 2u * 2u);  // 2 columns of bf16
  });
  EXPECT_EQ(runs, 7);
  runs = 0;
  for_each_shard_run(make_weight({7, 5}, ShardRule::kColumn), 1, 3, [&](auto, auto, auto) { ++runs; });
  EXPECT_EQ(runs, 1);
  runs = 0;
  for_each_shard_run(make_weight({7, 5}, ShardRule::kReplicated), 1, 3, [&](auto full, auto, std::uint64_t b) {
    ++runs;
    EXPECT_EQ(full, 0u);
    EXPECT_EQ(b, 70u);
  });
  EXPECT_EQ(runs, 1);
}

DType random_dtype(std::mt19937_64& rng) {
  const DType choices[] = {DType::kUInt8, DType::kBFloat16, DType::kFloat32, DType::kInt64};
  return choices[rng() % 4];
}

// Property: for random shapes, rules and 1..5 ranks, writing every rank's
// shard back through its runs rebuilds the full tensor, each byte exactly
// once (replicated: every rank's copy equals the full tensor); and
// copy_shard_range of any sub-range equals that slice of the whole shard.
// Catches: overlapping or missing runs, a wrong clip at either end of a
// sub-range, a wrong run index for a sub-range starting mid-run.
TEST(ShardingTest, ReassemblingAllShardsGivesTheFullTensor) {
  std::mt19937_64 rng(12345);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<std::int64_t> shape(1 + rng() % 4);
    for (auto& d : shape) d = static_cast<std::int64_t>(1 + rng() % 9);
    ShardRule rule = static_cast<ShardRule>(rng() % 4);
    if (rule == ShardRule::kRow && shape.size() < 2) rule = ShardRule::kColumn;  // 1-D kRow is invalid
    const Weight w = make_weight(shape, rule, random_dtype(rng));
    const int ranks = 1 + static_cast<int>(rng() % 5);
    SCOPED_TRACE(w.spec.ToString() + " rule " + std::to_string(static_cast<int>(rule)) + " ranks " +
                 std::to_string(ranks));

    const std::uint64_t n = w.spec.nbytes();
    std::vector<std::byte> full(n);
    for (auto& b : full) b = static_cast<std::byte>(rng());
    std::vector<std::byte> rebuilt(n, std::byte{0});
    std::vector<int> writes(n, 0);

    for (int r = 0; r < ranks; ++r) {
      const std::uint64_t shard_bytes = shard_spec(w, r, ranks).nbytes();
      std::vector<std::byte> shard(shard_bytes);
      copy_shard_range(w, r, ranks, full.data(), 0, shard);
      std::uint64_t covered = 0;
      for_each_shard_run(w, r, ranks, [&](std::uint64_t fo, std::uint64_t so, std::uint64_t bytes) {
        ASSERT_LE(fo + bytes, n);
        ASSERT_LE(so + bytes, shard_bytes);
        std::memcpy(rebuilt.data() + fo, shard.data() + so, bytes);
        for (std::uint64_t b = 0; b < bytes; ++b) ++writes[fo + b];
        covered += bytes;
      });
      EXPECT_EQ(covered, shard_bytes);
      if (rule == ShardRule::kReplicated) {
        EXPECT_EQ(shard, full);
      }

      // Sub-ranges of the shard, including empty ones and ones crossing runs.
      for (int k = 0; k < 8 && shard_bytes > 0; ++k) {
        const std::uint64_t a = rng() % (shard_bytes + 1);
        const std::uint64_t b = a + rng() % (shard_bytes - a + 1);
        std::vector<std::byte> part(b - a, std::byte{0xEE});
        copy_shard_range(w, r, ranks, full.data(), a, part);
        EXPECT_TRUE(std::equal(part.begin(), part.end(), shard.begin() + static_cast<std::ptrdiff_t>(a)))
            << "range [" << a << ", " << b << ") of " << shard_bytes;
      }
    }
    EXPECT_EQ(rebuilt, full);
    const int want = rule == ShardRule::kReplicated ? ranks : 1;
    for (std::uint64_t i = 0; i < n; ++i) {
      ASSERT_EQ(writes[i], want) << "byte " << i;
    }
  }
}

// Every byte of every sub-range of a small row-split shard, exhaustively.
TEST(ShardingTest, CopyShardRangeEverySubRange) {
  const Weight w = make_weight({4, 7, 3}, ShardRule::kRow, DType::kInt16);
  std::vector<std::byte> full(w.spec.nbytes());
  for (std::size_t i = 0; i < full.size(); ++i) full[i] = static_cast<std::byte>(i * 7 + 1);
  for (int r = 0; r < 3; ++r) {
    const std::uint64_t n = shard_spec(w, r, 3).nbytes();
    std::vector<std::byte> whole(n);
    copy_shard_range(w, r, 3, full.data(), 0, whole);
    const std::vector<std::uint64_t> ref = reference_offsets(w, r, 3);
    for (std::uint64_t i = 0; i < n; ++i) ASSERT_EQ(whole[i], full[ref[i]]) << i;
    for (std::uint64_t a = 0; a <= n; ++a) {
      for (std::uint64_t b = a; b <= n; ++b) {
        std::vector<std::byte> part(b - a);
        copy_shard_range(w, r, 3, full.data(), a, part);
        ASSERT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + static_cast<std::ptrdiff_t>(a)))
            << "rank " << r << " [" << a << ", " << b << ")";
      }
    }
  }
}

}  // namespace
}  // namespace refit
