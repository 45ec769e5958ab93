// `refit push` of a checkpoint into a device engine over cuda_ipc (label
// gpu), over the matrix of issue 16: pool slots (2, 3) x buckets smaller
// (4 MiB, the CLI's default: several buckets) and larger (1 GiB: one) than
// the checkpoint x registered or pinned host weights x staged or direct.
// The engine verifies every byte against the file.
//
// Catches issue 16's push deadlock: with registered host weights (the
// default), 2 slots and several buckets, the trainer announced bucket j-1
// only after the credit of bucket j, which the engine grants only once it
// read j-1: refit 1 never completed (the engine's bucket deadline, 10 s
// here, ends it instead of hanging the test).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cuda/gpu_test_util.h"
#include "process_harness.h"
#include "cuda/device.h"

namespace refit {
namespace {

namespace fs = std::filesystem;
using testing::ProcessGroup;

struct PushCase {
  int slots;
  std::string bucket;
  bool registered;
  std::string mode;
};

class PushGpuTest : public ::testing::TestWithParam<PushCase> {};

TEST_P(PushGpuTest, EveryByteOfTheCheckpointReachesTheDevice) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  const PushCase& c = GetParam();
  char tmpl[] = "/tmp/refit-push-gpu-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  auto made = testing::run_refit({"make-checkpoint", "--model", "tiny", "--files", "2", "--out", dir}, 120);
  ASSERT_EQ(made.exit_code, 0) << made.err;

  ProcessGroup g;
  const std::string address =
      g.spawn_coordinator({"--refits", "0", "--trainer-ranks", "1", "--engine-ranks", "1", "--setup-timeout", "60",
                           "--timeout", "60"});
  ASSERT_FALSE(address.empty());
  g.spawn("engine", {"engine", "--coordinator", address, "--rank", "0", "--engine-ranks", "1", "--trainer-ranks",
                     "1", "--model", dir, "--device", "cuda", "--transport", "cuda_ipc", "--mode", c.mode,
                     "--pool-slots", std::to_string(c.slots), "--bucket-size", c.bucket, "--setup-timeout", "60",
                     "--timeout", "60", "--bucket-timeout", "10"});
  g.spawn("push", {"push", dir, "--coordinator", address, "--engine-ranks", "1", "--transport", "cuda_ipc",
                   "--mode", c.mode, "--bucket-size", c.bucket, "--register-host-weights",
                   c.registered ? "true" : "false", "--setup-timeout", "60", "--timeout", "60"});
  const bool exited = g.wait_all(180);
  std::error_code ec;
  fs::remove_all(dir, ec);
  ASSERT_TRUE(exited) << g.all_stderr();
  for (const std::string& name : g.names()) EXPECT_EQ(g.exit_code(name), 0) << name << "\n" << g.all_stderr();
  EXPECT_NE(g.report().find("\"verified\": true"), std::string::npos) << g.report();
  EXPECT_NE(g.err("push").find("committed as version 1"), std::string::npos) << g.err("push");
}

std::vector<PushCase> Matrix() {
  std::vector<PushCase> out;
  for (int slots : {2, 3}) {
    for (const char* bucket : {"4MiB", "1GiB"}) {
      for (bool registered : {true, false}) {
        for (const char* mode : {"staged", "direct"}) out.push_back({slots, bucket, registered, mode});
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Matrix, PushGpuTest, ::testing::ValuesIn(Matrix()), [](const auto& info) {
  const PushCase& c = info.param;
  return "slots" + std::to_string(c.slots) + "_" + (c.bucket == "4MiB" ? "4MiB" : "1GiB") + "_" +
         (c.registered ? "registered" : "pinned") + "_" + c.mode;
});

}  // namespace
}  // namespace refit
