// GPU tests of the trainer's --quantize view (quantized_source.h, label
// gpu): a source on the device quantizes with the kernel, and its codes and
// scales must equal the host source's (the CPU reference) byte for byte, so
// that an engine verifying against the CPU reference accepts them; a NaN
// on the device is refused naming the element, as on the host.
#include "runtime/quantized_source.h"

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "cuda/device_content.h"
#include "cuda/gpu_test_util.h"
#include "refit/content.h"
#include "refit/device_memory.h"

namespace refit {
namespace {

class QuantizedSourceGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { REFIT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

// Catches: the device path differing from the host's in any byte (a scale
// written at another block's place, the finite content made differently on
// the device, codes of another tensor), on a preset with partial blocks
// (tiny's 1408-row MLP).
TEST_F(QuantizedSourceGpuTest, DeviceCodesAndScalesEqualTheHostReference) {
  REFIT_ASSERT_OK_AND_ASSIGN(const QuantizeSpec spec, parse_quantize("fp8-block128"));
  REFIT_ASSERT_OK_AND_ASSIGN(auto host, make_synthetic_source("tiny", 2, MemoryKind::kHost, -1, spec));
  REFIT_ASSERT_OK_AND_ASSIGN(auto device, make_synthetic_source("tiny", 2, MemoryKind::kCuda, 0, spec));
  REFIT_ASSERT_OK_AND_ASSIGN(host, with_quantization(std::move(host), spec, 1));
  REFIT_ASSERT_OK_AND_ASSIGN(device, with_quantization(std::move(device), spec, 1));
  for (std::uint64_t version : {1u, 2u}) {
    REFIT_ASSERT_OK(host->prepare(version, 4));
    REFIT_ASSERT_OK(host->derive(version));
    REFIT_ASSERT_OK(device->prepare(version, 4));
    REFIT_ASSERT_OK(device->derive(version));
    for (std::size_t i = 0; i < host->model().weights.size(); ++i) {
      const TensorSpec& w = host->model().weights[i].spec;
      std::vector<std::byte> got(w.nbytes());
      REFIT_ASSERT_OK(copy_device_to_host(got, device->data(i)));
      ASSERT_EQ(std::memcmp(got.data(), host->data(i), got.size()), 0) << w.name << " at version " << version;
    }
  }
}

// Catches: the device report of a NaN ignored (codes of a NaN sent), or a
// refusal that does not name the tensor, the element and the version.
TEST_F(QuantizedSourceGpuTest, ANaNOnTheDeviceIsRefusedNamingTheElement) {
  Model model;
  model.preset = "test";
  model.weights.push_back(Weight{TensorSpec{"layer.up_proj.weight", DType::kBFloat16, {300, 260}}, ShardRule::kColumn});
  std::vector<std::uint16_t> values(300 * 260, 0x3F80);  // 1.0
  values[257 * 260 + 3] = 0xFF80;                         // -Inf
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer weights, DeviceBuffer::Allocate(0, values.size() * 2));
  REFIT_ASSERT_OK(copy_host_to_device(weights.data(), {reinterpret_cast<const std::byte*>(values.data()),
                                                       values.size() * 2}));
  REFIT_ASSERT_OK_AND_ASSIGN(auto source, make_external_source(model, {weights.data()}, MemoryKind::kCuda, 0));
  REFIT_ASSERT_OK_AND_ASSIGN(const QuantizeSpec spec, parse_quantize("fp8-block128"));
  REFIT_ASSERT_OK_AND_ASSIGN(source, with_quantization(std::move(source), spec, 1));
  REFIT_ASSERT_OK(source->prepare(8, 0));
  const Status s = source->derive(8);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("tensor 'layer.up_proj.weight' at weight version 8: element [257, 3] is -inf"),
            std::string::npos)
      << s.ToString();
}

// Catches: the device's finite content differing from the host's (another
// bit or byte cleared), for both dtypes, at an odd element count.
TEST_F(QuantizedSourceGpuTest, FiniteContentOnTheDeviceEqualsTheHosts) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    const std::uint64_t bytes = 1001 * dtype_size(dtype);
    std::vector<std::byte> want(bytes), got(bytes);
    fill_content(77, 0, want);
    make_finite_content(dtype, want);
    REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer buf, DeviceBuffer::Allocate(0, bytes));
    REFIT_ASSERT_OK(fill_content_device(77, 0, buf.data(), bytes, nullptr));
    REFIT_ASSERT_OK(make_finite_content_device(dtype, buf.data(), bytes, nullptr));
    REFIT_ASSERT_OK(copy_device_to_host(got, buf.data()));
    EXPECT_EQ(got, want) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace refit
