// The amax exchange of sharded trainers under --quantize (issue 20;
// quant/fp8_part.h): after "go", every trainer rank sends the coordinator
// the partial amax of each 128-block it shares with another trainer rank
// (an AmaxShare), the coordinator combines them, and sends every trainer
// rank the combined amax of every shared block (an AmaxTable) before any
// rank quantizes. A block's combined amax is the maximum over the ranks that
// hold a part of it; max is exact, so the order of combining never matters.
//
// Thread safety: values and pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "refit/status.h"

namespace refit {

// One block's amax: the tensor's index in the trainer's model, the block's
// index in that tensor ((m * block_rows + i) * block_cols + j) and the fp32
// bits of the amax (finite and >= 0, so the bits order as the values do).
struct AmaxEntry {
  std::uint64_t tensor = 0;
  std::uint64_t block = 0;
  std::uint32_t bits = 0;
  friend bool operator==(const AmaxEntry&, const AmaxEntry&) = default;
};

// The largest fp32 bits of a finite amax >= 0 (FLT_MAX).
inline constexpr std::uint32_t kMaxAmaxBits = 0x7F7FFFFFu;

// The combined table: one entry per (tensor, block) that any share holds,
// with the largest bits any share gave it, ascending by (tensor, block).
// kInvalidArgument naming the share (its index in `shares`) for an entry
// whose bits are not a finite amax >= 0, or a (tensor, block) a share lists
// twice.
StatusOr<std::vector<AmaxEntry>> combine_amax(const std::vector<std::vector<AmaxEntry>>& shares);

}  // namespace refit
