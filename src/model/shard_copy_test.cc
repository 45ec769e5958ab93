// append_shard_copy_runs must describe exactly copy_shard_range's bytes for
// every rule, rank count and sub-range, in at most three runs.
#include "model/shard_copy.h"

#include <gtest/gtest.h>

#include <random>

namespace refit {
namespace {

// Catches: a wrong row stride or a dropped partial row in the 2-D runs (the
// GPU pack path uses these descriptors; the CPU reference is copy_shard_range).
TEST(ShardCopyRuns, EqualCopyShardRangeOnRandomRanges) {
  std::mt19937_64 rng(11);
  for (int iter = 0; iter < 300; ++iter) {
    Weight w;
    w.spec.name = "w";
    w.spec.dtype = (iter % 2) ? DType::kBFloat16 : DType::kFloat32;
    w.spec.shape = {static_cast<std::int64_t>(1 + rng() % 13), static_cast<std::int64_t>(1 + rng() % 17)};
    w.rule = static_cast<ShardRule>(rng() % 4);
    const int ranks = static_cast<int>(1 + rng() % 4);
    const int rank = static_cast<int>(rng() % ranks);
    std::vector<std::byte> full(w.spec.nbytes());
    for (auto& b : full) b = static_cast<std::byte>(rng());
    const std::uint64_t shard_bytes = shard_spec(w, rank, ranks).nbytes();
    if (shard_bytes == 0) continue;
    const std::uint64_t begin = rng() % shard_bytes;
    const std::uint64_t len = 1 + rng() % (shard_bytes - begin);
    std::vector<std::byte> want(len), got(len, std::byte{0xA5});
    copy_shard_range(w, rank, ranks, full.data(), begin, want);
    std::vector<CopyRun> runs;
    append_shard_copy_runs(w, rank, ranks, full.data(), begin, len, got.data(), &runs);
    EXPECT_LE(runs.size(), 3u);
    copy_runs_on_host(runs);
    ASSERT_EQ(got, want) << "iter " << iter << " rule " << static_cast<int>(w.rule) << " rank " << rank << "/"
                         << ranks << " range " << begin << "+" << len;
  }
}

}  // namespace
}  // namespace refit
