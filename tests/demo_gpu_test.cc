// GPU end to end (label gpu): trainer and engine ranks as separate processes
// on one GPU, over cuda_ipc, staged (receive pool in device memory, poisoned
// when recycled) and direct (trainers write into the engine's weights); every
// byte verified on the device after every refit. Skips where no GPU exists.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cuda/gpu_test_util.h"
#include "process_harness.h"
#include "refit/device.h"

namespace refit {
namespace {

using nlohmann::json;

struct GpuCase {
  std::string mode;
  std::string model;
  std::string bucket;
  int engine_ranks;
};

class GpuDemoTest : public ::testing::TestWithParam<GpuCase> {};

TEST_P(GpuDemoTest, EveryByteVerifiedOnTheDevice) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  const GpuCase& c = GetParam();
  auto r = testing::run_refit({"demo", "--json", "--device", "cuda", "--transport", "cuda_ipc", "--mode", c.mode,
                               "--model", c.model, "--engine-ranks", std::to_string(c.engine_ranks), "--refits", "3",
                               "--bucket-size", c.bucket, "--poison-recycled", "--timeout", "120"},
                              600);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  json report = json::parse(r.out);
  EXPECT_TRUE(report["verified"].get<bool>());
  EXPECT_EQ(report["device"], "cuda");
  EXPECT_EQ(report["mode"], c.mode);
  ASSERT_EQ(report["refits"].size(), 3u);
  for (const auto& rank : report["ranks"]) EXPECT_EQ(rank["tensors"], report["tensors"]) << rank.dump();
}

INSTANTIATE_TEST_SUITE_P(Modes, GpuDemoTest,
                         ::testing::Values(GpuCase{"staged", "tiny", "512KiB", 1}, GpuCase{"direct", "tiny", "4MiB", 1},
                                           GpuCase{"staged", "tiny-moe", "1MiB", 1},
                                           GpuCase{"direct", "tiny-moe", "1MiB", 1}),
                         [](const auto& info) {
                           std::string m = info.param.model == "tiny" ? "tiny" : "tinymoe";
                           return info.param.mode + "_" + m;
                         });

// DESIGN.md rule 7 on the device: an engine rank whose base_gpu_id + rank is
// not a local index inside CUDA_VISIBLE_DEVICES fails at setup naming it.
TEST(GpuDemo, EngineRankBeyondTheVisibleDevicesFailsAtSetup) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  int visible = *cuda_device_count();
  auto r = testing::run_refit({"demo", "--device", "cuda", "--transport", "cuda_ipc", "--engine-ranks",
                               std::to_string(visible + 1), "--refits", "1", "--setup-timeout", "20"},
                              120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("engine rank " + std::to_string(visible)), std::string::npos) << r.err;
}

}  // namespace
}  // namespace refit
