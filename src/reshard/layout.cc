#include "refit/layout.h"

#include <algorithm>

namespace refit {
namespace {

// [begin, end) of piece `index` when `kind` splits an extent of `size` over
// `ranks` ranks (offsets relative to the extent's start).
struct Piece {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

Piece chunk_piece(std::int64_t size, std::int64_t ranks, std::int64_t index) {
  const std::int64_t step = (size + ranks - 1) / ranks;
  return Piece{std::min(index * step, size), std::min((index + 1) * step, size)};
}

Piece tensor_split_piece(std::int64_t size, std::int64_t ranks, std::int64_t index) {
  const std::int64_t base = size / ranks;
  const std::int64_t extra = size % ranks;
  const std::int64_t begin = index * base + std::min(index, extra);
  return Piece{begin, begin + base + (index < extra ? 1 : 0)};
}

std::string shape_text(const TensorSpec& spec) { return "'" + spec.ToString() + "'"; }

// Checks a level against the box it splits; the error names the tensor, the
// rank, the level and what was expected.
Status check_level(const TensorSpec& spec, const Layout& layout, int rank, std::size_t level_index,
                   const Box& box) {
  const LayoutLevel& level = layout.levels[level_index];
  const auto context = [&] {
    return "tensor " + shape_text(spec) + ", rank " + std::to_string(rank) + " of layout " + layout.ToString() +
           ", level " + std::to_string(level_index) + " " + level.ToString() + ": ";
  };
  if (level.kind == LevelKind::kReplicate) return Status::Ok();
  const auto ndim = static_cast<int>(spec.shape.size());
  if (level.kind == LevelKind::kOwner && (ndim < 1 || level.owner < 0 || level.owner >= level.ranks)) {
    return InvalidArgument(context() + "one owner among " + std::to_string(level.ranks) +
                           " ranks of a tensor of at least 1 dimension");
  }
  if (level.dim < 0 || level.dim >= ndim) {
    return InvalidArgument(context() + "the tensor has no dimension " + std::to_string(level.dim) + " (it has " +
                           std::to_string(ndim) + ")");
  }
  const auto d = static_cast<std::size_t>(level.dim);
  const std::int64_t size = box.end[d] - box.begin[d];
  if (level.kind == LevelKind::kEven && size % level.ranks != 0) {
    return InvalidArgument(context() + "an even (Megatron) split needs the extent of dim " + std::to_string(level.dim) +
                           " (" + std::to_string(size) + ") to be a multiple of " + std::to_string(level.ranks));
  }
  if (level.kind != LevelKind::kExperts) return Status::Ok();
  if (ndim < 2 || level.dim != 0) {
    return InvalidArgument(context() + "expert parallelism splits dim 0 of a stacked [experts, ...] tensor of at "
                           "least 2 dimensions");
  }
  if (size < level.ranks) {
    return InvalidArgument(context() + "expert parallelism needs at least one expert per rank: " +
                           std::to_string(size) + " experts over " + std::to_string(level.ranks) + " ranks");
  }
  return Status::Ok();
}

// Narrows `box` to piece `index` of `level`. REQUIRES: check_level passed.
void apply_level(const LayoutLevel& level, int index, Box& box) {
  if (level.kind == LevelKind::kReplicate) return;
  const auto d = static_cast<std::size_t>(level.dim);
  if (level.kind == LevelKind::kOwner) {
    if (index != level.owner) box.end[d] = box.begin[d];
    return;
  }
  const std::int64_t size = box.end[d] - box.begin[d];
  const Piece p = level.kind == LevelKind::kChunk ? chunk_piece(size, level.ranks, index)
                                                  : tensor_split_piece(size, level.ranks, index);
  box.end[d] = box.begin[d] + p.end;
  box.begin[d] += p.begin;
}

}  // namespace

std::string_view level_kind_name(LevelKind kind) {
  switch (kind) {
    case LevelKind::kReplicate: return "replicate";
    case LevelKind::kChunk: return "chunk";
    case LevelKind::kTensorSplit: return "tensor_split";
    case LevelKind::kEven: return "even";
    case LevelKind::kExperts: return "experts";
    case LevelKind::kOwner: return "owner";
  }
  return "unknown";
}

std::string LayoutLevel::ToString() const {
  std::string out(level_kind_name(kind));
  const std::string n = std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks");
  if (kind == LevelKind::kReplicate || kind == LevelKind::kExperts) return out + "(" + n + ")";
  if (kind == LevelKind::kOwner) return out + "(rank " + std::to_string(owner) + " of " + n + ")";
  return out + "(dim " + std::to_string(dim) + ", " + n + ")";
}

int Layout::ranks() const {
  int n = 1;
  for (const LayoutLevel& level : levels) n *= level.ranks;
  return n;
}

std::string Layout::ToString() const {
  std::string out;
  for (const LayoutLevel& level : levels) out += (out.empty() ? "" : " x ") + level.ToString();
  if (out.empty()) out = "whole";
  if (order == RankOrder::kOuterFastest && !levels.empty()) out += ", outer level fastest";
  if (blocks) {
    std::string shape;
    for (std::int64_t d : blocks->shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    out += ", per " + std::to_string(blocks->block) + "-block of [" + shape + "]";
  }
  return out;
}

std::vector<std::int64_t> Box::extents() const {
  std::vector<std::int64_t> out(begin.size());
  for (std::size_t d = 0; d < begin.size(); ++d) out[d] = end[d] - begin[d];
  return out;
}

std::int64_t Box::numel() const {
  std::int64_t n = 1;
  for (std::size_t d = 0; d < begin.size(); ++d) n *= end[d] - begin[d];
  return n;
}

std::vector<int> level_indices(const Layout& layout, int rank) {
  const std::size_t n = layout.levels.size();
  std::vector<int> out(n, 0);
  for (std::size_t k = 0; k < n; ++k) {
    // Least significant digit first: the last level for kOuterSlowest.
    const std::size_t level = layout.order == RankOrder::kOuterSlowest ? n - 1 - k : k;
    out[level] = rank % layout.levels[level].ranks;
    rank /= layout.levels[level].ranks;
  }
  return out;
}

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// A block table's box: rank's box of the blocked tensor, its last two
// dimensions in blocks (rounded up), so a block's entry goes with its first
// element.
StatusOr<Box> block_table_box(const TensorSpec& spec, const Layout& layout, int rank) {
  const BlockTable& table = *layout.blocks;
  const std::size_t n = table.shape.size();
  std::vector<std::int64_t> shape = table.shape;
  if (n >= 2 && table.block >= 1) {
    shape[n - 2] = ceil_div(shape[n - 2], table.block);
    shape[n - 1] = ceil_div(shape[n - 1], table.block);
  }
  if (n < 2 || table.block < 1 || shape != spec.shape) {
    return InvalidArgument("tensor " + shape_text(spec) + ": layout " + layout.ToString() +
                           " is not a block table of that shape (it needs a blocked shape of 2 dimensions or more, "
                           "a block of at least 1, and the tensor's shape equal to it rounded up to whole blocks)");
  }
  Layout of_tensor = layout;
  of_tensor.blocks.reset();
  TensorSpec blocked = spec;
  blocked.shape = table.shape;
  ASSIGN_OR_RETURN(Box box, layout_box(blocked, of_tensor, rank));
  for (std::size_t d = n - 2; d < n; ++d) {
    box.begin[d] = ceil_div(box.begin[d], table.block);
    box.end[d] = ceil_div(box.end[d], table.block);
  }
  return box;
}

}  // namespace

StatusOr<Box> layout_box(const TensorSpec& spec, const Layout& layout, int rank) {
  if (layout.blocks) return block_table_box(spec, layout, rank);
  for (std::size_t i = 0; i < layout.levels.size(); ++i) {
    if (layout.levels[i].ranks < 1) {
      return InvalidArgument("tensor " + shape_text(spec) + ": layout " + layout.ToString() + " level " +
                             std::to_string(i) + " has " + std::to_string(layout.levels[i].ranks) +
                             " ranks; every level needs at least 1");
    }
  }
  if (rank < 0 || rank >= layout.ranks()) {
    return InvalidArgument("tensor " + shape_text(spec) + ": rank " + std::to_string(rank) + " is outside layout " +
                           layout.ToString() + " (ranks 0.." + std::to_string(layout.ranks() - 1) + ")");
  }
  Box box;
  box.begin.assign(spec.shape.size(), 0);
  box.end = spec.shape;
  const std::vector<int> index = level_indices(layout, rank);
  for (std::size_t i = 0; i < layout.levels.size(); ++i) {
    RETURN_IF_ERROR(check_level(spec, layout, rank, i, box));
    apply_level(layout.levels[i], index[i], box);
  }
  return box;
}

Status validate_layout(const TensorSpec& spec, const Layout& layout) {
  for (const LayoutLevel& level : layout.levels) {
    if (level.ranks < 1) return layout_box(spec, layout, 0).status();
  }
  for (int r = 0; r < layout.ranks(); ++r) RETURN_IF_ERROR(layout_box(spec, layout, r).status());
  return Status::Ok();
}

StatusOr<TensorSpec> local_spec(const TensorSpec& spec, const Layout& layout, int rank) {
  ASSIGN_OR_RETURN(Box box, layout_box(spec, layout, rank));
  TensorSpec out = spec;
  out.shape = box.extents();
  return out;
}

Layout layout_from_shard_rule(ShardRule rule, int ranks) {
  switch (rule) {
    case ShardRule::kReplicated: return Layout::of(LayoutLevel::replicate(ranks));
    case ShardRule::kColumn:
    case ShardRule::kVocab: return Layout::of(LayoutLevel::tensor_split(0, ranks));
    case ShardRule::kRow: return Layout::of(LayoutLevel::tensor_split(1, ranks));
    case ShardRule::kExpert: return Layout::of(LayoutLevel::experts(ranks));
  }
  return Layout::of(LayoutLevel::replicate(ranks));
}

Layout engine_layout(const Weight& weight, int ranks) {
  if (weight.rule == ShardRule::kExpert && weight.expert >= 0) {
    return Layout::of(LayoutLevel::owned_by(expert_owner(weight.expert, weight.experts, ranks), ranks));
  }
  return layout_from_shard_rule(weight.rule, ranks);
}

}  // namespace refit
