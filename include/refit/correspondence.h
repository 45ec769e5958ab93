// Correspondences: a box of an engine tensor is a box of a trainer tensor,
// element for element, when the two sides name and fuse the same weights
// differently (issue 19, item 4). A mapped transfer plan
// (mapped_transfer_plan.h) moves each such sub-slice straight from the
// trainer ranks' shards into the engine ranks' shards; the name maps
// (src/reshard/name_map.h) give them for Llama and Qwen3-MoE.
//
// Thread safety: values; the functions are pure.
#pragma once

#include <string>

#include "refit/layout.h"

namespace refit {

// Box `engine_box` of engine tensor `engine_name` is box `trainer_box` of
// trainer tensor `trainer_name`, element for element in C order; both boxes
// are in the FULL, unsharded tensors. The two boxes have equal extents once
// dimensions of extent 1 are dropped (a stacked expert's box has a leading 1
// the per-expert tensor lacks). `component` names the Hugging Face tensor
// both boxes are part of and `component_box` is where (same extents, HF's
// shape): what a per-component TP rule, such as vLLM's for qkv_proj, splits.
// The transfer plan reads neither: they may be left empty.
struct Correspondence {
  std::string engine_name;
  Box engine_box;
  std::string trainer_name;
  Box trainer_box;
  std::string component;
  Box component_box;

  // "model.layers.0.self_attn.k_proj.weight [0, 4) x [0, 16) <-
  // decoder.layers.0.self_attention.linear_qkv.weight [8, 12) x [0, 16)".
  std::string ToString() const;
  friend bool operator==(const Correspondence&, const Correspondence&) = default;
};

// "[8, 12) x [0, 16)"; "[]" for a scalar.
std::string box_text(const Box& box);

}  // namespace refit
