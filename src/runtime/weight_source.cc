// Synthetic and external weight sources: see weight_source.h.
#include "refit/weight_source.h"

#include "refit/content.h"
#include "cuda/device.h"
#include "cuda/device_content.h"
#include "refit/reference_engine.h"

namespace refit {
namespace {

class SyntheticSource : public WeightSource {
 public:
  SyntheticSource(Model model, MemoryKind memory, int device, std::vector<bool> finite, std::uint64_t change)
      : model_(std::move(model)), memory_(memory), device_(device), finite_(std::move(finite)), change_(change) {}

  Status allocate() {
    std::vector<TensorSpec> full;
    for (const Weight& w : model_.weights) full.push_back(w.spec);
    std::uint64_t bytes = 0;
    offsets_ = weight_arena_offsets(full, &bytes);
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
      const TensorSpec& spec = model_.weights[i].spec;
      const ContentKey key =
          make_content_key(seed, version, spec.name, change_, static_cast<std::uint32_t>(dtype_size(spec.dtype)));
      std::byte* dst = arena() + offsets_[i];
      if (memory_ == MemoryKind::kCuda) {
        RETURN_IF_ERROR(fill_content_device(key, 0, dst, spec.nbytes(), stream_.handle()));
        if (finite_[i]) RETURN_IF_ERROR(make_finite_content_device(spec.dtype, dst, spec.nbytes(), stream_.handle()));
      } else {
        fill_content(key, 0, std::span<std::byte>(dst, spec.nbytes()));
        if (finite_[i]) make_finite_content(spec.dtype, std::span<std::byte>(dst, spec.nbytes()));
      }
    }
    if (memory_ == MemoryKind::kCuda) return stream_.synchronize();
    return Status::Ok();
  }

  const std::byte* data(std::size_t i) const override {
    return const_cast<SyntheticSource*>(this)->arena() + offsets_[i];
  }
  // The host arena is allocated once and filled in place by prepare(): its
  // range never moves, so a trainer feeding GPU engines can register it.
  std::vector<std::pair<const std::byte*, std::uint64_t>> stable_host_ranges() const override {
    if (memory_ == MemoryKind::kCuda || host_arena_.empty()) return {};
    return {{host_arena_.data(), host_arena_.size()}};
  }

 private:
  std::byte* arena() { return memory_ == MemoryKind::kCuda ? device_arena_.data() : host_arena_.data(); }

  Model model_;
  MemoryKind memory_;
  int device_;
  std::vector<bool> finite_;            // per weight: make_finite_content after filling
  std::uint64_t change_;  // parts of 2^32 of the elements that change per version
  std::vector<std::uint64_t> offsets_;  // of each weight in the arena
  std::vector<std::byte> host_arena_;
  DeviceBuffer device_arena_;
  CudaStream stream_;
};

class ExternalSource : public WeightSource {
 public:
  ExternalSource(Model model, std::vector<const std::byte*> data, MemoryKind memory, int device,
                 std::vector<Layout> layouts)
      : model_(std::move(model)),
        data_(std::move(data)),
        memory_(memory),
        device_(device),
        layouts_(std::move(layouts)) {}
  const Model& model() const override { return model_; }
  MemoryKind memory() const override { return memory_; }
  int device() const override { return memory_ == MemoryKind::kCuda ? device_ : -1; }
  Status prepare(std::uint64_t, std::uint64_t) override { return Status::Ok(); }
  const std::byte* data(std::size_t i) const override { return data_[i]; }
  std::vector<Layout> trainer_layouts() const override { return layouts_; }

 private:
  Model model_;
  std::vector<const std::byte*> data_;
  MemoryKind memory_;
  int device_;
  std::vector<Layout> layouts_;  // empty: full tensors
};

// The checks of make_external_source's layouts.
Status check_external_layouts(const Model& model, const std::vector<Layout>& layouts, int rank) {
  if (layouts.empty()) return Status::Ok();
  if (layouts.size() != model.weights.size()) {
    return InvalidArgument("external weights: " + std::to_string(layouts.size()) + " layouts for " +
                           std::to_string(model.weights.size()) + " tensors");
  }
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    const TensorSpec& spec = model.weights[i].spec;
    RETURN_IF_ERROR(validate_layout(spec, layouts[i]));
    if (layouts[i].ranks() != layouts[0].ranks()) {
      return InvalidArgument("external weights: tensor '" + spec.name + "' is split over " +
                             std::to_string(layouts[i].ranks()) + " trainer ranks, tensor '" +
                             model.weights[0].spec.name + "' over " + std::to_string(layouts[0].ranks()));
    }
  }
  if (rank < 0 || rank >= layouts[0].ranks()) {
    return InvalidArgument("external weights: rank " + std::to_string(rank) + " is outside the layouts' " +
                           std::to_string(layouts[0].ranks()) + " trainer ranks");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<WeightSource>> make_synthetic_source(const std::string& preset, int layers,
                                                              MemoryKind memory, int device,
                                                              const QuantizeSpec& quantize, std::uint64_t change) {
  ASSIGN_OR_RETURN(Model model, make_model(preset, layers));
  std::vector<bool> finite;
  for (const Weight& w : model.weights) finite.push_back(quantizes(quantize, w));
  auto source = std::make_unique<SyntheticSource>(std::move(model), memory, device, std::move(finite), change);
  RETURN_IF_ERROR(source->allocate());
  return std::unique_ptr<WeightSource>(std::move(source));
}

StatusOr<std::unique_ptr<WeightSource>> make_external_source(Model model, std::vector<const std::byte*> data,
                                                             MemoryKind memory, int device,
                                                             std::vector<Layout> layouts, int rank) {
  RETURN_IF_ERROR(check_external_layouts(model, layouts, rank));
  if (data.size() != model.weights.size()) {
    return InvalidArgument("external weights: " + std::to_string(data.size()) + " data pointers for " +
                           std::to_string(model.weights.size()) + " tensors");
  }
  for (std::size_t i = 0; i < data.size(); ++i) {
    std::uint64_t bytes = model.weights[i].spec.nbytes();
    if (!layouts.empty()) {
      ASSIGN_OR_RETURN(const TensorSpec local, local_spec(model.weights[i].spec, layouts[i], rank));
      bytes = local.nbytes();
    }
    if (data[i] == nullptr && bytes != 0) {
      return InvalidArgument("external weights: tensor '" + model.weights[i].spec.name + "' has no data");
    }
  }
  if (memory == MemoryKind::kCuda && device < 0) {
    return InvalidArgument("external weights: device memory needs a CUDA device index, got " + std::to_string(device));
  }
  return std::unique_ptr<WeightSource>(
      std::make_unique<ExternalSource>(std::move(model), std::move(data), memory, device, std::move(layouts)));
}

}  // namespace refit
