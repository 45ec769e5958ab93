// GPU tests of with_sharded_quantization (runtime/quantized_shards.h, label
// gpu): sharded trainer ranks whose shards are on the GPU quantize with the
// kernels of cuda/fp8_part.h, and after the amax exchange (combine_amax, as
// the coordinator runs it) every rank's codes and scales equal the host
// ranks' byte for byte (the CPU reference, which quantized_shards_test.cc
// holds equal to the whole tensors' quantization); a NaN on the device is
// refused before anything is shared, naming the tensor and the element.
#include "runtime/quantized_shards.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cuda/gpu_test_util.h"
#include "refit/device_memory.h"
#include "refit/layout.h"
#include "refit/trainer_layout.h"

namespace refit {
namespace {

constexpr std::uint64_t kSeed = 2020;

class QuantizedShardsGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { REFIT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

// Every rank of `layout_text` over `ranks` trainer ranks of `preset`, in
// `memory`: each rank's view after the exchange of `version`.
std::vector<std::unique_ptr<WeightSource>> ExchangedViews(const std::string& preset, const std::string& layout_text,
                                                          int ranks, MemoryKind memory, std::uint64_t version,
                                                          std::vector<std::vector<AmaxEntry>>* shares) {
  std::vector<std::unique_ptr<WeightSource>> views;
  const QuantizeSpec spec = parse_quantize("fp8-block128").value();
  const Model model = make_model(preset, 2).value();
  const std::vector<Layout> layouts = trainer_layouts(parse_trainer_layout(layout_text, ranks).value(), model).value();
  shares->clear();
  for (int r = 0; r < ranks; ++r) {
    const int gpu = memory == MemoryKind::kCuda ? 0 : -1;
    auto shards = make_synthetic_shard_source(preset, 2, layouts, r, memory, gpu, spec);
    EXPECT_TRUE(shards.ok()) << shards.status().ToString();
    auto view = with_sharded_quantization(std::move(shards).value(), spec, 1, r);
    EXPECT_TRUE(view.ok()) << view.status().ToString();
    EXPECT_TRUE((*view)->prepare(version, kSeed).ok());
    EXPECT_TRUE((*view)->derive(version).ok());
    auto share = amax_exchange_steps(**view)->shared_amax(version);
    EXPECT_TRUE(share.ok()) << share.status().ToString();
    shares->push_back(std::move(share).value());
    views.push_back(std::move(view).value());
  }
  const std::vector<AmaxEntry> table = combine_amax(*shares).value();
  for (auto& view : views) {
    const Status done = amax_exchange_steps(*view)->quantize_with(version, table);
    EXPECT_TRUE(done.ok()) << done.ToString();
  }
  return views;
}

// Catches: the device path's shares or bytes differing from the host's in
// any place (a partial amax over the whole block instead of the rank's
// part, an owned scale written at the touched range's index, codes of the
// wrong rows, the combined amax never uploaded: each rank's own amax
// scales the shared blocks), on two refits (the batch prepared once).
TEST_F(QuantizedShardsGpuTest, DeviceRanksHoldTheHostRanksCodesAndScales) {
  struct Case {
    std::string preset, layout;
    int ranks;
  };
  for (const Case& c : {Case{"tiny", "fsdp", 3}, Case{"tiny", "tp:2,fsdp:2", 4}, Case{"tiny-moe", "fsdp", 2}}) {
    for (std::uint64_t version : {3u, 4u}) {
      const std::string where = c.preset + " " + c.layout + " over " + std::to_string(c.ranks) + ", version " +
                                std::to_string(version);
      std::vector<std::vector<AmaxEntry>> host_shares, device_shares;
      auto host = ExchangedViews(c.preset, c.layout, c.ranks, MemoryKind::kHost, version, &host_shares);
      auto device = ExchangedViews(c.preset, c.layout, c.ranks, MemoryKind::kCuda, version, &device_shares);
      ASSERT_EQ(device_shares, host_shares) << where;
      for (int r = 0; r < c.ranks; ++r) {
        const WeightSource& h = *host[static_cast<std::size_t>(r)];
        const WeightSource& d = *device[static_cast<std::size_t>(r)];
        ASSERT_EQ(d.memory(), MemoryKind::kCuda);
        const std::vector<Layout> layouts = h.trainer_layouts();
        for (std::size_t i = 0; i < h.model().weights.size(); ++i) {
          const TensorSpec& spec = h.model().weights[i].spec;
          REFIT_ASSERT_OK_AND_ASSIGN(const Box box, layout_box(spec, layouts[i], r));
          std::vector<std::byte> got(static_cast<std::size_t>(box.numel()) * dtype_size(spec.dtype));
          REFIT_ASSERT_OK(copy_device_to_host(got, d.data(i)));
          ASSERT_EQ(std::memcmp(got.data(), h.data(i), got.size()), 0)
              << where << ": rank " << r << ", " << spec.ToString();
        }
      }
    }
  }
}

// Catches: the device report ignored (a NaN's partial amax shared), or a
// refusal that does not name the tensor, the element and the version.
TEST_F(QuantizedShardsGpuTest, ANanOnTheDeviceIsRefusedBeforeAnythingIsShared) {
  Model model;
  model.weights.push_back(Weight{TensorSpec{"layers.0.mlp.down_proj.weight", DType::kBFloat16, {300, 200}}});
  const std::vector<Layout> layouts = {Layout::of(LayoutLevel::chunk(0, 2))};
  std::vector<std::uint16_t> values(150 * 200, 0x3F80);  // rank 1's rows [150, 300), 1.0
  values[120 * 200 + 7] = 0x7FC0;                         // NaN at [270, 7]
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer mem, DeviceBuffer::Allocate(0, values.size() * 2));
  REFIT_ASSERT_OK(copy_host_to_device(mem.data(), std::as_bytes(std::span(values))));
  REFIT_ASSERT_OK_AND_ASSIGN(const QuantizeSpec spec, parse_quantize("fp8-block128:*"));
  REFIT_ASSERT_OK_AND_ASSIGN(auto shards, make_external_source(model, {mem.data()}, MemoryKind::kCuda, 0, layouts, 1));
  REFIT_ASSERT_OK_AND_ASSIGN(auto view, with_sharded_quantization(std::move(shards), spec, 1, 1));
  REFIT_ASSERT_OK(view->prepare(3, kSeed));
  const Status refused = amax_exchange_steps(*view)->shared_amax(3).status();
  EXPECT_NE(refused.message().find("tensor 'layers.0.mlp.down_proj.weight' at weight version 3"), std::string::npos)
      << refused.ToString();
  EXPECT_NE(refused.message().find("element [270, 7] is nan"), std::string::npos) << refused.ToString();
}

}  // namespace
}  // namespace refit
