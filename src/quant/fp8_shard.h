// The bytes an engine rank holds of an FP8 block-quantized weight (issue 20):
// its shard of the codes or of the scales (refit/quantize.h's engine model),
// computed from the trainer's full bf16 or fp32 tensor with the format's
// CPU reference (quant/fp8_block.h). A trainer's pack writes these bytes
// and an engine verifies against them: both sides call this one function.
//
// The shard follows the weight's TP rule: rows (or columns, or whole
// experts) of the full tensor. quantize_model refuses splits that cut a
// 128-block, so a shard's blocks are whole blocks of the full tensor and
// its codes and scales equal the full tensor's, cut by the same rule.
//
// Any byte range may be asked for (a bucket of the engine's stream may end
// inside a row or a scale): the block rows it touches are quantized whole
// (across the shard's columns), and the range is copied out of them.
//
// Thread safety: a pure function over memory the caller owns.
#pragma once

#include <cstdint>
#include <span>

#include "quant/fp8_block.h"
#include "refit/model.h"
#include "refit/quantize.h"
#include "refit/status.h"

namespace refit {

// Bytes [begin, begin + out.size()) of engine rank `rank`'s (of `ranks`)
// shard of `part` (kCodes or kScales) of trainer weight `source` (full
// spec, bf16 or fp32, [R, C] or [E, R, C]; its rule and expert fields are
// the engine's), from `full`, the source's full C-order bytes. Errors
// (kInvalidArgument, naming the tensor): part kCopy, a source the format
// cannot take, a split that cuts a block, a range past the shard's end, and
// a NaN or Inf in the blocks it quantizes (check_fp8_finite's message, with
// `version`).
Status quantized_shard_range(const Weight& source, int rank, int ranks, QuantPart part, const std::byte* full,
                             std::uint64_t begin, std::span<std::byte> out, std::uint64_t version);

// Engine rank `rank`'s shard of `source` as a box of its full tensor: the
// blocks a pack quantizes (quantize_fp8_block_device writes a box's codes
// and scales dense, exactly as the shard holds them). Errors
// (kInvalidArgument, naming the tensor): a source the format cannot take, a
// split that cuts a block.
StatusOr<Fp8Box> quantized_shard_box(const Weight& source, int rank, int ranks);

// The full C-order tensor of `spec` (bf16 or fp32, [R, C] or [E, R, C]) at
// `full`, host or device memory, as the format reads it.
Fp8Source full_fp8_source(const TensorSpec& spec, const std::byte* full);

// The byte size of that shard (codes: its elements; scales: 4 per block).
// REQUIRES: fp8_block_specs(source.spec) is OK.
std::uint64_t quantized_shard_bytes(const Weight& source, int rank, int ranks, QuantPart part);

}  // namespace refit
