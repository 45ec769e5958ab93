// The ucx transport with CUDA memory (label gpu; issue 5): trainer weights
// and engine weights on the device, `refit demo --device cuda --transport
// ucx`, staged and direct, over UCX's tcp (active-message writes) and
// shared-memory transports, every byte verified on the device after every
// refit. Where this UCX build cannot register CUDA memory (Debian's), the
// trainer packs on the device and copies each bucket into pinned host
// buffers before it writes, and the engine copies every arriving chunk
// through pinned buffers into its device memory: the report must say
// "ucx_memory_path": "host-staged", and stderr must say so once per process.
//
// Skips with the reason where there is no CUDA device or no UCX.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cuda/gpu_test_util.h"
#include "process_harness.h"
#include "transport/transport.h"
#include "testing/scoped_env.h"
#include "testing/ucx_test_util.h"

namespace refit {
namespace {

using nlohmann::json;

std::size_t Count(const std::string& haystack, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++n;
  return n;
}

struct UcxGpuCase {
  std::string tls;
  std::string mode;
  std::string model;
  std::string bucket;
  int engine_ranks;
};

class UcxGpuTest : public ::testing::TestWithParam<UcxGpuCase> {};

// Catches: a device pointer handed to UCX as host memory (the engine's
// memcpy of a chunk into device memory, or the trainer's write from device
// memory, crashes or lands nothing), a last chunk acknowledged before its
// host-to-device copy finished (kLanded overtakes the bytes: verification
// fails), a path taken without saying so, or said more than once per process.
TEST_P(UcxGpuTest, DeviceWeightsVerifiedAndThePathReported) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  REFIT_SKIP_WITHOUT_UCX();
  const UcxGpuCase& c = GetParam();
  testing::ScopedEnv tls("UCX_TLS", c.tls);
  auto staged = make_transport("ucx");
  ASSERT_TRUE(staged.ok());
  const bool host_staged = (*staged)->capabilities().device_memory_staged;
  auto r = testing::run_refit({"demo", "--json", "--device", "cuda", "--transport", "ucx", "--mode", c.mode,
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
  EXPECT_EQ(report["ucx_memory_path"], host_staged ? "host-staged" : "cuda") << r.out;
  if (host_staged) {
    // Once per process: every engine rank and every trainer rank (the demo
    // runs each rank as its own process).
    const std::size_t processes = static_cast<std::size_t>(2 * c.engine_ranks);
    EXPECT_EQ(Count(r.err, "cannot register CUDA memory"), processes) << r.err;
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, UcxGpuTest,
                         ::testing::Values(UcxGpuCase{"tcp", "staged", "tiny", "512KiB", 1},
                                           UcxGpuCase{"tcp", "direct", "tiny", "1MiB", 1},
                                           UcxGpuCase{"tcp", "staged", "tiny-moe", "1MiB", 1},
                                           UcxGpuCase{"sm", "staged", "tiny", "512KiB", 1},
                                           UcxGpuCase{"sm", "direct", "tiny-moe", "1MiB", 1}),
                         [](const auto& info) {
                           const UcxGpuCase& c = info.param;
                           return c.tls + "_" + c.mode + "_" + (c.model == "tiny" ? "tiny" : "tinymoe");
                         });

}  // namespace
}  // namespace refit
