#include "refit/transfer_plan.h"

#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <string_view>
#include <unordered_map>

namespace refit {
namespace {

constexpr std::string_view kTransferPlanFormatTag = "refit-transfer-plan-v1";

// Trainer ranks that hold the same non-empty box (replicas of each other).
struct Holders {
  Box box;
  std::vector<int> ranks;  // ascending
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

// Flattens box `part` (inside both src and dst) into strided runs, in C
// order: the trailing dimensions that part, src and dst span alike, and the
// partial dimension k before them, make one contiguous piece; dimension k-1
// is the run's repeat (count, strides); the dimensions before it are walked
// index by index. Two pieces in a row are never contiguous on both sides
// (that would need dimension k spanned alike too), so they are maximal.
void flatten(std::uint32_t tensor, const Box& part, const Box& src, const Box& dst, std::uint64_t elem,
             std::vector<TransferRun>& runs) {
  if (part.numel() == 0) return;
  const std::size_t nd = part.begin.size();
  const std::vector<std::int64_t> ext = part.extents();
  const std::vector<std::int64_t> src_ext = src.extents();
  const std::vector<std::int64_t> dst_ext = dst.extents();
  std::size_t k = nd == 0 ? 0 : nd - 1;  // dims > k are spanned alike; dim k may be partial
  while (k > 0 && ext[k] == src_ext[k] && ext[k] == dst_ext[k]) --k;
  std::uint64_t run_elems = 1;
  for (std::size_t d = k; d < nd; ++d) run_elems *= static_cast<std::uint64_t>(ext[d]);
  const std::vector<std::uint64_t> src_strides = strides_of(src);
  const std::vector<std::uint64_t> dst_strides = strides_of(dst);
  TransferRun run{tensor, 0, 0, run_elems * elem, 1, 0, 0};
  const std::size_t walked = k == 0 ? 0 : k - 1;  // dims [0, walked) are walked
  if (k > 0 && ext[k - 1] > 1) {
    run.count = static_cast<std::uint64_t>(ext[k - 1]);
    run.src_stride = src_strides[k - 1] * elem;
    run.dst_stride = dst_strides[k - 1] * elem;
  }
  std::vector<std::int64_t> idx = part.begin;
  while (true) {
    run.src_offset = local_offset(idx, src, src_strides) * elem;
    run.dst_offset = local_offset(idx, dst, dst_strides) * elem;
    runs.push_back(run);
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

// Checks one side's layout of a tensor: it fits the tensor and spans `ranks`.
Status check_side(const TensorSpec& spec, std::string_view side, const Layout& layout, int ranks) {
  RETURN_IF_ERROR(validate_layout(spec, layout).WithContext(std::string(side) + " layout"));
  if (layout.ranks() == ranks) return Status::Ok();
  return InvalidArgument("tensor '" + spec.name + "': the " + std::string(side) + " layout " + layout.ToString() +
                         " has " + std::to_string(layout.ranks()) + " ranks, the " + std::string(side) + " side has " +
                         std::to_string(ranks));
}

Status validate_tensors(const std::vector<TensorLayouts>& tensors, int m, int n) {
  if (tensors.empty()) return InvalidArgument("the transfer plan has no tensors: at least one must move");
  if (m < 1 || n < 1) {
    return InvalidArgument("the transfer plan needs at least one rank per side: trainer ranks " + std::to_string(m) +
                           ", engine ranks " + std::to_string(n));
  }
  if (tensors.size() > std::numeric_limits<std::uint32_t>::max()) {
    return InvalidArgument("the transfer plan has " + std::to_string(tensors.size()) + " tensors; too many");
  }
  std::unordered_map<std::string_view, std::size_t> seen;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorLayouts& tl = tensors[i];
    RETURN_IF_ERROR(validate_spec(tl.spec).WithContext("tensor position " + std::to_string(i)));
    auto [it, inserted] = seen.emplace(tl.spec.name, i);
    if (!inserted) {
      return InvalidArgument("duplicate tensor name '" + tl.spec.name + "' at positions " +
                             std::to_string(it->second) + " and " + std::to_string(i));
    }
    RETURN_IF_ERROR(check_side(tl.spec, "trainer", tl.trainer, m));
    RETURN_IF_ERROR(check_side(tl.spec, "engine", tl.engine, n));
  }
  return Status::Ok();
}

std::vector<Box> boxes_of(const TensorSpec& spec, const Layout& layout) {
  std::vector<Box> out;
  for (int r = 0; r < layout.ranks(); ++r) out.push_back(*layout_box(spec, layout, r));  // validated
  return out;
}

// One tensor being planned: its boxes on both sides and its holder groups.
struct TensorBoxes {
  std::uint32_t index = 0;
  std::uint64_t elem = 0;  // bytes per element
  std::vector<Box> src;    // per trainer rank
  std::vector<Box> dst;    // per engine rank
  std::vector<Holders> groups;
};

// Deals the part of group `g`'s box that engine rank e needs over g's
// holders and adds the runs to their pairs; returns the bytes dealt.
std::uint64_t deal_piece(const TensorBoxes& tb, const Holders& g, int e, TransferPlan& plan,
                         std::vector<std::uint64_t>& load) {
  const Box& want = tb.dst[static_cast<std::size_t>(e)];
  std::uint64_t dealt = 0;
  std::vector<int> taken;
  for (const Box& part : cut_piece(intersect(g.box, want), g.ranks.size(), tb.elem, plan.options.min_split_bytes)) {
    if (part.numel() == 0) continue;
    const int t = least_loaded(g.ranks, taken, load);
    taken.push_back(t);
    TransferPair& pair = plan.pairs[static_cast<std::size_t>(t * plan.engine_ranks + e)];
    flatten(tb.index, part, tb.src[static_cast<std::size_t>(t)], want, tb.elem, pair.runs);
    const std::uint64_t bytes = static_cast<std::uint64_t>(part.numel()) * tb.elem;
    pair.bytes += bytes;
    load[static_cast<std::size_t>(t)] += bytes;
    dealt += bytes;
  }
  return dealt;
}

// Adds tensor `i`'s runs to every pair; load[t] counts trainer t's bytes.
Status plan_tensor(std::uint32_t i, TransferPlan& plan, std::vector<std::uint64_t>& load) {
  const TensorLayouts& tl = plan.tensors[i];
  TensorBoxes tb{i, dtype_size(tl.spec.dtype), boxes_of(tl.spec, tl.trainer), boxes_of(tl.spec, tl.engine), {}};
  tb.groups = group_holders(tb.src);
  for (int e = 0; e < plan.engine_ranks; ++e) {
    std::uint64_t received = 0;
    for (const Holders& g : tb.groups) received += deal_piece(tb, g, e, plan, load);
    const std::uint64_t wanted = static_cast<std::uint64_t>(tb.dst[static_cast<std::size_t>(e)].numel()) * tb.elem;
    if (received != wanted) {
      return Internal("transfer plan: engine rank " + std::to_string(e) + " would receive " +
                      std::to_string(received) + " of the " + std::to_string(wanted) + " bytes of tensor '" +
                      tl.spec.name + "' (trainer layout " + tl.trainer.ToString() + ")");
    }
    plan.total_bytes += received;
  }
  return Status::Ok();
}

// Canonical little-endian encoding for the digest.
class Encoder {
 public:
  void u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void text(std::string_view s) {
    u64(s.size());
    out_.append(s);
  }
  void layout(const Layout& l) {
    u64(static_cast<std::uint64_t>(l.order));
    u64(l.levels.size());
    for (const LayoutLevel& level : l.levels) {
      u64(static_cast<std::uint64_t>(level.kind));
      u64(static_cast<std::uint64_t>(level.dim));
      u64(static_cast<std::uint64_t>(level.ranks));
      if (level.kind == LevelKind::kOwner) u64(static_cast<std::uint64_t>(level.owner));  // older kinds: as before
    }
  }
  const std::string& str() const { return out_; }

 private:
  std::string out_;
};

std::uint64_t compute_digest(const TransferPlan& plan) {
  Encoder enc;
  enc.text(kTransferPlanFormatTag);
  enc.u64(static_cast<std::uint64_t>(plan.trainer_ranks));
  enc.u64(static_cast<std::uint64_t>(plan.engine_ranks));
  enc.u64(plan.options.min_split_bytes);
  enc.u64(plan.tensors.size());
  for (const TensorLayouts& tl : plan.tensors) {
    enc.text(tl.spec.name);
    enc.u64(static_cast<std::uint64_t>(tl.spec.dtype));
    enc.u64(tl.spec.shape.size());
    for (std::int64_t d : tl.spec.shape) enc.u64(static_cast<std::uint64_t>(d));
    enc.layout(tl.trainer);
    enc.layout(tl.engine);
  }
  for (const TransferPair& p : plan.pairs) {
    enc.u64(p.runs.size());
    for (const TransferRun& r : p.runs) {
      enc.u64(r.tensor);
      enc.u64(r.src_offset);
      enc.u64(r.dst_offset);
      enc.u64(r.bytes);
      enc.u64(r.count);
      enc.u64(r.src_stride);
      enc.u64(r.dst_stride);
    }
  }
  return XXH64(enc.str().data(), enc.str().size(), 0);
}

}  // namespace

std::vector<TransferRun> contiguous_pieces(const TransferRun& run) {
  std::vector<TransferRun> out;
  out.reserve(run.count);
  for (std::uint64_t i = 0; i < run.count; ++i) {
    out.push_back(TransferRun{run.tensor, run.src_offset + i * run.src_stride, run.dst_offset + i * run.dst_stride,
                              run.bytes, 1, 0, 0});
  }
  return out;
}

std::vector<std::uint64_t> TransferPlan::bytes_per_trainer_rank() const {
  std::vector<std::uint64_t> out(static_cast<std::size_t>(trainer_ranks), 0);
  for (const TransferPair& p : pairs) out[static_cast<std::size_t>(p.trainer_rank)] += p.bytes;
  return out;
}

std::string TransferPlan::digest_hex() const {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, digest);
  return buf;
}

StatusOr<TransferPlan> make_transfer_plan(std::vector<TensorLayouts> tensors, int trainer_ranks, int engine_ranks,
                                          TransferPlanOptions options) {
  RETURN_IF_ERROR(validate_tensors(tensors, trainer_ranks, engine_ranks));
  TransferPlan plan;
  plan.tensors = std::move(tensors);
  plan.trainer_ranks = trainer_ranks;
  plan.engine_ranks = engine_ranks;
  plan.options = options;
  for (int t = 0; t < trainer_ranks; ++t) {
    for (int e = 0; e < engine_ranks; ++e) plan.pairs.push_back(TransferPair{t, e, {}, 0});
  }
  std::vector<std::uint64_t> load(static_cast<std::size_t>(trainer_ranks), 0);
  for (std::size_t i = 0; i < plan.tensors.size(); ++i) {
    RETURN_IF_ERROR(plan_tensor(static_cast<std::uint32_t>(i), plan, load));
  }
  plan.digest = compute_digest(plan);
  return plan;
}

std::vector<TensorSpec> PairStream::specs() const {
  std::vector<TensorSpec> out;
  out.reserve(entries.size());
  for (const PairStreamEntry& entry : entries) out.push_back(entry.spec);
  return out;
}

std::vector<PairStream> pair_streams(const TransferPlan& plan) {
  std::vector<PairStream> out;
  for (const TransferPair& p : plan.pairs) {
    if (p.bytes == 0) continue;
    PairStream stream{p.trainer_rank, p.engine_rank, {}};
    for (const TransferRun& run : p.runs) {
      if (stream.entries.empty() || stream.entries.back().runs.front().tensor != run.tensor) {
        const TensorSpec& full = plan.tensors[run.tensor].spec;
        stream.entries.push_back(PairStreamEntry{TensorSpec{full.name, full.dtype, {0}}, {}});
      }
      PairStreamEntry& entry = stream.entries.back();
      entry.runs.push_back(run);
      entry.spec.shape[0] += static_cast<std::int64_t>(run.total_bytes() / dtype_size(entry.spec.dtype));
    }
    out.push_back(std::move(stream));
  }
  return out;
}

}  // namespace refit
