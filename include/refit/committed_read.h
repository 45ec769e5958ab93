// CommittedRead: one read of the bytes an engine rank serves (its last
// committed version), for EngineBinding::read_committed (engine_rank.h):
// delta refits decode over them, a relay parent sends them to an engine
// joining the job. A bucket's reads go in one call, so that an engine whose
// weights are device memory can copy them all in one launch instead of one
// synchronous copy each (a MoE bucket holds thousands of entries).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "refit/status.h"

namespace refit {

struct CommittedRead {
  std::uint32_t tensor = 0;  // an index into the rank's stream (the plan's specs)
  std::uint64_t offset = 0;  // the first byte of the tensor to read
  std::span<std::byte> out;  // out.size() bytes, in the weights' memory (host, or the weights' device)
};

// Performs every read; the bytes are in place when it returns OK.
using ReadCommitted = std::function<Status(std::span<const CommittedRead> reads)>;

}  // namespace refit
