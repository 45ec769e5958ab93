// Copy descriptors for packing shards: the same description drives the CPU
// path (memcpy) and the GPU path (one BatchedCopier launch per bucket).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cuda/batched_copy.h"
#include "refit/model.h"

namespace refit {

// Appends the runs that copy shard bytes [shard_begin, shard_begin + bytes) of
// rank `rank`'s shard of `weight`, read from the full tensor at `full`, to
// `dst` (contiguous). At most three runs: a partial first row, a 2-D block of
// whole rows, a partial last row (one 1-D run when the shard is contiguous).
void append_shard_copy_runs(const Weight& weight, int rank, int ranks, const std::byte* full,
                            std::uint64_t shard_begin, std::uint64_t bytes, std::byte* dst,
                            std::vector<CopyRun>* out);

// Executes runs with memcpy on this thread (host memory only).
void copy_runs_on_host(std::span<const CopyRun> runs);

}  // namespace refit
