// Random tensor specs and layouts for the layout and transfer plan property
// tests, and the brute-force element arithmetic they check against.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "refit/layout.h"
#include "refit/tensor.h"

namespace refit::testing {

inline int uniform(std::mt19937& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

// A spec of 0-3 dimensions, each of extent 1..7 (now and then 0), dtype of 1,
// 2 or 4 bytes: small enough to check element by element.
inline TensorSpec random_spec(std::mt19937& rng, std::string name) {
  static const DType kDtypes[] = {DType::kUInt8, DType::kBFloat16, DType::kFloat32};
  TensorSpec spec{std::move(name), kDtypes[uniform(rng, 0, 2)], {}};
  const int ndim = uniform(rng, 0, 3);
  for (int d = 0; d < ndim; ++d) spec.shape.push_back(uniform(rng, 0, 40) == 0 ? 0 : uniform(rng, 1, 7));
  return spec;
}

// 1-3 levels whose ranks multiply to `ranks`, each of a random kind on a
// random dimension, in a random rank order.
inline Layout random_layout_once(const TensorSpec& spec, int ranks, std::mt19937& rng) {
  Layout layout;
  layout.order = uniform(rng, 0, 1) == 0 ? RankOrder::kOuterSlowest : RankOrder::kOuterFastest;
  const int levels = uniform(rng, 1, 3);
  int left = ranks;
  for (int i = 0; i < levels; ++i) {
    std::vector<int> divisors;
    for (int d = 1; d <= left; ++d) {
      if (left % d == 0) divisors.push_back(d);
    }
    const int pick = uniform(rng, 0, static_cast<int>(divisors.size()) - 1);
    const int n = i + 1 == levels ? left : divisors[static_cast<std::size_t>(pick)];
    left /= n;
    const auto kind = static_cast<LevelKind>(uniform(rng, 0, 5));  // every kind, kOwner included
    const int ndim = static_cast<int>(spec.shape.size());
    const bool dim0 = kind == LevelKind::kExperts || kind == LevelKind::kOwner || ndim == 0;
    const int dim = dim0 ? 0 : uniform(rng, 0, ndim - 1);
    layout.levels.push_back(LayoutLevel{kind, dim, n, kind == LevelKind::kOwner ? uniform(rng, 0, n - 1) : 0});
  }
  return layout;
}

// A random layout valid for `spec` over `ranks` ranks (replicate when 20
// draws found none).
inline Layout random_layout(const TensorSpec& spec, int ranks, std::mt19937& rng) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    Layout layout = random_layout_once(spec, ranks, rng);
    if (validate_layout(spec, layout).ok()) return layout;
  }
  return Layout::of(LayoutLevel::replicate(ranks));
}

// The full tensor's flat element index of element `local` of a shard whose
// box is `box`, by unravelling in the box and ravelling in the full shape.
inline std::uint64_t global_element(const TensorSpec& spec, const Box& box, std::uint64_t local) {
  const std::size_t nd = spec.shape.size();
  std::vector<std::int64_t> idx(nd, 0);
  for (std::size_t d = nd; d-- > 0;) {
    const auto extent = static_cast<std::uint64_t>(box.end[d] - box.begin[d]);
    idx[d] = box.begin[d] + static_cast<std::int64_t>(local % extent);
    local /= extent;
  }
  std::uint64_t flat = 0;
  for (std::size_t d = 0; d < nd; ++d) {
    flat = flat * static_cast<std::uint64_t>(spec.shape[d]) + static_cast<std::uint64_t>(idx[d]);
  }
  return flat;
}

// True when box `box` holds the full tensor's flat element `flat`.
inline bool box_holds(const TensorSpec& spec, const Box& box, std::uint64_t flat) {
  for (std::size_t d = spec.shape.size(); d-- > 0;) {
    const auto i = static_cast<std::int64_t>(flat % static_cast<std::uint64_t>(spec.shape[d]));
    flat /= static_cast<std::uint64_t>(spec.shape[d]);
    if (i < box.begin[d] || i >= box.end[d]) return false;
  }
  return true;
}

}  // namespace refit::testing
