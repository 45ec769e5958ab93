// The engine's verification of a refit (DESIGN.md rule 2): every byte of an
// engine rank's weights compared with what the refit must have delivered,
// either the synthetic content of a version or a checkpoint's bytes. The
// verify_* functions read the weights the refit landed
// (ReferenceEngine::landed_weight: with --shadow the arena not yet served).
#pragma once

#include <cstdint>
#include <vector>

#include "refit/checkpoint.h"
#include "refit/model.h"
#include "refit/quantize.h"
#include "refit/reference_engine.h"
#include "refit/status.h"
#include "runtime/model_choice.h"

namespace refit {

// What each weight of a model must hold after refit `refit`: that refit's
// content, or with partial refits (refit/partial.h) `each[i]`'s, the version
// of the last refit that moved weight i (one per model weight). `each`
// empty: every weight is the refit's.
struct WeightVersions {
  std::uint64_t refit = 0;
  std::vector<std::uint64_t> each;
  std::uint64_t of(std::size_t i) const { return each.empty() ? refit : each[i]; }
};

// Checks every byte of `rank`'s weights in `engine` (its shards of `model`
// over `ranks` ranks, on the device when `on_device`) against the content
// each must have after refit `versions.refit` for `seed`. DataLoss names the
// tensor, the byte and the version it must hold.
Status verify_synthetic(const Model& model, const ReferenceEngine& engine, int rank, int ranks, bool on_device,
                        const WeightVersions& versions, const ContentSeed& seed);

// A reader's check (--readers, runtime/weight_readers.h): whether weight
// `index` of `model` as `rank` serves it (ReferenceEngine::weight) holds
// the synthetic content of `version` for `seed`, every byte. Call it inside
// ReferenceEngine::read_active. An error only when it could not look (a
// device copy failed).
StatusOr<bool> served_weight_is_version(const Model& model, std::size_t index, const ReferenceEngine& engine,
                                        int rank, int ranks, bool on_device, std::uint64_t version,
                                        const ContentSeed& seed);

// served_weight_is_version for an FP8 engine (--quantize; arguments as
// verify_quantized's, without a checkpoint): whether weight `index` of
// `quantized.engine` as served holds what it must after refit `version`
// (codes and scales of the finite synthetic content, or the copied bytes).
StatusOr<bool> served_quantized_weight_is_version(const Model& unquantized, const QuantizedModel& quantized,
                                                  std::size_t index, const ReferenceEngine& engine, int rank,
                                                  int ranks, bool on_device, std::uint64_t version,
                                                  const ContentSeed& seed);

// Every weight of `rank` as served (ReferenceEngine::weight) holds the
// synthetic content of `version` for `seed`: DataLoss names the first that
// does not. What a shadow engine checks after a failed refit.
Status verify_served_synthetic(const Model& model, const ReferenceEngine& engine, int rank, int ranks,
                               bool on_device, const WeightVersions& versions, const ContentSeed& seed);

// Checks every byte of `rank`'s weights against its shard of the checkpoint's
// tensors (the bytes a push of that checkpoint must deliver). DataLoss names
// the tensor, the file and the byte.
Status verify_checkpoint(const Model& model, const Checkpoint& checkpoint, const ReferenceEngine& engine, int rank,
                         int ranks, bool on_device, std::uint64_t version);

// Checks every byte of an FP8 engine rank's weights (--quantize):
// `quantized` is quantize_model's result for `unquantized`. Each weight is
// compared with what it must hold of its source tensor's expected full
// bytes (the synthetic content of `version` for `seed`, made finite where
// quantized, content.h; or, with a checkpoint, the file's bytes): copies
// cut as the pack cuts them, codes and scales by quantized_shard_range
// (quant/fp8_shard.h, the CPU reference the trainer's GPU kernel equals
// bit for bit). Tensors are checked on a few host threads. DataLoss names
// the tensor and the byte; a NaN or Inf in a checkpoint's tensor its
// refusal.
Status verify_quantized(const Model& unquantized, const QuantizedModel& quantized, const Checkpoint* checkpoint,
                        const ReferenceEngine& engine, int rank, int ranks, bool on_device, std::uint64_t version,
                        const ContentSeed& seed);

// The check of an engine that verifies (EngineOptions::verify), as its
// model calls for: verify_quantized, verify_checkpoint or verify_synthetic.
Status verify_engine_weights(const ModelChoice& choice, const ReferenceEngine& engine, int rank, int ranks,
                             bool on_device, const WeightVersions& versions, const ContentSeed& seed);

}  // namespace refit
