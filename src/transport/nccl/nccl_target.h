// The nccl transport's target side: the engine's device memory (a receive
// pool, or exposed weights) that one trainer rank writes through a 2-rank
// communicator; each payload-less kData frame announces a write, which
// receive_data turns into the matching ncclRecv. Private to
// src/transport/nccl; built only with NCCL.
#pragma once

#if REFIT_HAVE_NCCL

#include <cstdint>
#include <memory>
#include <string>

#include "cuda/device.h"
#include "refit/status.h"
#include "transport/transport.h"

namespace refit::nccl_internal {

// Makes the target's unique id (and with it NCCL's bootstrap listener in
// this process) and its descriptor. `pool`: a device allocation the target
// frees (empty for exposed memory, which the caller owns); `whose` names the
// target in errors.
StatusOr<std::unique_ptr<TargetMemory>> make_nccl_target(const std::string& whose, int device, DeviceBuffer pool,
                                                         std::byte* base, int slots, std::uint64_t slot_bytes);

}  // namespace refit::nccl_internal

#endif  // REFIT_HAVE_NCCL
