// A sharded trainer that names a preset's weights as Megatron-Core does
// (`--trainer-names megatron`, issue 19 item 4): its ranks hold shards of
// Megatron's fused and stacked tensors (linear_qkv with q, k and v
// interleaved per query group, linear_fc1 = [gate; up], the experts of a
// layer stacked in one [E, ...] tensor), while the engine holds the
// preset's Hugging Face tensors. The name map (name_map.h, megatron->hf)
// joins the two, and the mapped transfer plan (mapped_transfer_plan.h)
// moves each sub-slice from the trainer's shards straight into the engine's:
// no rank converts or gathers a tensor.
//
// The synthetic content follows the engine's tensors: a byte of a Megatron
// tensor holds the content (content.h) of the Hugging Face byte it
// corresponds to, so engines verify what they receive exactly as they do
// for a trainer that names its tensors as they do.
//
// Thread safety: values; the functions are pure.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "refit/correspondence.h"
#include "refit/model.h"
#include "refit/status.h"
#include "reshard/name_map.h"

namespace refit {

// How a trainer names the weights: as the engine does (the presets' Hugging
// Face names, the default) or as Megatron-Core does.
enum class TrainerNames : unsigned char { kHf, kMegatron };

// Parses "hf" or "megatron"; anything else is kInvalidArgument quoting the
// text and naming both.
StatusOr<TrainerNames> parse_trainer_names(std::string_view text);

// Bytes [begin, begin + bytes) of a trainer tensor's full C-order bytes are
// bytes [source_offset, source_offset + bytes) of full tensor `source` (an
// engine tensor, or the trainer tensor itself where no engine tensor reads
// it).
struct ContentSegment {
  std::uint64_t begin = 0;
  std::uint64_t bytes = 0;
  std::string source;
  std::uint64_t source_offset = 0;
  friend bool operator==(const ContentSegment&, const ContentSegment&) = default;
};

// A preset as a Megatron trainer and a Hugging Face engine hold it.
struct MegatronModel {
  NameMap map;     // the preset's family and dimensions, megatron->hf, stacked experts
  Model engine;    // make_model(preset, layers): the engine's tensors and TP rules
  Model trainer;   // Megatron's tensors (full specs, checkpoint order); rule
                   // kReplicated: the trainer's layout splits them, never a TP rule
  std::vector<Correspondence> correspondences;  // model_correspondences(map)
  // Per trainer weight: its segments in byte order, tiling its bytes.
  std::vector<std::vector<ContentSegment>> content;
};

// The preset's Megatron form. Llama-family presets (no experts, no q/k
// norms) map as Llama, the others as Qwen3-MoE. Errors (kInvalidArgument):
// make_model's; a preset that is neither family; a name map whose Hugging
// Face tensors are not the preset's (naming the first that differs); a
// correspondence between tensors of two dtypes or whose boxes are not one
// C-order range (naming it).
StatusOr<MegatronModel> megatron_model(const std::string& preset, int layers);

}  // namespace refit
