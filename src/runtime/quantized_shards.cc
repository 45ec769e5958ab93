// The sharded trainer's quantizing view: see quantized_shards.h.
#include "runtime/quantized_shards.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <span>
#include <string>
#include <tuple>
#include <utility>

#include "control/protocol.h"
#include "core/parallel_for.h"
#include "cuda/device.h"
#include "cuda/fp8_part.h"
#include "quant/fp8_part.h"
#include "refit/device_memory.h"
#include "refit/layout.h"
#include "refit/reference_engine.h"  // weight_arena_offsets
#include "runtime/quantized_view.h"

namespace refit {
namespace {

// One selected weight as this rank holds it.
struct ShardedWeight {
  std::size_t source = 0;         // its index in the trainer's model
  std::size_t codes = 0;          // its codes' index in the engine's model (the scales follow)
  Fp8Part part;                   // part.local.data is set at each use
  Fp8BlockRange range;            // the blocks the part touches
  std::int64_t matrix_begin = 0;  // the box's first matrix (stacked experts)
  std::int64_t block_rows = 0, block_cols = 0;  // of one whole matrix
  Box scales;                                   // this rank's box of the scales (block coordinates)
  std::span<float> amax;                        // per touched block (in amax_): partial, then combined
  std::vector<float> touched_scales;            // per touched block
};

class QuantizingShards final : public QuantizedView, public AmaxExchangeSteps {
 public:
  QuantizingShards(std::unique_ptr<WeightSource> inner, QuantizedModel quantized)
      : QuantizedView(std::move(inner), std::move(quantized)), layouts_(inner_->trainer_layouts()) {}

  // Works out this rank's part of every selected weight, and allocates the
  // arena of its codes and scales.
  Status allocate(int rank) {
    std::vector<TensorSpec> local;  // codes and scales, in engine order
    for (std::size_t i = 0; i < q_.sources.size(); ++i) {
      const QuantSource& s = q_.sources[i];
      const TensorSpec& spec = inner_->model().weights[s.source].spec;
      ASSIGN_OR_RETURN(const Box box, layout_box(q_.engine.weights[i].spec, layout(i), rank));
      if (s.part == QuantPart::kScales) weights_.back().scales = box;
      if (s.part != QuantPart::kCopy) local.push_back(TensorSpec{q_.engine.weights[i].spec.name,
                                                                 q_.engine.weights[i].spec.dtype, box.extents()});
      if (s.part == QuantPart::kCodes) weights_.push_back(sharded_weight(spec, box, s.source, i));
    }
    std::uint64_t bytes = 0;
    const std::vector<std::uint64_t> at = weight_arena_offsets(local, &bytes);
    offsets_.assign(q_.sources.size(), 0);
    for (std::size_t i = 0, k = 0; i < q_.sources.size(); ++i) {
      if (q_.sources[i].part != QuantPart::kCopy) offsets_[i] = at[k++];
    }
    std::size_t blocks = 0;
    for (const ShardedWeight& w : weights_) blocks += w.touched_scales.size();
    amax_.resize(blocks);
    for (std::size_t at = 0; ShardedWeight& w : weights_) {
      w.amax = std::span(amax_).subspan(at, w.touched_scales.size());
      at += w.amax.size();
    }
    if (inner_->memory() != MemoryKind::kCuda) {
      arena_.resize(bytes);
      return Status::Ok();
    }
    const int gpu = inner_->device();
    ASSIGN_OR_RETURN(device_arena_, DeviceBuffer::Allocate(gpu, bytes));
    ASSIGN_OR_RETURN(amax_device_, DeviceBuffer::Allocate(gpu, 4 * std::max<std::size_t>(1, blocks)));
    ASSIGN_OR_RETURN(reports_, DeviceBuffer::Allocate(gpu, 8 * std::max<std::size_t>(1, weights_.size())));
    ASSIGN_OR_RETURN(stream_, CudaStream::Create(gpu));
    return Status::Ok();
  }

  MemoryKind memory() const override { return inner_->memory(); }
  int device() const override { return inner_->device(); }
  // The inner source's derivation only: the codes come from quantize_with.
  Status derive(std::uint64_t version) override { return inner_->derive(version); }
  std::vector<Layout> trainer_layouts() const override {
    std::vector<Layout> out;
    for (std::size_t i = 0; i < q_.sources.size(); ++i) out.push_back(layout(i));
    return out;
  }

  StatusOr<std::vector<AmaxEntry>> shared_amax(std::uint64_t version) override {
    if (on_device()) {
      RETURN_IF_ERROR(partial_amax_on_device(version));
    } else {
      auto amax = [&](std::size_t w) { return partial_amax(weights_[w], version); };
      RETURN_IF_ERROR(parallel_for(weights_.size(), kQuantizeThreads, amax));
    }
    std::vector<AmaxEntry> out;
    for (const ShardedWeight& w : weights_) {
      each_block(w, [&](std::size_t b, std::uint64_t block, bool whole) {
        if (!whole) out.push_back({w.source, block, std::bit_cast<std::uint32_t>(w.amax[b])});
      });
    }
    std::sort(out.begin(), out.end(), by_block);
    return out;
  }

  Status quantize_with(std::uint64_t version, const std::vector<AmaxEntry>& table) override {
    auto combine = [&](std::size_t w) { return combine_one(weights_[w], version, table); };
    RETURN_IF_ERROR(parallel_for(weights_.size(), kQuantizeThreads, combine));
    if (on_device()) return quantize_on_device();
    auto one = [&](std::size_t w) { return quantize_one(weights_[w], version); };
    return parallel_for(weights_.size(), kQuantizeThreads, one);
  }

 private:
  bool on_device() const { return inner_->memory() == MemoryKind::kCuda; }
  const std::byte* arena() const override { return on_device() ? device_arena_.data() : arena_.data(); }
  std::byte* arena() { return on_device() ? device_arena_.data() : arena_.data(); }
  std::span<const std::byte> host_arena() const override { return arena_; }

  static bool by_block(const AmaxEntry& a, const AmaxEntry& b) {
    return std::tie(a.tensor, a.block) < std::tie(b.tensor, b.block);
  }

  // Engine weight i's layout: its source's, as a block table for scales.
  Layout layout(std::size_t i) const {
    const QuantSource& s = q_.sources[i];
    Layout out = layouts_[s.source];
    const TensorSpec& spec = inner_->model().weights[s.source].spec;
    if (s.part == QuantPart::kScales) out.blocks = BlockTable{spec.shape, kFp8BlockSize};
    return out;
  }

  ShardedWeight sharded_weight(const TensorSpec& spec, const Box& box, std::size_t source, std::size_t codes) const {
    const std::size_t n = spec.shape.size();  // 2, or 3 for stacked experts
    ShardedWeight w;
    w.source = source;
    w.codes = codes;
    const std::int64_t matrices = n == 3 ? box.end[0] - box.begin[0] : 1;
    w.matrix_begin = n == 3 ? box.begin[0] : 0;
    w.part.local = fp8_dense_source(spec.dtype, nullptr, matrices, box.end[n - 2] - box.begin[n - 2],
                                    box.end[n - 1] - box.begin[n - 1]);
    w.part.row_offset = box.begin[n - 2];
    w.part.col_offset = box.begin[n - 1];
    w.part.full_rows = spec.shape[n - 2];
    w.part.full_cols = spec.shape[n - 1];
    w.range = fp8_part_blocks(w.part);
    w.block_rows = fp8_blocks(spec.shape[n - 2]);
    w.block_cols = fp8_blocks(spec.shape[n - 1]);
    w.touched_scales.resize(static_cast<std::size_t>(w.range.blocks()));  // amax: allocate() places it
    return w;
  }

  // fn(b, block, whole) for every touched block: its index in the range,
  // its index in the weight, and whether the part holds all of it.
  template <class Fn>
  static void each_block(const ShardedWeight& w, Fn fn) {
    const Fp8Part& p = w.part;
    std::int64_t b = 0;
    for (std::int64_t m = 0; m < w.range.matrices; ++m) {
      for (std::int64_t i = w.range.row_begin; i < w.range.row_begin + w.range.rows; ++i) {
        for (std::int64_t j = w.range.col_begin; j < w.range.col_begin + w.range.cols; ++j, ++b) {
          const bool rows = p.row_offset <= i * kFp8BlockSize &&
                            std::min((i + 1) * kFp8BlockSize, p.full_rows) <= p.row_offset + p.local.rows;
          const bool cols = p.col_offset <= j * kFp8BlockSize &&
                            std::min((j + 1) * kFp8BlockSize, p.full_cols) <= p.col_offset + p.local.cols;
          const auto block = static_cast<std::uint64_t>(((w.matrix_begin + m) * w.block_rows + i) * w.block_cols + j);
          fn(static_cast<std::size_t>(b), block, rows && cols);
        }
      }
    }
  }

  Fp8Part part_of(const ShardedWeight& w) const {
    Fp8Part part = w.part;
    part.local.data = inner_->data(w.source);
    return part;
  }

  Status partial_amax(ShardedWeight& w, std::uint64_t version) {
    const std::string& name = inner_->model().weights[w.source].spec.name;
    return fp8_part_amax(part_of(w), w.amax)
        .WithContext("tensor '" + name + "' at weight version " + std::to_string(version) +
                     " (NaN and Inf are refused, never quantized to FP8 or sent)");
  }

  // The table's amax of every block `w` shares, over its partial amax,
  // refusing a block the table lacks or an amax below this rank's own (no
  // combination of every holder's).
  Status combine_one(ShardedWeight& w, std::uint64_t version, const std::vector<AmaxEntry>& table) {
    const std::string& name = inner_->model().weights[w.source].spec.name;
    Status refused = Status::Ok();
    each_block(w, [&](std::size_t b, std::uint64_t block, bool whole) {
      if (whole || !refused.ok()) return;
      const AmaxEntry key{w.source, block, 0};
      auto it = std::lower_bound(table.begin(), table.end(), key, by_block);
      const std::string where = "the amax table of refit " + std::to_string(version) + " ";
      if (it == table.end() || it->tensor != w.source || it->block != block) {
        refused = InvalidArgument(where + "has no entry for tensor '" + name + "' block " + std::to_string(block) +
                                  ", which this rank shares");
        return;
      }
      const float amax = std::bit_cast<float>(it->bits);
      if (!(amax >= w.amax[b]) || !std::isfinite(amax)) {  // NaN fails too
        refused = InvalidArgument(where + "gives tensor '" + name + "' block " + std::to_string(block) + " amax " +
                                  std::to_string(amax) + ", not a finite value >= this rank's own " +
                                  std::to_string(w.amax[b]) + ": not combined from every rank that holds the block");
        return;
      }
      w.amax[b] = amax;
    });
    return refused;
  }

  Status quantize_one(ShardedWeight& w, std::uint64_t version) {
    const std::string& name = inner_->model().weights[w.source].spec.name;
    auto* codes = reinterpret_cast<std::uint8_t*>(arena_.data() + offsets_[w.codes]);
    const auto elements = static_cast<std::size_t>(w.part.local.matrices * w.part.local.rows * w.part.local.cols);
    RETURN_IF_ERROR(quantize_fp8_part(part_of(w), w.amax, {codes, elements}, w.touched_scales)
                        .WithContext("tensor '" + name + "' at weight version " + std::to_string(version)));
    copy_owned_scales(w, reinterpret_cast<float*>(arena_.data() + offsets_[w.codes + 1]));
    return Status::Ok();
  }

  // The device path (shards on a GPU): one batch of every selected weight's
  // part, prepared at the first refit (the inner source's pointers are
  // stable from then on); each step one launch, its amax through the host.
  Status prepare_batch() {
    if (batch_.jobs() > 0 || weights_.empty()) return Status::Ok();
    auto* amax = reinterpret_cast<float*>(amax_device_.data());
    auto* reports = reinterpret_cast<std::uint64_t*>(reports_.data());
    std::vector<Fp8PartDeviceJob> jobs;
    for (std::size_t k = 0; k < weights_.size(); ++k) {
      const ShardedWeight& w = weights_[k];
      const std::size_t n = w.scales.begin.size();
      const Fp8OwnedBlocks owned{w.scales.begin[n - 2], w.scales.end[n - 2] - w.scales.begin[n - 2],
                                 w.scales.begin[n - 1], w.scales.end[n - 1] - w.scales.begin[n - 1]};
      jobs.push_back({part_of(w), owned, amax + (w.amax.data() - amax_.data()),
                      reinterpret_cast<std::uint8_t*>(arena() + offsets_[w.codes]),
                      reinterpret_cast<float*>(arena() + offsets_[w.codes + 1]), reports + k});
    }
    ASSIGN_OR_RETURN(batch_, Fp8PartDeviceBatch::Prepare(jobs, inner_->device()));
    return Status::Ok();
  }

  Status partial_amax_on_device(std::uint64_t version) {
    RETURN_IF_ERROR(prepare_batch());
    RETURN_IF_ERROR(device_memset(reports_.data(), 0xFF, 8 * weights_.size()));
    RETURN_IF_ERROR(batch_.launch_amax(stream_.handle()));
    RETURN_IF_ERROR(stream_.synchronize());
    std::vector<std::uint64_t> reports(weights_.size());
    RETURN_IF_ERROR(copy_device_to_host({reinterpret_cast<std::byte*>(reports.data()), 8 * reports.size()},
                                        reports_.data()));
    for (std::size_t k = 0; k < weights_.size(); ++k) {
      const std::string& name = inner_->model().weights[weights_[k].source].spec.name;
      RETURN_IF_ERROR(fp8_part_nonfinite_status(part_of(weights_[k]), reports[k])
                          .WithContext("tensor '" + name + "' at weight version " + std::to_string(version)));
    }
    return copy_device_to_host(std::as_writable_bytes(std::span(amax_)), amax_device_.data());
  }

  Status quantize_on_device() {
    RETURN_IF_ERROR(copy_host_to_device(amax_device_.data(), std::as_bytes(std::span(amax_))));
    RETURN_IF_ERROR(batch_.launch_quantize(stream_.handle()));
    return stream_.synchronize();
  }

  // The scales of the blocks whose first element this rank holds, from the
  // touched range into the local scales shard (dense over w.scales).
  static void copy_owned_scales(const ShardedWeight& w, float* out) {
    const std::size_t n = w.scales.begin.size();
    const std::int64_t r0 = w.scales.begin[n - 2], r1 = w.scales.end[n - 2];
    const std::int64_t c0 = w.scales.begin[n - 1], c1 = w.scales.end[n - 1];
    for (std::int64_t m = 0; m < w.range.matrices; ++m) {
      for (std::int64_t i = r0; i < r1; ++i) {
        for (std::int64_t j = c0; j < c1; ++j) {
          const std::int64_t row = m * w.range.rows + (i - w.range.row_begin);
          const std::int64_t from = row * w.range.cols + (j - w.range.col_begin);
          *out++ = w.touched_scales[static_cast<std::size_t>(from)];
        }
      }
    }
  }

  std::vector<Layout> layouts_;         // the inner source's, one per trainer weight
  std::vector<ShardedWeight> weights_;  // the selected weights, in engine order
  std::vector<float> amax_;             // every weight's per-block amax (ShardedWeight::amax views it)
  std::vector<std::byte> arena_;        // this rank's codes and scales (host shards)
  // Device shards: the codes and scales, every weight's per-block amax and
  // non-finite report, and the batch of their parts.
  DeviceBuffer device_arena_, amax_device_, reports_;
  CudaStream stream_;
  Fp8PartDeviceBatch batch_;
};

}  // namespace

StatusOr<std::unique_ptr<WeightSource>> with_sharded_quantization(std::unique_ptr<WeightSource> shards,
                                                                  const QuantizeSpec& spec, int engine_ranks,
                                                                  int rank) {
  ASSIGN_OR_RETURN(QuantizedModel quantized, quantize_model(shards->model(), spec, engine_ranks));
  auto view = std::make_unique<QuantizingShards>(std::move(shards), std::move(quantized));
  RETURN_IF_ERROR(view->allocate(rank));
  return std::unique_ptr<WeightSource>(std::move(view));
}

AmaxExchangeSteps* amax_exchange_steps(WeightSource& source) { return dynamic_cast<QuantizingShards*>(&source); }

Status derive_refit(WeightSource& source, ControlClient& client, std::uint64_t version, Deadline deadline) {
  RETURN_IF_ERROR(source.derive(version).WithContext("refit " + std::to_string(version)));
  AmaxExchangeSteps* steps = amax_exchange_steps(source);
  if (steps == nullptr) return Status::Ok();
  const std::string refit = "refit " + std::to_string(version) + ", the amax exchange";
  ASSIGN_OR_RETURN(std::vector<AmaxEntry> mine, steps->shared_amax(version));
  RETURN_IF_ERROR(client.send(AmaxShare{version, std::move(mine)}).WithContext(refit));
  StatusOr<AmaxTable> table = client.wait_for<AmaxTable>(deadline);
  if (!table.ok()) return table.status().WithContext(refit);
  if (table->version != version) {
    return InvalidArgument("protocol error: the coordinator sent the amax table of refit " +
                           std::to_string(table->version) + " during refit " + std::to_string(version));
  }
  return steps->quantize_with(version, table->entries).WithContext(refit);
}

}  // namespace refit
