// CPU-runnable tests of refit/device.h: the rule-7 device mapping, the
// CUDA_VISIBLE_DEVICES parser, and that a machine without a GPU gets a Status
// (never a crash). Each test says which mistake it catches.
#include <cstdlib>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "cuda/device.h"
#include "testing/scoped_env.h"

namespace refit {
namespace {

// Catches: ignoring tp_rank (every rank on the base GPU) or ignoring base_gpu_id.
TEST(EngineLocalDeviceTest, IsBasePlusTpRank) {
  EXPECT_EQ(*engine_local_device(0, 0, 1), 0);
  EXPECT_EQ(*engine_local_device(0, 3, 4), 3);
  EXPECT_EQ(*engine_local_device(2, 1, 4), 3);
  EXPECT_EQ(*engine_local_device(4, 3, 8), 7);
}

// --engine-gpus: the engine's ranks share that many GPUs round-robin.
// Catches: the count ignored (rank 3 of one GPU refused as device 3), and
// the bound checked before the modulo.
TEST(EngineLocalDeviceTest, RanksShareTheEngineGpusRoundRobin) {
  EXPECT_EQ(*engine_local_device(0, 3, 1, 1), 0);
  EXPECT_EQ(*engine_local_device(1, 3, 4, 2), 2);
  EXPECT_EQ(*engine_local_device(2, 5, 4, 2), 3);
  auto beyond = engine_local_device(1, 1, 2, 2);
  ASSERT_FALSE(beyond.ok());
  EXPECT_NE(beyond.status().message().find("base_gpu_id + tp_rank % engine GPUs = 2 is not a visible device"),
            std::string::npos)
      << beyond.status().message();
  EXPECT_FALSE(engine_local_device(0, 0, 1, -1).ok());
}

// Rule 7. Catches: "returns the physical id from CUDA_VISIBLE_DEVICES instead
// of the local index" (a mapping through the environment, or a bounds check
// against physical ids). With CUDA_VISIBLE_DEVICES=4,5,6,7 the process sees
// local devices 0..3: engine rank 2 with base_gpu_id 1 is local device 3 (the
// physical GPU 7), and base_gpu_id 4 names no visible device at all.
// Tried once (2026-11-29): engine_local_device returning
// std::stoi(parse_visible_devices(getenv("CUDA_VISIBLE_DEVICES"))[base+rank])
// made this test fail (7 != 3), as intended.
TEST(EngineLocalDeviceTest, LocalIndexNotPhysicalId) {
  testing::ScopedEnv env("CUDA_VISIBLE_DEVICES", "4,5,6,7");
  EXPECT_EQ(*engine_local_device(1, 2, 4), 3);
  EXPECT_EQ(*engine_local_device(0, 0, 4), 0);
  const StatusOr<int> physical = engine_local_device(4, 0, 4);
  ASSERT_FALSE(physical.ok()) << "base_gpu_id 4 was taken as a physical id; it is a local index";
  EXPECT_NE(physical.status().message().find("local index"), std::string::npos) << physical.status().ToString();
}

// Catches: an off-by-one bound (> instead of >=), and an error that does not
// name the values an operator must fix.
TEST(EngineLocalDeviceTest, OutOfRangeIsAnErrorNamingTheValues) {
  EXPECT_TRUE(engine_local_device(0, 7, 8).ok());
  const StatusOr<int> r = engine_local_device(6, 2, 8);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  const Status st = r.status();
  const std::string& m = st.message();
  EXPECT_NE(m.find("base_gpu_id 6"), std::string::npos) << m;
  EXPECT_NE(m.find("tp_rank 2"), std::string::npos) << m;
  EXPECT_NE(m.find("8 visible"), std::string::npos) << m;
  EXPECT_FALSE(engine_local_device(0, 1, 1).ok());
  EXPECT_FALSE(engine_local_device(0, 0, 0).ok()) << "no visible device must be an error";
}

// Catches: a negative base_gpu_id or tp_rank wrapping into a valid index.
TEST(EngineLocalDeviceTest, NegativeValuesAreErrors) {
  EXPECT_FALSE(engine_local_device(-1, 1, 4).ok());
  EXPECT_FALSE(engine_local_device(1, -1, 4).ok());
  EXPECT_FALSE(engine_local_device(-2147483647 - 1, 0, 4).ok());
}

// Catches: entries not trimmed, UUID entries dropped, and parsing past the
// first empty entry (the CUDA runtime stops there).
TEST(ParseVisibleDevicesTest, SplitsTrimsAndStopsAtAnEmptyEntry) {
  using V = std::vector<std::string>;
  EXPECT_EQ(parse_visible_devices("4,5"), (V{"4", "5"}));
  EXPECT_EQ(parse_visible_devices(" 4 , 5 "), (V{"4", "5"}));
  EXPECT_EQ(parse_visible_devices("GPU-8d1e,MIG-2a/1/0"), (V{"GPU-8d1e", "MIG-2a/1/0"}));
  EXPECT_EQ(parse_visible_devices("0,,1"), (V{"0"}));
  EXPECT_EQ(parse_visible_devices(""), V{});
  EXPECT_EQ(parse_visible_devices("3"), (V{"3"}));
}

// Catches: reporting the local index as if it were the physical GPU.
TEST(DescribeLocalDeviceTest, NamesTheVisibleEntry) {
  EXPECT_NE(describe_local_device(1, "4,5").find("\"5\""), std::string::npos) << describe_local_device(1, "4,5");
  EXPECT_NE(describe_local_device(1, nullptr).find("unset"), std::string::npos);
  EXPECT_NE(describe_local_device(2, "4,5").find("not in"), std::string::npos);
}

// Catches: a crash (or an OK with zero devices) on a machine without a GPU or
// a build without CUDA; the caller must get a Status saying why.
TEST(CudaDeviceCountTest, ReportsWhyWhenThereIsNoDevice) {
  const StatusOr<int> n = cuda_device_count();
  if (n.ok()) {
    EXPECT_GT(*n, 0);
  } else {
    EXPECT_FALSE(n.status().message().empty());
    if (!cuda_built()) {
      EXPECT_NE(n.status().message().find("built without CUDA"), std::string::npos) << n.status().ToString();
    }
  }
  if (!cuda_built()) {
    const StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(0, 16);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace refit
