// Many engines on the GPU (label gpu; issue 18): engines of one rank each,
// every process on one GPU (--engine-gpus 1), relayed over cuda_ipc from
// device receive pool to device receive pool (a device copy into the
// child's mapped slot, then kLanded), recycled slots poisoned; every byte
// verified on the device after every refit. Skips where no GPU exists.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cuda/gpu_test_util.h"
#include "job.h"
#include "process_harness.h"
#include "cuda/device.h"

namespace refit {
namespace {

using nlohmann::json;

// A chain of three engines over cuda_ipc, 1 MiB buckets: every engine
// commits every version, verified; the trainer sends one engine's bytes.
// Catches: a host memcpy into a device slot (a crash), a kLanded before the
// device copy finished (the child reads poison: verification fails).
TEST(ManyEnginesGpu, AChainOfThreeEnginesOverCudaIpcVerifiesEveryByte) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  auto r = testing::run_refit({"demo", "--json", "--device", "cuda", "--transport", "cuda_ipc", "--engines", "3",
                               "--engine-ranks", "1", "--engine-gpus", "1", "--refits", "3", "--bucket-size", "1MiB",
                               "--poison-recycled", "--timeout", "120"},
                              600);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const json report = json::parse(r.out);
  EXPECT_TRUE(report["verified"].get<bool>()) << report.dump(2);
  ASSERT_EQ(report["engines"].size(), 3u);
  for (const json& engine : report["engines"]) EXPECT_EQ(engine["versions"], json::array({1, 2, 3}));
  for (const json& refit : report["refits"]) {
    EXPECT_EQ(refit["trainer_link_bytes"], refit["bytes"]) << refit.dump();
    EXPECT_EQ(refit["wire_bytes"].get<std::uint64_t>(), 3 * refit["bytes"].get<std::uint64_t>()) << refit.dump();
  }
}

}  // namespace
}  // namespace refit
