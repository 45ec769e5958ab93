// The planner both transfer plans share (make_transfer_plan and
// make_mapped_transfer_plan): links, each a box of an engine tensor fed
// from a box of a trainer tensor, dealt over the trainer ranks that hold
// them and flattened into strided runs. Private to src/reshard/;
// transfer_plan.h and mapped_transfer_plan.h are the contract.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "refit/layout.h"
#include "refit/status.h"
#include "refit/transfer_plan.h"

namespace refit::transfer_plan_detail {

// Box `engine_box` of engine tensor `engine` is box `trainer_box` of trainer
// tensor `trainer`, element for element in C order. An identity plan has one
// link per tensor, whole box to whole box.
struct TransferLink {
  std::uint32_t engine = 0;
  std::uint32_t trainer = 0;
  Box engine_box;
  Box trainer_box;
  // Per engine dimension, the trainer dimension it walks with, or -1 for a
  // dimension where engine_box has extent 1 and no trainer dimension
  // matches (a stacked tensor's expert slot).
  std::vector<int> trainer_dim;
};

// The dimension map of two boxes of equal extents once extents of 1 are
// dropped: dimension by dimension when the boxes' extents are equal, else
// the engine box's dimensions of extent > 1 in order onto the trainer
// box's. REQUIRES: the squeezed extents are equal.
std::vector<int> link_dims(const Box& engine_box, const Box& trainer_box);

// True when `box` is one C-order range of a tensor of `shape`: every
// dimension after its first of extent > 1 is whole.
bool is_c_order_range(const Box& box, const std::vector<std::int64_t>& shape);

// Checks one side's layout of a tensor: it fits the tensor (layout_box's
// errors, in the context "<side> layout") and spans `ranks`.
Status check_side(const TensorSpec& spec, std::string_view side, const Layout& layout, int ranks);

// Fills plan.pairs and plan.total_bytes from `links` (links[i]: those into
// engine tensor i, disjoint, covering it, each one C-order range of it, in
// the order of their positions). REQUIRES: the plan's tensors, ranks and
// options are set and valid, and every link's boxes lie inside its tensors
// with the same dtype. kInternal when an engine rank would not receive
// every byte of its box (a broken requirement).
Status plan_links(const std::vector<std::vector<TransferLink>>& links, TransferPlan& plan);

}  // namespace refit::transfer_plan_detail
