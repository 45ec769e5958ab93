// Checks of a mapped transfer plan (mapped_transfer_plan.h) the tests
// share: executed on real bytes against the hand conversion of a
// MappedCase (mapped_case.h), and the header's shape of its runs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "refit/plan.h"
#include "refit/transfer_plan.h"
#include "testing/mapped_case.h"
#include "testing/status_matchers.h"

namespace refit::testing {

// Applies every run of `plan` to empty engine shards, reading the trainer
// shards cut from the hand conversion's trainer tensors; checks that each
// piece reads inside its trainer rank's shard of src_tensor and writes
// inside the engine rank's shard of tensor, that every engine byte is
// written exactly once, and that the engine shards equal those cut from the
// hand conversion's engine tensors. The model's values are distinct, so a
// match also says each byte came from a trainer rank holding that element.
inline void ExpectMovesTheHandConversion(const MappedCase& mc, const TransferPlan& plan) {
  const Shards src = cut_shards(plan.trainer_tensors, plan.trainer_ranks, mc.trainer);
  const Shards want = cut_shards(plan.engine_tensors, plan.engine_ranks, mc.engine);
  Shards got = empty_like(want);
  Shards writes = empty_like(want);  // per byte: times written
  for (const TransferPair& p : plan.pairs) {
    for (const TransferRun& run : p.runs) {
      ASSERT_LT(run.tensor, plan.engine_tensors.size());
      ASSERT_LT(run.src_tensor, plan.trainer_tensors.size());
      const std::uint64_t elem = dtype_size(plan.engine_tensors[run.tensor].spec.dtype);
      const auto& from = src[static_cast<std::size_t>(p.trainer_rank)][run.src_tensor];
      auto& to = got[static_cast<std::size_t>(p.engine_rank)][run.tensor];
      auto& count = writes[static_cast<std::size_t>(p.engine_rank)][run.tensor];
      for (const TransferRun& piece : contiguous_pieces(run)) {
        ASSERT_LE(piece.src_offset + piece.bytes, from.size()) << "trainer " << p.trainer_rank << " reads outside";
        ASSERT_LE(piece.dst_offset + piece.bytes, to.size()) << "engine " << p.engine_rank << " written outside";
        ASSERT_EQ(piece.src_offset % elem, 0u);
        ASSERT_EQ(piece.dst_offset % elem, 0u);
        std::copy_n(from.begin() + static_cast<std::ptrdiff_t>(piece.src_offset), piece.bytes,
                    to.begin() + static_cast<std::ptrdiff_t>(piece.dst_offset));
        for (std::uint64_t b = 0; b < piece.bytes; ++b) ++count[piece.dst_offset + b];
      }
    }
  }
  for (int e = 0; e < plan.engine_ranks; ++e) {
    for (std::size_t i = 0; i < plan.engine_tensors.size(); ++i) {
      const auto& w = writes[static_cast<std::size_t>(e)][i];
      const auto twice = std::find_if(w.begin(), w.end(), [](std::uint8_t c) { return c != 1; });
      ASSERT_EQ(twice, w.end()) << plan.engine_tensors[i].spec.name << " engine rank " << e << ": byte "
                                << (twice - w.begin()) << " written " << int{*twice} << " times";
      ASSERT_EQ(got[static_cast<std::size_t>(e)][i], want[static_cast<std::size_t>(e)][i])
          << plan.engine_tensors[i].spec.name << " engine rank " << e << " ("
          << plan.engine_tensors[i].layout.ToString() << ") differs from the hand conversion";
    }
  }
}

// The header's shape of the runs: each pair's pieces ordered by engine
// tensor, then dst offset; no two pieces in a row continue each other on
// both sides; contiguous runs have no strides; bytes add up; pair streams
// name the engine tensors and make bucket plans.
inline void ExpectRunsInOrderAndMaximal(const TransferPlan& plan) {
  std::uint64_t total = 0;
  for (const SideTensor& t : plan.engine_tensors) {
    for (int e = 0; e < plan.engine_ranks; ++e) total += local_spec(t.spec, t.layout, e).value().nbytes();
  }
  EXPECT_EQ(plan.total_bytes, total);
  for (const TransferPair& p : plan.pairs) {
    std::uint64_t bytes = 0;
    std::vector<TransferRun> pieces;
    for (const TransferRun& run : p.runs) {
      bytes += run.total_bytes();
      ASSERT_GE(run.count, 1u);
      if (run.count == 1) {
        EXPECT_EQ(run.src_stride + run.dst_stride, 0u) << "a contiguous run has strides";
      }
      const std::vector<TransferRun> more = contiguous_pieces(run);
      pieces.insert(pieces.end(), more.begin(), more.end());
    }
    EXPECT_EQ(p.bytes, bytes);
    for (std::size_t k = 1; k < pieces.size(); ++k) {
      const TransferRun& a = pieces[k - 1];
      const TransferRun& b = pieces[k];
      ASSERT_TRUE(a.tensor < b.tensor || (a.tensor == b.tensor && a.dst_offset + a.bytes <= b.dst_offset))
          << "pieces " << k - 1 << " and " << k << " of pair " << p.trainer_rank << "->" << p.engine_rank
          << " out of order";
      ASSERT_FALSE(a.tensor == b.tensor && a.src_tensor == b.src_tensor && a.src_offset + a.bytes == b.src_offset &&
                   a.dst_offset + a.bytes == b.dst_offset)
          << "pieces " << k - 1 << " and " << k << " of pair " << p.trainer_rank << "->" << p.engine_rank
          << " should be one";
    }
  }
  for (const PairStream& s : pair_streams(plan)) {
    for (const PairStreamEntry& entry : s.entries) {
      EXPECT_EQ(entry.spec.name, plan.engine_tensors[entry.runs.front().tensor].spec.name);
    }
    EXPECT_OK(make_plan(s.specs(), kMinBucketSize));
  }
}

}  // namespace refit::testing
