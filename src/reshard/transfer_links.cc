// The transfer plans' shared planner: see transfer_links.h.
#include "reshard/transfer_links.h"

#include <algorithm>
#include <numeric>
#include <string>

namespace refit::transfer_plan_detail {
namespace {

// Trainer ranks that hold the same non-empty box (replicas of each other).
struct Holders {
  Box box;
  std::vector<int> ranks;  // ascending
};

// One trainer tensor's boxes, per trainer rank, and its holder groups.
struct TrainerBoxes {
  std::vector<Box> boxes;
  std::vector<Holders> groups;
};

bool is_empty(const Box& box) { return box.numel() == 0; }

Box intersect(const Box& a, const Box& b) {
  Box out = a;
  for (std::size_t d = 0; d < a.begin.size(); ++d) {
    out.begin[d] = std::max(a.begin[d], b.begin[d]);
    out.end[d] = std::max(out.begin[d], std::min(a.end[d], b.end[d]));
  }
  return out;
}

// Groups the trainer boxes by value, in order of their lowest rank. Distinct
// non-empty boxes of a layout are disjoint and cover the tensor.
std::vector<Holders> group_holders(const std::vector<Box>& trainer_boxes) {
  std::vector<Holders> groups;
  for (std::size_t t = 0; t < trainer_boxes.size(); ++t) {
    if (is_empty(trainer_boxes[t])) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Holders& g) { return g.box == trainer_boxes[t]; });
    if (it == groups.end()) it = groups.insert(groups.end(), Holders{trainer_boxes[t], {}});
    it->ranks.push_back(static_cast<int>(t));
  }
  return groups;
}

// Cuts `piece` along its first dimension of extent > 1 into at most
// `holders` parts of at least min_split_bytes (tensor_split sizes).
std::vector<Box> cut_piece(const Box& piece, std::size_t holders, std::uint64_t elem, std::uint64_t min_split_bytes) {
  const std::vector<std::int64_t> ext = piece.extents();
  const auto dim = std::find_if(ext.begin(), ext.end(), [](std::int64_t e) { return e > 1; }) - ext.begin();
  if (holders <= 1 || dim == static_cast<std::ptrdiff_t>(ext.size())) return {piece};
  const auto d = static_cast<std::size_t>(dim);
  const std::uint64_t bytes = static_cast<std::uint64_t>(piece.numel()) * elem;
  std::uint64_t parts = std::min<std::uint64_t>(holders, static_cast<std::uint64_t>(ext[d]));
  if (min_split_bytes > 1) parts = std::min(parts, std::max<std::uint64_t>(1, bytes / min_split_bytes));
  std::vector<Box> out;
  const std::int64_t size = ext[d];
  const auto n = static_cast<std::int64_t>(parts);
  for (std::int64_t i = 0; i < n; ++i) {
    Box part = piece;
    part.begin[d] = piece.begin[d] + i * (size / n) + std::min(i, size % n);
    part.end[d] = part.begin[d] + size / n + (i < size % n ? 1 : 0);
    out.push_back(std::move(part));
  }
  return out;
}

// C-order element strides of a box's extents.
std::vector<std::uint64_t> strides_of(const Box& box) {
  const std::vector<std::int64_t> ext = box.extents();
  std::vector<std::uint64_t> out(ext.size(), 1);
  for (std::size_t d = ext.size(); d-- > 1;) out[d - 1] = out[d] * static_cast<std::uint64_t>(ext[d]);
  return out;
}

// Element offset of the global index `idx` inside `box`'s local shard.
std::uint64_t local_offset(const std::vector<std::int64_t>& idx, const Box& box,
                           const std::vector<std::uint64_t>& strides) {
  std::uint64_t off = 0;
  for (std::size_t d = 0; d < idx.size(); ++d) off += static_cast<std::uint64_t>(idx[d] - box.begin[d]) * strides[d];
  return off;
}

// The engine box that trainer box `held` (inside link.trainer_box) is.
Box to_engine(const TransferLink& link, const Box& held) {
  Box out = link.engine_box;
  for (std::size_t i = 0; i < out.begin.size(); ++i) {
    const int j = link.trainer_dim[i];
    if (j < 0) continue;
    const auto tj = static_cast<std::size_t>(j);
    out.begin[i] += held.begin[tj] - link.trainer_box.begin[tj];
    out.end[i] = out.begin[i] + (held.end[tj] - held.begin[tj]);
  }
  return out;
}

// Where the elements of `part` (an engine box) lie in the trainer rank's
// local shard `src`: the element offset of part.begin, and per engine
// dimension the element stride of one step along it. A dimension no trainer
// dimension walks with (extent 1) never steps; its stride is the next inner
// one's times that one's extent (1 for the innermost), so that it never
// breaks a contiguous piece. For an identity link these are the C-order
// strides of `src`.
struct SourceWalk {
  std::uint64_t base = 0;
  std::vector<std::uint64_t> strides;
};

SourceWalk source_walk(const TransferLink& link, const Box& part, const Box& src) {
  const std::vector<std::uint64_t> src_strides = strides_of(src);
  const std::vector<std::int64_t> ext = part.extents();
  const std::size_t nd = ext.size();
  SourceWalk walk{0, std::vector<std::uint64_t>(nd, 1)};
  std::vector<std::int64_t> at = link.trainer_box.begin;  // the trainer index of part.begin
  for (std::size_t i = nd; i-- > 0;) {
    const int j = link.trainer_dim[i];
    if (j >= 0) {
      walk.strides[i] = src_strides[static_cast<std::size_t>(j)];
      at[static_cast<std::size_t>(j)] += part.begin[i] - link.engine_box.begin[i];
    } else if (i + 1 < nd) {
      walk.strides[i] = walk.strides[i + 1] * static_cast<std::uint64_t>(ext[i + 1]);
    }
  }
  walk.base = local_offset(at, src, src_strides);
  return walk;
}

// Appends `run`, or extends the last run when both are contiguous and `run`
// continues it on both sides (two links that meet, such as one expert's
// gate and up rows moved between two [gate; up] tensors).
void append_run(std::vector<TransferRun>& runs, const TransferRun& run) {
  if (!runs.empty()) {
    TransferRun& last = runs.back();
    if (last.tensor == run.tensor && last.src_tensor == run.src_tensor && last.count == 1 && run.count == 1 &&
        last.src_offset + last.bytes == run.src_offset && last.dst_offset + last.bytes == run.dst_offset) {
      last.bytes += run.bytes;
      return;
    }
  }
  runs.push_back(run);
}

// Flattens engine box `part` (inside `dst`, and inside the trainer rank's
// box `src` once mapped by `link`) into strided runs, in C order: the
// trailing dimensions that part, src and dst span alike, and the partial
// dimension k before them, make one contiguous piece; dimension k-1 is the
// run's repeat (count, strides); the dimensions before it are walked index
// by index. Two pieces in a row are never contiguous on both sides (that
// would need dimension k spanned alike too), so they are maximal. The source
// side reads through source_walk; the links' boxes are C-order ranges, so a
// piece contiguous in the engine box is contiguous in the trainer's.
void flatten(const TransferLink& link, const Box& part, const Box& src, const Box& dst, std::uint64_t elem,
             std::vector<TransferRun>& runs) {
  if (part.numel() == 0) return;
  const std::size_t nd = part.begin.size();
  const std::vector<std::int64_t> ext = part.extents();
  const std::vector<std::int64_t> dst_ext = dst.extents();
  const SourceWalk walk = source_walk(link, part, src);
  const std::vector<std::uint64_t>& src_strides = walk.strides;
  std::size_t k = nd == 0 ? 0 : nd - 1;  // dims > k are spanned alike; dim k may be partial
  while (k > 0 && src_strides[k - 1] == src_strides[k] * static_cast<std::uint64_t>(ext[k]) && ext[k] == dst_ext[k]) {
    --k;
  }
  std::uint64_t run_elems = 1;
  for (std::size_t d = k; d < nd; ++d) run_elems *= static_cast<std::uint64_t>(ext[d]);
  const std::vector<std::uint64_t> dst_strides = strides_of(dst);
  TransferRun run{link.engine, 0, 0, run_elems * elem, 1, 0, 0, link.trainer};
  const std::size_t walked = k == 0 ? 0 : k - 1;  // dims [0, walked) are walked
  if (k > 0 && ext[k - 1] > 1) {
    run.count = static_cast<std::uint64_t>(ext[k - 1]);
    run.src_stride = src_strides[k - 1] * elem;
    run.dst_stride = dst_strides[k - 1] * elem;
  }
  std::vector<std::int64_t> idx = part.begin;
  while (true) {
    std::uint64_t src_elem = walk.base;
    for (std::size_t d = 0; d < walked; ++d) {
      src_elem += static_cast<std::uint64_t>(idx[d] - part.begin[d]) * src_strides[d];
    }
    run.src_offset = src_elem * elem;
    run.dst_offset = local_offset(idx, dst, dst_strides) * elem;
    append_run(runs, run);
    std::size_t d = walked;  // odometer over dims [0, walked)
    while (d > 0 && ++idx[d - 1] == part.end[d - 1]) {
      idx[d - 1] = part.begin[d - 1];
      --d;
    }
    if (d == 0) return;
  }
}

// The holder in `ranks` that has sent the fewest bytes, skipping `taken`;
// the lowest rank on a tie.
int least_loaded(const std::vector<int>& ranks, const std::vector<int>& taken, const std::vector<std::uint64_t>& load) {
  int best = -1;
  for (int t : ranks) {
    if (std::find(taken.begin(), taken.end(), t) != taken.end()) continue;
    if (best < 0 || load[static_cast<std::size_t>(t)] < load[static_cast<std::size_t>(best)]) best = t;
  }
  return best;
}

std::vector<Box> boxes_of(const SideTensor& tensor) {
  std::vector<Box> out;
  for (int r = 0; r < tensor.layout.ranks(); ++r) {
    out.push_back(*layout_box(tensor.spec, tensor.layout, r));  // validated
  }
  return out;
}

// Deals what engine rank e (box `want`) needs of `link` over the holder
// groups of its trainer tensor and adds the runs to their pairs; returns the
// bytes dealt. load[t] counts trainer t's bytes.
std::uint64_t deal_link(const TransferLink& link, const TrainerBoxes& tb, const Box& want, int e, std::uint64_t elem,
                        TransferPlan& plan, std::vector<std::uint64_t>& load) {
  std::uint64_t dealt = 0;
  for (const Holders& g : tb.groups) {
    const Box held = intersect(g.box, link.trainer_box);
    if (is_empty(held)) continue;
    const Box piece = intersect(to_engine(link, held), want);
    if (is_empty(piece)) continue;
    std::vector<int> taken;
    for (const Box& part : cut_piece(piece, g.ranks.size(), elem, plan.options.min_split_bytes)) {
      if (part.numel() == 0) continue;
      const int t = least_loaded(g.ranks, taken, load);
      taken.push_back(t);
      TransferPair& pair = plan.pairs[static_cast<std::size_t>(t * plan.engine_ranks + e)];
      flatten(link, part, tb.boxes[static_cast<std::size_t>(t)], want, elem, pair.runs);
      const std::uint64_t bytes = static_cast<std::uint64_t>(part.numel()) * elem;
      pair.bytes += bytes;
      load[static_cast<std::size_t>(t)] += bytes;
      dealt += bytes;
    }
  }
  return dealt;
}

// Adds engine tensor `i`'s runs to every pair, link by link.
Status plan_engine_tensor(std::uint32_t i, const std::vector<TransferLink>& links,
                          const std::vector<TrainerBoxes>& trainers, TransferPlan& plan,
                          std::vector<std::uint64_t>& load) {
  const SideTensor& tensor = plan.engine_tensors[i];
  const std::uint64_t elem = dtype_size(tensor.spec.dtype);
  const std::vector<Box> dst = boxes_of(tensor);
  for (int e = 0; e < plan.engine_ranks; ++e) {
    const Box& want = dst[static_cast<std::size_t>(e)];
    std::uint64_t received = 0;
    for (const TransferLink& link : links) {
      received += deal_link(link, trainers[link.trainer], want, e, elem, plan, load);
    }
    const std::uint64_t wanted = static_cast<std::uint64_t>(want.numel()) * elem;
    if (received != wanted) {
      return Internal("transfer plan: engine rank " + std::to_string(e) + " would receive " +
                      std::to_string(received) + " of the " + std::to_string(wanted) + " bytes of tensor '" +
                      tensor.spec.name + "' (engine layout " + tensor.layout.ToString() + ", " +
                      std::to_string(links.size()) + " source boxes)");
    }
    plan.total_bytes += received;
  }
  return Status::Ok();
}

}  // namespace

std::vector<int> link_dims(const Box& engine_box, const Box& trainer_box) {
  const std::vector<std::int64_t> e = engine_box.extents();
  const std::vector<std::int64_t> t = trainer_box.extents();
  std::vector<int> out(e.size(), -1);
  if (e == t) {
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  std::size_t j = 0;
  for (std::size_t i = 0; i < e.size(); ++i) {
    if (e[i] == 1) continue;
    while (j < t.size() && t[j] == 1) ++j;
    out[i] = static_cast<int>(j++);
  }
  return out;
}

bool is_c_order_range(const Box& box, const std::vector<std::int64_t>& shape) {
  bool cut = false;  // past the first dimension of extent > 1
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (cut && (box.begin[d] != 0 || box.end[d] != shape[d])) return false;
    if (box.end[d] - box.begin[d] > 1) cut = true;
  }
  return true;
}

Status check_side(const TensorSpec& spec, std::string_view side, const Layout& layout, int ranks) {
  RETURN_IF_ERROR(validate_layout(spec, layout).WithContext(std::string(side) + " layout"));
  if (layout.ranks() == ranks) return Status::Ok();
  return InvalidArgument("tensor '" + spec.name + "': the " + std::string(side) + " layout " + layout.ToString() +
                         " has " + std::to_string(layout.ranks()) + " ranks, the " + std::string(side) + " side has " +
                         std::to_string(ranks));
}

Status plan_links(const std::vector<std::vector<TransferLink>>& links, TransferPlan& plan) {
  plan.pairs.clear();
  for (int t = 0; t < plan.trainer_ranks; ++t) {
    for (int e = 0; e < plan.engine_ranks; ++e) plan.pairs.push_back(TransferPair{t, e, {}, 0});
  }
  plan.total_bytes = 0;
  std::vector<TrainerBoxes> trainers(plan.trainer_tensors.size());  // only the tensors a link reads
  for (const std::vector<TransferLink>& into : links) {
    for (const TransferLink& link : into) {
      TrainerBoxes& tb = trainers[link.trainer];
      if (!tb.boxes.empty()) continue;
      tb.boxes = boxes_of(plan.trainer_tensors[link.trainer]);
      tb.groups = group_holders(tb.boxes);
    }
  }
  std::vector<std::uint64_t> load(static_cast<std::size_t>(plan.trainer_ranks), 0);
  for (std::size_t i = 0; i < links.size(); ++i) {
    RETURN_IF_ERROR(plan_engine_tensor(static_cast<std::uint32_t>(i), links[i], trainers, plan, load));
  }
  return Status::Ok();
}

}  // namespace refit::transfer_plan_detail
