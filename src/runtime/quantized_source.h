// The trainer's side of `--quantize` (refit/quantize.h, issue 20): the
// engine holds some weights as FP8 codes with block scales, so the trainer
// sees its source through the engine's model (quantize_model's) and sends
// codes and scales, never the bf16 bytes: the link carries the quantized
// bytes.
//
// Each refit, after the coordinator's "go" (derive(), so that the refit's
// time includes it), every selected weight is quantized whole on the
// source's side: on its GPU by the kernel
// (cuda/fp8_block.h, every tensor in one batched launch), on the host by
// the CPU reference (quant/fp8_block.h, tensors spread over a few threads).
// The two are bit-identical (their tests), and an engine rank's shard of
// the whole tensor's codes and scales is exactly its shard's quantization
// (quantize_model refuses splits that cut a 128-block), so the senders cut
// shards out of the quantized tensors as out of any other.
//
// A NaN or Inf in a selected weight fails prepare() naming the tensor, the
// element and the version; nothing of that refit is sent.
//
// Memory: one arena of every selected weight's codes and scales (about half
// the bf16 bytes they come from), on the source's device, allocated once;
// on the host its range is stable, so a trainer feeding device engines
// registers it with the rest of the source.
#pragma once

#include <memory>
#include <optional>

#include "refit/quantize.h"
#include "refit/roles.h"
#include "refit/status.h"
#include "refit/weight_source.h"

namespace refit {

// `source` itself for --quantize none; else a view whose model() is
// quantize_model(source->model(), spec, engine_ranks).engine and whose
// data(i) is the source's tensor (a copy), or the codes or scales of the
// source's tensor it stands for. A source of shards (a sharded trainer
// rank) gets with_sharded_quantization's view (runtime/quantized_shards.h)
// for trainers that name their tensors as the engine does (Megatron names:
// refused, not built). Errors: parse_quantize's and quantize_model's
// (naming the tensor), and the allocation of the arena.
StatusOr<std::unique_ptr<WeightSource>> with_quantization(std::unique_ptr<WeightSource> source,
                                                          const RankOptions& options);

// For the device-direct sender (senders/device_direct_sender.cc), which
// quantizes each engine rank's shard on the device straight into the
// engine's weights (one kernel per tensor writing its codes and scales:
// the bf16 bytes are read once and nothing is copied twice), instead of
// copying the codes and scales derive() would compute: the view's engine
// model and the source its bf16 bytes come from (data(source) full
// tensors). Taking them tells the view that derive() has nothing to
// compute any more; empty when `source` is no --quantize view. Call it
// once, at setup, before the first refit.
struct QuantizedOrigin {
  const QuantizedModel* quantized = nullptr;
  const WeightSource* unquantized = nullptr;
};
std::optional<QuantizedOrigin> take_quantization(const WeightSource& source);

// The same for a parsed spec and `engine_ranks`, full sources only (a
// source of shards is refused: its view needs the rank).
StatusOr<std::unique_ptr<WeightSource>> with_quantization(std::unique_ptr<WeightSource> source,
                                                          const QuantizeSpec& spec, int engine_ranks);

}  // namespace refit
