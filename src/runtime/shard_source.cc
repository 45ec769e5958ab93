// Synthetic weights as one rank of a sharded trainer holds them: see
// weight_source.h (make_synthetic_shard_source).
//
// A rank's local shard of a weight is the C-order bytes of its box
// (layout.h). Synthetic content is a function of the byte offset in the FULL
// tensor (content.h), so a shard is filled piece by piece: each maximal
// contiguous piece of the box gets the content at its full-tensor offset.
// The pieces are worked out once, from the boxes, when the source is made;
// prepare() only generates bytes.
//
// A Megatron-named trainer's tensors (reshard/megatron_model.h) hold the
// engine tensors' content: a piece is filled segment by segment, each
// segment from the tensor whose bytes it holds.
#include "runtime/shard_source.h"

#include <algorithm>

#include <span>

#include "cuda/device.h"
#include "cuda/device_content.h"
#include "refit/content.h"
#include "refit/quantize.h"
#include "refit/reference_engine.h"  // weight_arena_offsets

namespace refit {
namespace {

// A box as maximal contiguous pieces of the full tensor's C-order bytes.
// Piece j lies at local bytes [j * bytes, (j + 1) * bytes). Its full offset
// is base + sum over k of index[k] * strides[k], where index runs through
// `counts` like an odometer (last entry fastest): one entry per dimension,
// outside the piece, that the box holds more than one index of. A box that
// is one piece (an FSDP dim-0 chunk, a whole tensor) has no entry.
struct BoxPieces {
  std::uint64_t base = 0;
  std::uint64_t bytes = 0;  // of one piece; 0: an empty box, no piece
  std::vector<std::uint64_t> counts;
  std::vector<std::uint64_t> strides;
};

BoxPieces box_pieces(const TensorSpec& spec, const Box& box) {
  BoxPieces out;
  if (box.numel() == 0) return out;
  const std::size_t nd = spec.shape.size();
  const auto extent = [&](std::size_t d) { return static_cast<std::uint64_t>(box.end[d] - box.begin[d]); };
  // stride[d]: full-tensor bytes from one index of dim d to the next.
  std::vector<std::uint64_t> stride(nd, dtype_size(spec.dtype));
  for (std::size_t d = nd; d-- > 1;) stride[d - 1] = stride[d] * static_cast<std::uint64_t>(spec.shape[d]);
  // Dims [whole, nd) are held whole, so the box is contiguous from the last
  // dim it cuts inwards; a box that cuts nothing is the whole tensor.
  std::size_t whole = nd;
  while (whole > 0 && box.begin[whole - 1] == 0 && box.end[whole - 1] == spec.shape[whole - 1]) --whole;
  if (whole == 0) {
    out.bytes = spec.nbytes();
    return out;
  }
  const std::size_t cut = whole - 1;
  out.bytes = extent(cut) * stride[cut];
  for (std::size_t d = 0; d < nd; ++d) out.base += static_cast<std::uint64_t>(box.begin[d]) * stride[d];
  for (std::size_t d = 0; d < cut; ++d) {
    if (extent(d) == 1) continue;
    out.counts.push_back(extent(d));
    out.strides.push_back(stride[d]);
  }
  return out;
}

// Calls fn(full_offset, local_offset) for each piece in local order; stops
// at the first error.
template <typename Fn>
Status for_each_piece(const BoxPieces& pieces, Fn&& fn) {
  if (pieces.bytes == 0) return Status::Ok();
  std::vector<std::uint64_t> index(pieces.counts.size(), 0);
  std::uint64_t full = pieces.base;
  for (std::uint64_t local = 0;; local += pieces.bytes) {
    RETURN_IF_ERROR(fn(full, local));
    // Advance the odometer: the last entry first, carrying into the outer ones.
    std::size_t k = index.size();
    for (; k > 0; --k) {
      full += pieces.strides[k - 1];
      if (++index[k - 1] < pieces.counts[k - 1]) break;
      full -= pieces.strides[k - 1] * pieces.counts[k - 1];
      index[k - 1] = 0;
    }
    if (k == 0) return Status::Ok();  // every entry wrapped: that was the last piece
  }
}

class ShardSource : public WeightSource {
 public:
  // `content`: per weight, its segments (megatron_model.h), or empty: every
  // weight holds its own content.
  ShardSource(Model model, std::vector<Layout> layouts, std::vector<std::vector<ContentSegment>> content,
              MemoryKind memory, int device)
      : model_(std::move(model)),
        layouts_(std::move(layouts)),
        content_(std::move(content)),
        memory_(memory),
        device_(device),
        finite_(model_.weights.size(), false) {}

  // The weights `quantize` selects hold finite content (as the full
  // synthetic source's do): make_finite_content is element-wise, so a
  // shard of it is the content of the full tensor's box.
  void make_finite(const QuantizeSpec& quantize) {
    for (std::size_t i = 0; i < model_.weights.size(); ++i) finite_[i] = quantizes(quantize, model_.weights[i]);
  }
  // The parts of 2^32 of each tensor's elements that change per version
  // (content.h ContentKey); every element unless set.
  void set_change(std::uint64_t change) { change_ = change; }

  // Works out rank `rank`'s boxes and pieces and allocates the arena of its
  // local shards. REQUIRES: check_layouts passed.
  Status allocate(int rank) {
    std::vector<TensorSpec> local;
    for (std::size_t i = 0; i < model_.weights.size(); ++i) {
      const TensorSpec& spec = model_.weights[i].spec;
      ASSIGN_OR_RETURN(const Box box, layout_box(spec, layouts_[i], rank));
      pieces_.push_back(box_pieces(spec, box));
      local.push_back(TensorSpec{spec.name, spec.dtype, box.extents()});
      shard_bytes_.push_back(local.back().nbytes());
    }
    std::uint64_t bytes = 0;
    offsets_ = weight_arena_offsets(local, &bytes);
    if (memory_ == MemoryKind::kCuda) {
      ASSIGN_OR_RETURN(device_arena_, DeviceBuffer::Allocate(device_, bytes));
      ASSIGN_OR_RETURN(stream_, CudaStream::Create(device_));
    } else {
      host_arena_.resize(bytes);
    }
    return Status::Ok();
  }

  const Model& model() const override { return model_; }
  MemoryKind memory() const override { return memory_; }
  int device() const override { return memory_ == MemoryKind::kCuda ? device_ : -1; }

  Status prepare(std::uint64_t version, std::uint64_t seed) override {
    for (std::size_t i = 0; i < model_.weights.size(); ++i) {
      // The full tensor's key: a piece holds the full tensor's bytes.
      const ContentKey key = content_of(seed, version, model_.weights[i].spec.name, model_.weights[i].spec.dtype);
      std::byte* shard = arena() + offsets_[i];
      const std::uint64_t bytes = pieces_[i].bytes;
      RETURN_IF_ERROR(for_each_piece(pieces_[i], [&](std::uint64_t full, std::uint64_t local) {
        if (content_.empty()) return fill(key, full, shard + local, bytes);
        return fill_segments(content_[i], model_.weights[i].spec.dtype, seed, version, full, shard + local, bytes);
      }));
      if (!finite_[i]) continue;
      const TensorSpec& spec = model_.weights[i].spec;
      const std::uint64_t local = shard_bytes_[i];
      if (memory_ == MemoryKind::kCuda) {
        RETURN_IF_ERROR(make_finite_content_device(spec.dtype, shard, local, stream_.handle()));
      } else {
        make_finite_content(spec.dtype, std::span<std::byte>(shard, local));
      }
    }
    if (memory_ == MemoryKind::kCuda) return stream_.synchronize();
    return Status::Ok();
  }

  const std::byte* data(std::size_t i) const override { return arena() + offsets_[i]; }
  // The host arena is allocated once and filled in place by prepare(): its
  // range never moves, so a trainer feeding GPU engines can register it.
  std::vector<std::pair<const std::byte*, std::uint64_t>> stable_host_ranges() const override {
    if (memory_ == MemoryKind::kCuda || host_arena_.empty()) return {};
    return {{host_arena_.data(), host_arena_.size()}};
  }
  std::vector<Layout> trainer_layouts() const override { return layouts_; }

 private:
  // Content bytes [full, full + bytes) of the tensor with `key` at dst: one
  // launch on the device (asynchronous; prepare synchronizes).
  ContentKey content_of(std::uint64_t seed, std::uint64_t version, const std::string& name, DType dtype) const {
    return make_content_key(seed, version, name, change_, static_cast<std::uint32_t>(dtype_size(dtype)));
  }
  Status fill(const ContentKey& key, std::uint64_t full, std::byte* dst, std::uint64_t bytes) {
    if (memory_ == MemoryKind::kCuda) return fill_content_device(key, full, dst, bytes, stream_.handle());
    fill_content(key, full, std::span<std::byte>(dst, bytes));
    return Status::Ok();
  }
  // The bytes [full, full + bytes) of a tensor made of `segments`: each
  // part from the tensor whose content its segment holds.
  Status fill_segments(const std::vector<ContentSegment>& segments, DType dtype, std::uint64_t seed,
                       std::uint64_t version, std::uint64_t full, std::byte* dst, std::uint64_t bytes) {
    // The last segment that begins at or before `full`: the segments tile the tensor from 0.
    auto it = std::upper_bound(segments.begin(), segments.end(), full,
                               [](std::uint64_t at, const ContentSegment& s) { return at < s.begin; });
    for (--it; it != segments.end() && it->begin < full + bytes; ++it) {
      const std::uint64_t from = std::max(full, it->begin);
      const std::uint64_t to = std::min(full + bytes, it->begin + it->bytes);
      // The source tensor's elements: the fused tensor's dtype is the source's.
      RETURN_IF_ERROR(fill(content_of(seed, version, it->source, dtype), it->source_offset + (from - it->begin),
                           dst + (from - full), to - from));
    }
    return Status::Ok();
  }
  std::byte* arena() { return memory_ == MemoryKind::kCuda ? device_arena_.data() : host_arena_.data(); }
  const std::byte* arena() const { return memory_ == MemoryKind::kCuda ? device_arena_.data() : host_arena_.data(); }

  Model model_;  // full specs
  std::vector<Layout> layouts_;
  std::vector<std::vector<ContentSegment>> content_;
  MemoryKind memory_;
  int device_;
  std::vector<BoxPieces> pieces_;       // of each weight's box, for this rank
  std::vector<bool> finite_;            // per weight: make_finite_content after filling
  std::uint64_t change_ = kEveryElement;  // set_change
  std::vector<std::uint64_t> offsets_;  // of each local shard in the arena
  std::vector<std::uint64_t> shard_bytes_;  // of each local shard
  std::vector<std::byte> host_arena_;
  DeviceBuffer device_arena_;
  CudaStream stream_;
};

// What weight_source.h promises to refuse, each error naming the tensor: a
// layout count other than the weights', a layout the tensor does not fit,
// layouts over different rank counts (they describe one trainer), a rank
// outside them.
Status check_layouts(const Model& model, const std::vector<Layout>& layouts, int rank) {
  const std::string what = "synthetic shard source (preset \"" + model.preset + "\")";
  const std::vector<Weight>& weights = model.weights;
  if (layouts.size() != weights.size()) {
    const std::string none =
        layouts.size() < weights.size() ? "; tensor '" + weights[layouts.size()].spec.name + "' has none" : "";
    return InvalidArgument(what + ": " + std::to_string(layouts.size()) + " trainer layouts for " +
                           std::to_string(weights.size()) + " weights" + none);
  }
  if (weights.empty()) return Status::Ok();
  const int ranks = layouts[0].ranks();
  for (std::size_t i = 0; i < weights.size(); ++i) {
    RETURN_IF_ERROR(validate_layout(weights[i].spec, layouts[i]).WithContext(what));
    if (layouts[i].ranks() != ranks) {
      return InvalidArgument(what + ": tensor '" + weights[i].spec.name + "' is laid out as " +
                             layouts[i].ToString() + " over " + std::to_string(layouts[i].ranks()) +
                             " trainer ranks, but tensor '" + weights[0].spec.name + "' over " +
                             std::to_string(ranks) + " (" + layouts[0].ToString() + ")");
    }
  }
  if (rank < 0 || rank >= ranks) {
    return InvalidArgument(what + ": trainer rank " + std::to_string(rank) + " is outside the layouts' " +
                           std::to_string(ranks) + " ranks (0.." + std::to_string(ranks - 1) + "; tensor '" +
                           weights[0].spec.name + "' is laid out as " + layouts[0].ToString() + ")");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<WeightSource>> make_synthetic_shard_source(const std::string& preset, int layers,
                                                                    std::vector<Layout> layouts, int rank,
                                                                    MemoryKind memory, int device,
                                                                    const QuantizeSpec& quantize, std::uint64_t change) {
  ASSIGN_OR_RETURN(Model model, make_model(preset, layers));
  RETURN_IF_ERROR(check_layouts(model, layouts, rank));
  auto source = std::make_unique<ShardSource>(std::move(model), std::move(layouts),
                                              std::vector<std::vector<ContentSegment>>{}, memory, device);
  source->make_finite(quantize);
  source->set_change(change);
  RETURN_IF_ERROR(source->allocate(rank));
  return std::unique_ptr<WeightSource>(std::move(source));
}

StatusOr<std::unique_ptr<WeightSource>> make_megatron_shard_source(const MegatronModel& model,
                                                                   std::vector<Layout> layouts, int rank,
                                                                   MemoryKind memory, int device, std::uint64_t change) {
  RETURN_IF_ERROR(check_layouts(model.trainer, layouts, rank));
  auto source = std::make_unique<ShardSource>(model.trainer, std::move(layouts), model.content, memory, device);
  source->set_change(change);
  RETURN_IF_ERROR(source->allocate(rank));
  return std::unique_ptr<WeightSource>(std::move(source));
}

}  // namespace refit
