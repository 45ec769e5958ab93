// Layouts: how one side's ranks (trainer or engine) split one tensor.
//
// A Layout is a list of levels in split order. Level 0 splits the full
// tensor among its ranks; level 1 splits the box each level-0 index holds;
// and so on. A rank's box is what is left after the last level. The number
// of ranks is the product of the levels' ranks (1 for no level: one rank
// holds everything).
//
// Level kinds, each over `ranks` ranks along dimension `dim` of the box the
// outer levels leave (D = the box's extent along dim):
//   kReplicate    every rank holds the whole box (a data-parallel replica)
//   kChunk        torch.chunk, FSDP2, DTensor Shard(dim): pieces of
//                 ceil(D / ranks); trailing ranks may hold less or nothing
//   kTensorSplit  torch.tensor_split, refit's engine TP rules (model.h): the
//                 first D % ranks ranks hold one more
//   kEven         Megatron TP: D must be a multiple of ranks (else an error)
//   kExperts      expert parallel over a stacked [E, ...] tensor: whole
//                 experts along dim 0, a contiguous range per rank split
//                 like kTensorSplit; needs at least 2 dims and E >= ranks
//   kOwner        one rank (`owner`) holds the whole box, the others
//                 nothing: a per-expert tensor on an expert-parallel engine
//
// Rank order: with RankOrder::kOuterSlowest (the default) a rank's level
// indices are its digits in a mixed radix whose most significant digit is
// level 0, as in a row-major device mesh; with kOuterFastest level 0's index
// is the least significant digit. Example, TP 2 x FSDP 2 where FSDP splits
// each TP shard: {even(dim 0, 2), chunk(dim 0, 2)}. With kOuterSlowest ranks
// 0,1 hold TP shard 0 and ranks 2,3 TP shard 1; with kOuterFastest ranks 0,1
// are the two TP shards of FSDP index 0 (torchtitan's (dp_shard, tp) mesh,
// where TP ranks are consecutive).
//
// A rank's local shard is the C-order bytes of its box.
//
// Thread safety: Layout and Box are values; the functions are pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "refit/model.h"
#include "refit/status.h"
#include "refit/tensor.h"

namespace refit {

enum class LevelKind : unsigned char { kReplicate, kChunk, kTensorSplit, kEven, kExperts, kOwner };

// "replicate", "chunk", "tensor_split", "even", "experts", "owner".
std::string_view level_kind_name(LevelKind kind);

struct LayoutLevel {
  LevelKind kind = LevelKind::kReplicate;
  int dim = 0;    // split dimension; ignored by kReplicate; 0 for kExperts
  int ranks = 1;  // >= 1
  int owner = 0;  // kOwner only: the rank index that holds the box, 0..ranks-1

  static LayoutLevel replicate(int ranks) { return LayoutLevel{LevelKind::kReplicate, 0, ranks}; }
  static LayoutLevel chunk(int dim, int ranks) { return LayoutLevel{LevelKind::kChunk, dim, ranks}; }
  static LayoutLevel tensor_split(int dim, int ranks) { return LayoutLevel{LevelKind::kTensorSplit, dim, ranks}; }
  static LayoutLevel even(int dim, int ranks) { return LayoutLevel{LevelKind::kEven, dim, ranks}; }
  static LayoutLevel experts(int ranks) { return LayoutLevel{LevelKind::kExperts, 0, ranks}; }
  static LayoutLevel owned_by(int owner, int ranks) { return LayoutLevel{LevelKind::kOwner, 0, ranks, owner}; }

  // "chunk(dim 0, 4 ranks)", "replicate(2 ranks)", "experts(8 ranks)",
  // "owner(rank 3 of 4 ranks)".
  std::string ToString() const;
  friend bool operator==(const LayoutLevel&, const LayoutLevel&) = default;
};

enum class RankOrder : unsigned char { kOuterSlowest, kOuterFastest };

// A table with one entry per block of another tensor, such as FP8 block
// scales (issue 20): entry [..., i, j] belongs to rows [block i, block
// (i + 1)) x columns [block j, block (j + 1)) of the tensor of `shape` (its
// last two dimensions; the ones before, e.g. stacked experts, map one to
// one). The table's shape is `shape` with those two rounded up to whole
// blocks. A layout with a block table splits the tensor of `shape` by its
// levels, and a rank holds the entries of the blocks whose first element
// lies in its box of that tensor: each box's begin and end along the two
// dimensions divided by `block`, rounded up. So every block's entry is held
// where its first element is, by exactly one rank of a split.
struct BlockTable {
  std::vector<std::int64_t> shape;  // the blocked tensor's full shape, 2 dimensions or more
  std::int64_t block = 128;
  friend bool operator==(const BlockTable&, const BlockTable&) = default;
};

struct Layout {
  std::vector<LayoutLevel> levels;  // split order; empty: one rank, the whole tensor
  RankOrder order = RankOrder::kOuterSlowest;
  std::optional<BlockTable> blocks;  // set: the tensor is this block table (the levels split its tensor)

  // One level.
  static Layout of(LayoutLevel level) { return Layout{{level}, RankOrder::kOuterSlowest}; }

  // Product of the levels' ranks (1 for no level). REQUIRES: each level's
  // ranks >= 1 (validate_layout checks it).
  int ranks() const;
  // "tensor_split(dim 1, 2 ranks) x chunk(dim 0, 2 ranks)" (plus
  // ", outer level fastest" for kOuterFastest, and ", per 128-block of
  // [1408, 2048]" for a block table); "whole" for no level.
  std::string ToString() const;
  friend bool operator==(const Layout&, const Layout&) = default;
};

// Per dimension [begin, end) of a full tensor: the part a rank holds.
struct Box {
  std::vector<std::int64_t> begin;
  std::vector<std::int64_t> end;

  std::vector<std::int64_t> extents() const;
  std::int64_t numel() const;  // 0 when any extent is 0; 1 for a scalar
  friend bool operator==(const Box&, const Box&) = default;
};

// Index of `rank` at each level of `layout` (per RankOrder).
// REQUIRES: 0 <= rank < layout.ranks().
std::vector<int> level_indices(const Layout& layout, int rank);

// The box rank `rank` holds. Errors (kInvalidArgument, naming the tensor,
// the rank and the level): rank outside 0..ranks-1, a level with ranks < 1,
// a block table whose block is < 1, whose shape has fewer than 2 dimensions
// or does not round up to the tensor's shape,
// a split dimension the tensor lacks, kEven over an extent that is not a
// multiple of its ranks, kExperts on a tensor of fewer than 2 dimensions, on
// a dim other than 0, or with fewer experts than ranks, kOwner on a scalar or
// with an owner outside 0..ranks-1.
StatusOr<Box> layout_box(const TensorSpec& spec, const Layout& layout, int rank);

// layout_box for every rank: OK when all of them are.
Status validate_layout(const TensorSpec& spec, const Layout& layout);

// The spec of rank `rank`'s local shard: same name and dtype, the box's
// extents as shape.
StatusOr<TensorSpec> local_spec(const TensorSpec& spec, const Layout& layout, int rank);

// Today's engine TP rule as a layout over `ranks` ranks: kReplicated is
// replicate(ranks); kColumn and kVocab are tensor_split(dim 0, ranks); kRow
// is tensor_split(dim 1, ranks). Boxes equal shard_slice's (model.h) for
// every rank.
Layout layout_from_shard_rule(ShardRule rule, int ranks);

// The layout an engine of `ranks` ranks splits `weight` by: its rule's
// (layout_from_shard_rule), except kExpert: a per-expert tensor is
// owned_by(expert_owner(...)), a stacked one experts(ranks). Boxes equal
// shard_slice's for every rank.
Layout engine_layout(const Weight& weight, int ranks);

}  // namespace refit
