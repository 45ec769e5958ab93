// The sharded trainer's side of `--quantize` (issue 20; quant/fp8_part.h):
// an FSDP rank's rows of a weight need not start at a multiple of 128, so a
// 128-block can span two trainer ranks, and its scale needs the amax over
// the whole block. The view quantizes its rank's shards in two steps around
// the coordinator's amax exchange (control/amax_exchange.h), after "go":
//
//   shared_amax   the partial amax of every block this rank holds part but
//                 not all of (blocks it holds whole never travel), sent to
//                 the coordinator as an amax_share;
//   quantize_with the combined amax_table back: the codes of every local
//                 element, and the scales of the blocks whose first element
//                 this rank holds (each scale written by exactly one rank).
//
// Its model() is the engine's (quantize_model's: codes and scales in place
// of each selected weight), and its trainer_layouts() say where each part
// lies: a weight's codes have the weight's layout (one byte per element of
// the same box), its scales the weight's layout as a block table (layout.h
// BlockTable: a rank holds the scales of the blocks whose first element
// its box holds). The sharded plan cuts them as any other tensors, so the
// link carries the quantized bytes from the rank that made them.
//
// Host shards take the CPU reference (quant/fp8_part.h, threads over the
// weights); shards on a GPU the kernels of cuda/fp8_part.h, one launch per
// step for all of the rank's weights, their per-block amax through the
// host (a float per 128 x 128 block) for the exchange and the checks.
//
// Memory: one arena of this rank's codes and scales (about half its
// selected shards' bytes), allocated once in the shards' memory; on the GPU
// also a float per touched block and a word per weight.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "control/amax_exchange.h"
#include "control/control_client.h"
#include "refit/quantize.h"
#include "refit/status.h"
#include "refit/weight_source.h"

namespace refit {

// The two steps of a sharded rank's quantization (above). Call them once
// per refit, in order, after the source's prepare() and derive().
class AmaxExchangeSteps {
 public:
  virtual ~AmaxExchangeSteps() = default;
  // This rank's partial amax of every block it shares, ascending by
  // (tensor, block): tensor is the weight's index in the trainer's model,
  // block (m * block_rows + i) * block_cols + j. A NaN or Inf is refused
  // naming the tensor, the element and the version.
  virtual StatusOr<std::vector<AmaxEntry>> shared_amax(std::uint64_t version) = 0;
  // Quantizes with the combined table. kInvalidArgument, naming the tensor
  // and block, when the table lacks a block this rank shares or gives it an
  // amax below this rank's own (no combination of every holder's).
  virtual Status quantize_with(std::uint64_t version, const std::vector<AmaxEntry>& table) = 0;
};

// The view of trainer rank `rank`'s `shards` (a source whose
// trainer_layouts() are set) under `spec` for `engine_ranks` engine ranks.
// Errors: quantize_model's (naming the tensor).
StatusOr<std::unique_ptr<WeightSource>> with_sharded_quantization(std::unique_ptr<WeightSource> shards,
                                                                  const QuantizeSpec& spec, int engine_ranks,
                                                                  int rank);

// The steps of a view with_sharded_quantization made; null for any other
// source.
AmaxExchangeSteps* amax_exchange_steps(WeightSource& source);

// A trainer rank's derivation of refit `version` after "go": the source's
// derive(), then for a view with_sharded_quantization made the exchange:
// its shared_amax to the coordinator (an amax_share), the combined
// amax_table back by `deadline`, and quantize_with it. Errors name the
// refit.
Status derive_refit(WeightSource& source, ControlClient& client, std::uint64_t version, Deadline deadline);

}  // namespace refit
