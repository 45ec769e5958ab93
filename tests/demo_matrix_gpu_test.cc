// `refit demo` on the GPU over cuda_ipc (label gpu), over issue 16's matrix
// for the demo: pool slots (2, 3) x buckets smaller (4 MiB: several per
// rank) and larger (1 GiB: one) than a rank's stream x staged or direct,
// plus the demo and a push with every setting left at its default. Each
// engine rank verifies every byte on the device.
//
// Catches a deadlock or a wrong byte that only some pool/bucket/mode
// combination shows (issue 16: a push deadlock with the defaults hid behind
// tests that all used 3 slots and 64 MiB buckets): every case must exit 0
// with "verified": true within its deadline.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cuda/gpu_test_util.h"
#include "process_harness.h"

namespace refit {
namespace {

namespace fs = std::filesystem;
using testing::ProcessGroup;

struct DemoCase {
  int slots;
  std::string bucket;
  std::string mode;
};

class DemoMatrixGpuTest : public ::testing::TestWithParam<DemoCase> {};

TEST_P(DemoMatrixGpuTest, EveryRefitVerifiesOnTheDevice) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  const DemoCase& c = GetParam();
  auto r = testing::run_refit({"demo", "--json", "--device", "cuda", "--transport", "cuda_ipc", "--mode", c.mode,
                               "--pool-slots", std::to_string(c.slots), "--bucket-size", c.bucket, "--engine-ranks",
                               "1", "--refits", "3", "--timeout", "60"},
                              240);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"verified\": true"), std::string::npos) << r.out;
}

std::vector<DemoCase> Matrix() {
  std::vector<DemoCase> out;
  for (int slots : {2, 3}) {
    for (const char* bucket : {"4MiB", "1GiB"}) {
      for (const char* mode : {"staged", "direct"}) out.push_back({slots, bucket, mode});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Matrix, DemoMatrixGpuTest, ::testing::ValuesIn(Matrix()), [](const auto& info) {
  const DemoCase& c = info.param;
  return "slots" + std::to_string(c.slots) + "_" + (c.bucket == "4MiB" ? "4MiB" : "1GiB") + "_" + c.mode;
});

// The defaults, as a user runs them: no --pool-slots, --bucket-size or
// --mode (2 slots, 4 MiB, staged), only the device, the transport and one
// engine rank (the default 3 ranks need 3 GPUs: rule 7 refuses the rest).
TEST(DefaultsGpuTest, TheDemoWithDefaultSettingsVerifies) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  auto r = testing::run_refit({"demo", "--json", "--device", "cuda", "--transport", "cuda_ipc", "--engine-ranks", "1",
                               "--timeout", "60"},
                              240);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"verified\": true"), std::string::npos) << r.out;
}

// Issue 16's first report: `refit push CKPT` into an engine started with
// --device cuda --transport cuda_ipc and otherwise the defaults (4 MiB
// buckets, 2 slots, staged, registered host weights) never completed.
TEST(DefaultsGpuTest, APushWithDefaultSettingsVerifies) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  char tmpl[] = "/tmp/refit-push-defaults-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  auto made = testing::run_refit({"make-checkpoint", "--model", "tiny", "--files", "4", "--out", dir}, 120);
  ASSERT_EQ(made.exit_code, 0) << made.err;
  ProcessGroup g;
  const std::string address = g.spawn_coordinator({"--refits", "0"});
  ASSERT_FALSE(address.empty());
  g.spawn("engine", {"engine", "--coordinator", address, "--rank", "0", "--model", dir, "--device", "cuda",
                     "--transport", "cuda_ipc", "--bucket-timeout", "10"});
  g.spawn("push", {"push", dir, "--coordinator", address, "--transport", "cuda_ipc"});
  const bool exited = g.wait_all(180);
  std::error_code ec;
  fs::remove_all(dir, ec);
  ASSERT_TRUE(exited) << g.all_stderr();
  for (const std::string& name : g.names()) EXPECT_EQ(g.exit_code(name), 0) << name << "\n" << g.all_stderr();
  EXPECT_NE(g.report().find("\"verified\": true"), std::string::npos) << g.report();
}

}  // namespace
}  // namespace refit
