// `--quantize`: the conversions an engine declares (issue 20). A trainer
// holds bf16 (or fp32) weights; the engine holds some of them as FP8 codes
// with block scales, in the format of src/quant/fp8_block.h (DeepSeek-V3's
// and Qwen3-FP8's checkpoints): `<prefix>.weight` float8_e4m3fn of the
// weight's shape and `<prefix>.weight_scale_inv` float32 [ceil(R/128),
// ceil(C/128)] ([E, ...] for a stacked [E, R, C] expert tensor).
//
//   none                  no conversion (the default)
//   fp8-block128          the default selection: every 2-D (or stacked 3-D)
//                         bf16 or fp32 `*.weight` but the embeddings,
//                         lm_head, norms and the MoE router
//   fp8-block128:G1,G2    exactly the 2-D or 3-D weights a glob matches
//                         (checkpoint.h glob_match: '*' matches any run of
//                         characters); `fp8-block128:*` quantizes every such
//                         weight, embeddings included
//
// quantize_model gives the engine's model under a selection: each quantized
// weight becomes its codes (same name, shape and TP rule, dtype e4m3fn)
// followed by its scales (the rule's split carried to the 128-blocks). A TP
// split whose shard boundary cuts a 128-block is refused, naming the tensor
// and the two ranks, as vLLM refuses such partitions: each engine rank's
// blocks are then whole blocks of the full tensor, and its codes and scales
// are the full tensor's, cut.
//
// The runtime: RankOptions::quantize (`--quantize`) on both sides; the
// trainer quantizes on its own side and the engine verifies every code and
// scale (docs/DESIGN.md, "FP8 block quantization").
//
// Thread safety: values; the functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "refit/model.h"
#include "refit/status.h"

namespace refit {

enum class QuantFormat : unsigned char { kNone, kFp8Block128 };

struct QuantizeSpec {
  QuantFormat format = QuantFormat::kNone;
  std::vector<std::string> globs;  // empty: the default selection

  // "none", "fp8-block128", "fp8-block128:*.q_proj.weight,*.k_proj.weight".
  std::string ToString() const;
  friend bool operator==(const QuantizeSpec&, const QuantizeSpec&) = default;
};

// Parses the forms above. Errors (kInvalidArgument) quote the text and say
// what is accepted: another format, an empty glob list after ':', an empty
// glob.
StatusOr<QuantizeSpec> parse_quantize(std::string_view text);

// Whether `spec` selects `weight`: a 2-D or 3-D weight whose name ends in
// ".weight", and, by default, whose dtype is bf16 or fp32 and whose name is
// not an embedding, lm_head, a norm or the MoE router ("mlp.gate.weight");
// with globs, one of them matches the name (any dtype: quantize_model
// refuses the ones it cannot convert).
bool quantizes(const QuantizeSpec& spec, const Weight& weight);

// What an engine weight holds: the trainer weight `source` as it is, its
// FP8 codes, or its block scales.
enum class QuantPart : unsigned char { kCopy, kCodes, kScales };
struct QuantSource {
  std::size_t source = 0;  // index into the trainer's model
  QuantPart part = QuantPart::kCopy;
  friend bool operator==(const QuantSource&, const QuantSource&) = default;
};

struct QuantizedModel {
  Model engine;                      // the engine's weights, in order
  std::vector<QuantSource> sources;  // one per engine weight
  std::uint64_t quantized_tensors = 0;
};

// The engine's model when it holds `model`'s weights under `spec` over
// `engine_ranks` TP ranks. kNone: the model unchanged, every part a copy.
// Errors (kInvalidArgument): a selected weight the format cannot take
// (fp8_block_specs: its dtype, shape or name), a glob that selects no
// weight (naming it), a scale name another weight already has, and a shard
// boundary that cuts a 128-block ("tensor 'X' bfloat16[R, C], rule column
// over 3 engine ranks: the boundary between ranks 0 and 1 at row 1366 cuts
// 128-row block 10").
StatusOr<QuantizedModel> quantize_model(const Model& model, const QuantizeSpec& spec, int engine_ranks);

}  // namespace refit
