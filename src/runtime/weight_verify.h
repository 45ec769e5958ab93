// The engine's verification of a refit (DESIGN.md rule 2): every byte of an
// engine rank's weights compared with what the refit must have delivered,
// either the synthetic content of a version or a checkpoint's bytes.
#pragma once

#include <cstdint>

#include "refit/checkpoint.h"
#include "refit/model.h"
#include "refit/reference_engine.h"
#include "refit/status.h"

namespace refit {

// Checks every byte of `rank`'s weights in `engine` (its shards of `model`
// over `ranks` ranks, on the device when `on_device`) against the content
// `version` must have for `seed`. DataLoss names the tensor and the byte.
Status verify_synthetic(const Model& model, const ReferenceEngine& engine, int rank, int ranks, bool on_device,
                        std::uint64_t version, std::uint64_t seed);

// Checks every byte of `rank`'s weights against its shard of the checkpoint's
// tensors (the bytes a push of that checkpoint must deliver). DataLoss names
// the tensor, the file and the byte.
Status verify_checkpoint(const Model& model, const Checkpoint& checkpoint, const ReferenceEngine& engine, int rank,
                         int ranks, bool on_device, std::uint64_t version);

}  // namespace refit
