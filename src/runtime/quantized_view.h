// What the two --quantize views of a trainer's source share
// (runtime/quantized_source.h for whole tensors, runtime/quantized_shards.h
// for a sharded rank's parts): the engine's model, the inner source's bytes
// for the tensors the engine holds as they are, and an arena of codes and
// scales (engine weight i at arena() + offsets_[i]) for the rest.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "refit/quantize.h"
#include "refit/weight_source.h"

namespace refit {

// At most this many host threads quantize one refit's tensors or shards.
inline constexpr unsigned kQuantizeThreads = 14;

class QuantizedView : public WeightSource {
 public:
  QuantizedView(std::unique_ptr<WeightSource> inner, QuantizedModel quantized)
      : inner_(std::move(inner)), q_(std::move(quantized)) {}

  const Model& model() const override { return q_.engine; }
  Status prepare(std::uint64_t version, std::uint64_t seed) override { return inner_->prepare(version, seed); }
  const std::byte* data(std::size_t i) const override {
    const QuantSource& s = q_.sources[i];
    if (s.part == QuantPart::kCopy) return inner_->data(s.source);
    return arena() + offsets_[i];
  }
  // The inner source's stable ranges and the host arena's, or none (every
  // data(i) must lie in one of them).
  std::vector<std::pair<const std::byte*, std::uint64_t>> stable_host_ranges() const override {
    auto ranges = inner_->stable_host_ranges();
    const std::span<const std::byte> host = host_arena();
    if (ranges.empty() || host.empty()) return {};
    ranges.emplace_back(host.data(), host.size());
    return ranges;
  }
  Status check_unchanged() const override { return inner_->check_unchanged(); }

 protected:
  // The arena's first byte (host or device memory), and the arena when it
  // is host memory (else empty).
  virtual const std::byte* arena() const = 0;
  virtual std::span<const std::byte> host_arena() const = 0;

  std::unique_ptr<WeightSource> inner_;
  QuantizedModel q_;
  std::vector<std::uint64_t> offsets_;  // of each engine weight's codes or scales in the arena (copies: 0)
};

}  // namespace refit
