// The tests' per-bucket fault injections on a trainer rank (roles.h:
// --debug-die-after-announce, --debug-stop-after-bucket, --debug-fail-refit,
// --debug-cuda-fault-refit), around the send of one bucket (a full-weight
// trainer, trainer_rank.cc) or of a sharded rank's part of one
// (shard_channel.h). Nothing happens unless a flag names the refit.
#pragma once

#include <cstdint>
#include <string>

#include "cuda/device.h"
#include "refit/roles.h"
#include "refit/status.h"

namespace refit {

// Before the send: with --debug-die-after-announce of `version` and device
// copies (`stream`), a 30 s GPU delay queued first; true: die after the send.
StatusOr<bool> before_bucket_faults(const RankOptions& options, std::uint64_t version, CudaStream* stream);

// After the send of `what` ("bucket 3 of refit 2"): die by SIGKILL (`die`),
// stop by SIGSTOP (--debug-stop-after-bucket, on the bucket `stop_here`
// says; its log line is the tests' proof that the refit is under way), fail
// (--debug-fail-refit), or a CUDA fault on `stream` (--debug-cuda-fault-refit).
Status after_bucket_faults(const RankOptions& options, const std::string& name, std::uint64_t version,
                           const std::string& what, bool die, bool stop_here, CudaStream* stream);

}  // namespace refit
