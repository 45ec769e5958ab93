// The mapped transfer plan: the transfer plan (transfer_plan.h) between a
// trainer and an engine that name and fuse the same weights differently
// (issue 19, item 4): Megatron's linear_qkv, linear_fc1 and stacked experts
// into Hugging Face's separate tensors or vLLM's other fusions. The trainer
// tensors and the engine tensors are two lists, each tensor split by its own
// layout; correspondences (correspondence.h; the name maps give them) say
// which box of which trainer tensor each box of an engine tensor is. The
// plan moves each sub-slice straight from the trainer ranks' local shards
// into the engine ranks' local shards: no rank converts or gathers a tensor.
//
// It keeps every rule of make_transfer_plan (transfer_plan.h): every byte an
// engine rank's box holds comes from exactly one trainer rank whose box holds
// the corresponding trainer byte; replicated holders share the load by the
// same dealing rule, in the order engine tensor, engine rank, correspondence
// (by its engine box's position), trainer box; nothing reaches an engine rank
// twice; pieces are maximal; deterministic. Its TransferRuns carry
// src_tensor, the trainer tensor they read. The runs of one (trainer rank,
// engine rank) pair are ordered by engine tensor, then dst offset, and the
// runs of different correspondences never interleave, so bucket_feed.h
// takes the plan as it is.
//
// What it supports: a correspondence's two boxes must each be one C-order
// range of their tensor (every dimension after the box's first of extent >
// 1 is whole: a range of rows, or one expert's rows of a stacked tensor), as
// every name map's are; both tensors must have one dtype (no conversion).
// Anything else is refused, named. Layouts are layout.h's: a vLLM engine
// whose TP splits qkv_proj or gate_up_proj per component (rank r holds
// [q_r; k_r; v_r]), and a Megatron trainer's TP shard of linear_fc1 ([gate_r;
// up_r], name_map.h's TP CAUTION), hold no single box of the fused tensor,
// so they have no Layout yet. Megatron's TP shards of linear_qkv (whole
// query groups) are boxes.
//
// The runtime builds one for a trainer that names a preset's weights as
// Megatron-Core does (`--trainer-names megatron`: src/runtime/sharded_plan.h,
// src/reshard/megatron_model.h).
//
// Thread safety: a pure function.
#pragma once

#include <vector>

#include "refit/correspondence.h"
#include "refit/status.h"
#include "refit/transfer_plan.h"

namespace refit {

struct MappedTransferInput {
  std::vector<SideTensor> trainer;  // layouts over trainer_ranks; TransferRun::src_tensor indexes them
  std::vector<SideTensor> engine;   // layouts over engine_ranks; TransferRun::tensor indexes them
  // Any order; each must name a tensor of each list. Together they must
  // write every element of every engine tensor once and read no trainer
  // element twice (check_correspondences, src/reshard/name_map.h); trainer
  // elements nobody reads stay behind.
  std::vector<Correspondence> correspondences;
  int trainer_ranks = 0;  // M
  int engine_ranks = 0;   // N
  TransferPlanOptions options;
};

// Builds the plan: plan.trainer_tensors and engine_tensors are the input's
// lists, plan.correspondences the input's in plan order. Its digest (xxh64)
// covers M, N, the options, both lists (specs and layouts), the
// correspondences (tensor names and boxes, in plan order: the input's order
// does not matter) and the runs, under its own format tag (it never equals
// an identity plan's). Errors (kInvalidArgument, naming the tensor, the
// correspondence and the value): no engine or no trainer tensors, no
// correspondences, M or N below 1, an invalid spec, a duplicate name on one
// side, a layout whose rank count is not M (trainer) or N (engine) or that
// the tensor does not fit, a correspondence naming a tensor its side does
// not hold, with boxes outside their tensors or of unequal extents (dims of
// extent 1 aside), engine elements written twice or never, trainer elements
// read twice, tensors of two dtypes, a box that is not one C-order range.
StatusOr<TransferPlan> make_mapped_transfer_plan(MappedTransferInput input);

}  // namespace refit
