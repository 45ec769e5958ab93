// The trainer's view of its source under --quantize: see quantized_source.h.
#include "runtime/quantized_source.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "core/parallel_for.h"
#include "cuda/device.h"
#include "cuda/fp8_block.h"
#include "quant/fp8_shard.h"
#include "refit/device_memory.h"
#include "refit/reference_engine.h"
#include "runtime/quantized_shards.h"
#include "runtime/quantized_view.h"

namespace refit {
namespace {

// A selected weight: the source tensor it comes from, where its codes and
// scales lie in the arena.
struct Selected {
  std::size_t source = 0;
  std::uint64_t codes = 0, scales = 0;  // arena offsets
};

class QuantizingSource final : public QuantizedView {
 public:
  QuantizingSource(std::unique_ptr<WeightSource> inner, QuantizedModel quantized)
      : QuantizedView(std::move(inner), std::move(quantized)) {}

  // Lays out every selected weight's codes then scales, and allocates them once.
  Status allocate() {
    std::vector<TensorSpec> specs;  // the codes and scales, in order
    for (std::size_t i = 0; i < q_.sources.size(); ++i) {
      if (q_.sources[i].part != QuantPart::kCopy) specs.push_back(q_.engine.weights[i].spec);
    }
    std::uint64_t bytes = 0;
    const std::vector<std::uint64_t> at = weight_arena_offsets(specs, &bytes);
    offsets_.assign(q_.sources.size(), 0);
    for (std::size_t i = 0, k = 0; i < q_.sources.size(); ++i) {
      const QuantPart part = q_.sources[i].part;
      if (part == QuantPart::kCopy) continue;
      offsets_[i] = at[k++];
      if (part == QuantPart::kCodes) selected_.push_back({q_.sources[i].source, offsets_[i], 0});
      if (part == QuantPart::kScales) selected_.back().scales = offsets_[i];
    }
    if (inner_->memory() == MemoryKind::kCuda) {
      ASSIGN_OR_RETURN(device_arena_, DeviceBuffer::Allocate(inner_->device(), bytes));
      ASSIGN_OR_RETURN(reports_, DeviceBuffer::Allocate(inner_->device(), 8 * std::max<std::size_t>(1, selected_.size())));
      ASSIGN_OR_RETURN(stream_, CudaStream::Create(inner_->device()));
    } else {
      host_arena_.resize(bytes);
    }
    return Status::Ok();
  }

  MemoryKind memory() const override { return inner_->memory(); }
  int device() const override { return inner_->device(); }

  // The quantization, timed with the refit (unless a sender took it).
  Status derive(std::uint64_t version) override {
    RETURN_IF_ERROR(inner_->derive(version));
    if (sender_quantizes_) return Status::Ok();
    if (inner_->memory() == MemoryKind::kCuda) return quantize_on_device(version);
    return quantize_on_host(version);
  }

  QuantizedOrigin take() const {
    sender_quantizes_ = true;
    return QuantizedOrigin{&q_, inner_.get()};
  }

 private:
  const std::byte* arena() const override {
    return device_arena_.size() > 0 ? device_arena_.data() : host_arena_.data();
  }
  std::span<const std::byte> host_arena() const override { return host_arena_; }
  std::byte* arena() { return device_arena_.size() > 0 ? device_arena_.data() : host_arena_.data(); }

  // One tensor with the CPU reference; a refusal names the tensor.
  Status quantize_one(const Selected& s, std::uint64_t version) {
    const TensorSpec& spec = inner_->model().weights[s.source].spec;
    const Fp8Source src = full_fp8_source(spec, inner_->data(s.source));
    const Fp8Box box = fp8_whole_box(src);
    auto* codes = reinterpret_cast<std::uint8_t*>(arena() + s.codes);
    auto* scales = reinterpret_cast<float*>(arena() + s.scales);
    const Status done = quantize_fp8_block(src, box, {codes, static_cast<std::size_t>(box.elements())},
                                           {scales, static_cast<std::size_t>(box.scales())});
    if (done.ok()) return done;
    RETURN_IF_ERROR(check_fp8_finite(src, box, spec.name, version));  // the named refusal
    return done.WithContext("tensor '" + spec.name + "'");
  }

  Status quantize_on_host(std::uint64_t version) {
    auto one = [&](std::size_t i) { return quantize_one(selected_[i], version); };
    return parallel_for(selected_.size(), kQuantizeThreads, one);
  }

  // Every tensor in one launch (prepared at the first refit: the source's
  // pointers are stable from then on), then every tensor's NaN report.
  Status quantize_on_device(std::uint64_t version) {
    if (selected_.empty()) return Status::Ok();
    if (batch_.jobs() == 0) {
      auto* reports = reinterpret_cast<std::uint64_t*>(reports_.data());
      std::vector<Fp8DeviceJob> jobs;
      for (std::size_t i = 0; i < selected_.size(); ++i) {
        const Selected& s = selected_[i];
        const Fp8Source src = full_fp8_source(inner_->model().weights[s.source].spec, inner_->data(s.source));
        jobs.push_back({src, fp8_whole_box(src),
                        {reinterpret_cast<std::uint8_t*>(arena() + s.codes), reinterpret_cast<float*>(arena() + s.scales),
                         reports + i}});
      }
      ASSIGN_OR_RETURN(batch_, Fp8DeviceBatch::Prepare(jobs, inner_->device()));
    }
    RETURN_IF_ERROR(device_memset(reports_.data(), 0xFF, 8 * selected_.size()));
    RETURN_IF_ERROR(batch_.launch(stream_.handle()));
    RETURN_IF_ERROR(stream_.synchronize());
    std::vector<std::uint64_t> host(selected_.size());
    RETURN_IF_ERROR(copy_device_to_host({reinterpret_cast<std::byte*>(host.data()), 8 * host.size()}, reports_.data()));
    for (std::size_t i = 0; i < selected_.size(); ++i) {
      if (host[i] == kFp8AllFinite) continue;
      const TensorSpec& spec = inner_->model().weights[selected_[i].source].spec;
      const Fp8Source src = full_fp8_source(spec, inner_->data(selected_[i].source));
      return fp8_nonfinite_status(src, fp8_whole_box(src), host[i], spec.name, version);
    }
    return Status::Ok();
  }

  std::vector<Selected> selected_;
  std::vector<std::byte> host_arena_;
  DeviceBuffer device_arena_, reports_;
  CudaStream stream_;
  Fp8DeviceBatch batch_;  // device sources: every selected tensor, prepared at the first derive()
  // A sender writes the codes and scales itself (take_quantization): set
  // once at setup, through the const source the senders hold.
  mutable bool sender_quantizes_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<WeightSource>> with_quantization(std::unique_ptr<WeightSource> source,
                                                          const QuantizeSpec& spec, int engine_ranks) {
  if (spec.format == QuantFormat::kNone) return source;
  if (!source->trainer_layouts().empty()) {
    return InvalidArgument("--quantize " + spec.ToString() +
                           " with a source of shards: a sharded trainer rank quantizes through "
                           "with_sharded_quantization (runtime/quantized_shards.h), which needs its rank");
  }
  ASSIGN_OR_RETURN(QuantizedModel quantized, quantize_model(source->model(), spec, engine_ranks));
  auto view = std::make_unique<QuantizingSource>(std::move(source), std::move(quantized));
  RETURN_IF_ERROR(view->allocate());
  return std::unique_ptr<WeightSource>(std::move(view));
}

std::optional<QuantizedOrigin> take_quantization(const WeightSource& source) {
  const auto* view = dynamic_cast<const QuantizingSource*>(&source);
  if (view == nullptr) return std::nullopt;
  return view->take();
}

StatusOr<std::unique_ptr<WeightSource>> with_quantization(std::unique_ptr<WeightSource> source,
                                                          const RankOptions& options) {
  ASSIGN_OR_RETURN(const QuantizeSpec spec, parse_quantize(options.quantize));
  if (spec.format == QuantFormat::kNone || source->trainer_layouts().empty()) {
    return with_quantization(std::move(source), spec, options.engine_ranks);
  }
  if (options.trainer_names != "hf") {
    return InvalidArgument("--quantize " + spec.ToString() + " with --trainer-names " + options.trainer_names +
                           ": not built yet (sharded trainers that name their tensors as the engine does quantize: "
                           "--trainer-names hf)");
  }
  return with_sharded_quantization(std::move(source), spec, options.engine_ranks, options.rank);
}

}  // namespace refit
