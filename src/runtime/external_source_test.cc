// make_external_source (weight_source.h) with the caller's per-tensor
// layouts: what the Python binding's sharded entries build.
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "refit/layout.h"
#include "refit/weight_source.h"
#include "testing/expect_has.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

Model TwoWeights() {
  Model m;
  m.preset = "external";
  m.weights.push_back(Weight{TensorSpec{"a", DType::kFloat32, {5, 3}}, ShardRule::kColumn});
  m.weights.push_back(Weight{TensorSpec{"b", DType::kFloat32, {4}}, ShardRule::kReplicated});
  return m;
}

// Catches: layouts dropped on the way (trainer_layouts() empty: the trainer
// would send the local pieces as full tensors).
TEST(ExternalSource, KeepsTheCallersLayouts) {
  std::vector<std::byte> a(2 * 3 * 4), b(4 * 4);
  const std::vector<Layout> layouts = {Layout::of(LayoutLevel::chunk(0, 3)), Layout::of(LayoutLevel::replicate(3))};
  ASSERT_OK_AND_ASSIGN(auto source,
                       make_external_source(TwoWeights(), {a.data(), b.data()}, MemoryKind::kHost, -1, layouts, 1));
  EXPECT_EQ(source->trainer_layouts(), layouts);
  EXPECT_EQ(source->data(0), a.data());
}

// Catches: a missing count check, a rank outside the layouts accepted, and
// layouts over different rank counts accepted (the transfer plan would be
// computed over the wrong M).
TEST(ExternalSource, RefusesLayoutsThatCannotDescribeOneRank) {
  std::vector<std::byte> a(2 * 3 * 4), b(4 * 4);
  const Layout chunk3 = Layout::of(LayoutLevel::chunk(0, 3));
  auto fewer = make_external_source(TwoWeights(), {a.data(), b.data()}, MemoryKind::kHost, -1, {chunk3}, 0);
  ASSERT_FALSE(fewer.ok());
  EXPECT_HAS(fewer.status().message(), "1 layouts for 2 tensors");
  auto outside = make_external_source(TwoWeights(), {a.data(), b.data()}, MemoryKind::kHost, -1,
                                      {chunk3, Layout::of(LayoutLevel::replicate(3))}, 3);
  ASSERT_FALSE(outside.ok());
  EXPECT_HAS(outside.status().message(), "rank 3 is outside the layouts' 3 trainer ranks");
  auto mixed = make_external_source(TwoWeights(), {a.data(), b.data()}, MemoryKind::kHost, -1,
                                    {chunk3, Layout::of(LayoutLevel::replicate(2))}, 0);
  ASSERT_FALSE(mixed.ok());
  EXPECT_HAS(mixed.status().message(), "tensor 'b' is split over 2 trainer ranks, tensor 'a' over 3");
}

// A trailing rank of torch.chunk may hold nothing: no data is fine there,
// and only there. Catches: the null check made against the full tensor's
// bytes (the empty piece refused) or dropped (a null piece with bytes accepted).
TEST(ExternalSource, AnEmptyPieceNeedsNoDataAndOnlyIt) {
  std::vector<std::byte> b(4 * 4);
  Model m = TwoWeights();
  m.weights[0].spec.shape = {2, 3};  // chunk(dim 0, 3) of 2 rows: rank 2 holds none
  const std::vector<Layout> layouts = {Layout::of(LayoutLevel::chunk(0, 3)), Layout::of(LayoutLevel::replicate(3))};
  EXPECT_OK(make_external_source(m, {nullptr, b.data()}, MemoryKind::kHost, -1, layouts, 2).status());
  auto held = make_external_source(m, {nullptr, b.data()}, MemoryKind::kHost, -1, layouts, 1);
  ASSERT_FALSE(held.ok());
  EXPECT_HAS(held.status().message(), "tensor 'a' has no data");
}

}  // namespace
}  // namespace refit
