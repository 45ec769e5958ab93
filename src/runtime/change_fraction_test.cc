// Synthetic sources under --change-fraction (weight_source.h `change`,
// content.h ContentKey): from one version to the next about a fraction F of
// every tensor's elements change, and a sharded trainer's shards hold
// exactly the full source's bytes of their boxes, so engines verify either
// against the same content. Each test names the mutation it catches.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "refit/trainer_layout.h"
#include "refit/weight_source.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

// The fraction of elements of weight i that differ between two copies.
double changed(const std::vector<std::byte>& a, const std::vector<std::byte>& b, std::size_t elem) {
  std::size_t n = 0;
  for (std::size_t e = 0; e * elem < a.size(); ++e) n += std::memcmp(&a[e * elem], &b[e * elem], elem) != 0;
  return static_cast<double>(n) / static_cast<double>(a.size() / elem);
}

// Catches: a source that ignores `change` (every element differs), one
// that applies it per tensor instead of per element (whole tensors change
// or none), the change counted in bytes instead of elements.
TEST(ChangeFraction, AboutAFractionOfEveryTensorsElementsChangesPerVersion) {
  const std::uint64_t change = *change_parts(0.05);
  ASSERT_OK_AND_ASSIGN(auto source, make_synthetic_source("tiny", 1, MemoryKind::kHost, -1, {}, change));
  const Model& model = source->model();
  std::vector<std::vector<std::byte>> before;
  ASSERT_OK(source->prepare(4, 11));
  for (std::size_t i = 0; i < model.weights.size(); ++i) {
    before.emplace_back(source->data(i), source->data(i) + model.weights[i].spec.nbytes());
  }
  ASSERT_OK(source->prepare(5, 11));
  for (std::size_t i = 0; i < model.weights.size(); ++i) {
    const TensorSpec& spec = model.weights[i].spec;
    if (spec.numel() < 20000) continue;  // too few elements to count a fraction on
    const std::vector<std::byte> after(source->data(i), source->data(i) + spec.nbytes());
    EXPECT_NEAR(changed(before[i], after, dtype_size(spec.dtype)), 0.05, 0.01) << spec.ToString();
  }
}

// Catches: a shard source that keys its content per shard (or per local
// element) instead of by the full tensor's element index: its bytes would
// differ from the full source's box.
TEST(ChangeFraction, ShardsHoldTheFullSourcesBytes) {
  const std::uint64_t change = *change_parts(0.1);
  ASSERT_OK_AND_ASSIGN(auto full, make_synthetic_source("tiny", 1, MemoryKind::kHost, -1, {}, change));
  ASSERT_OK_AND_ASSIGN(const TrainerLayout layout, parse_trainer_layout("fsdp", 3));
  ASSERT_OK_AND_ASSIGN(std::vector<Layout> layouts, trainer_layouts(layout, full->model()));
  ASSERT_OK(full->prepare(3, 5));
  for (int r = 0; r < 3; ++r) {
    ASSERT_OK_AND_ASSIGN(auto shard,
                         make_synthetic_shard_source("tiny", 1, layouts, r, MemoryKind::kHost, -1, {}, change));
    ASSERT_OK(shard->prepare(3, 5));
    for (std::size_t i = 0; i < layouts.size(); ++i) {
      const TensorSpec& spec = full->model().weights[i].spec;
      ASSERT_OK_AND_ASSIGN(const Box box, layout_box(spec, layouts[i], r));
      // FSDP cuts dim 0: the box is rows [begin, end) of the full tensor, contiguous.
      const std::uint64_t row = spec.nbytes() / static_cast<std::uint64_t>(spec.shape.empty() ? 1 : spec.shape[0]);
      const std::uint64_t at = spec.shape.empty() ? 0 : static_cast<std::uint64_t>(box.begin[0]) * row;
      const std::uint64_t bytes = static_cast<std::uint64_t>(box.numel()) * dtype_size(spec.dtype);
      ASSERT_EQ(std::memcmp(shard->data(i), full->data(i) + at, bytes), 0) << "rank " << r << " " << spec.ToString();
    }
  }
}

}  // namespace
}  // namespace refit
