// Partial refits on the GPU (issue 22 item 4): `refit demo --device cuda
// --transport cuda_ipc --only ...` in staged and direct mode, live and
// shadow weights: refit 1 full, later refits move only the globs' tensors,
// every tensor verified on the device against the version of the last
// refit that moved it; with --shadow the tensors outside the globs are
// copied into the landing arena on the device (reference_engine_partial.cc).
// Catches: the device pack replaying the full plan's prepared copy for a
// subset bucket (device_kernel_sender.cc keys packs by plan digest: without
// it refit 2 packs the wrong tensors and verification fails), no device
// catch-up in shadow mode.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda/gpu_test_util.h"
#include "job.h"
#include "process_harness.h"

namespace refit {
namespace {

using nlohmann::json;

TEST(PartialGpu, PartialRefitsOverCudaIpcVerifyEveryTensor) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  for (const char* mode : {"staged", "direct"}) {
    for (bool shadow : {false, true}) {
      std::vector<std::string> args = {"demo", "--json", "--device", "cuda", "--transport", "cuda_ipc", "--mode", mode,
                                       "--model", "tiny", "--engine-ranks", "2", "--engine-gpus", "1", "--refits", "4",
                                       "--bucket-size", "1MiB", "--only", "*.q_proj.weight,*norm*", "--timeout", "120"};
      if (shadow) args.push_back("--shadow");
      auto r = testing::run_refit(args);
      ASSERT_EQ(r.exit_code, 0) << mode << (shadow ? " shadow" : "") << "\n" << r.err << r.out;
      const json report = json::parse(r.out);
      EXPECT_TRUE(report["verified"].get<bool>()) << report.dump();
      ASSERT_EQ(report["refits"].size(), 4u);
      EXPECT_FALSE(report["refits"][0].contains("only"));
      for (std::size_t v = 1; v < 4; ++v) {
        EXPECT_EQ(report["refits"][v]["only"], json({"*.q_proj.weight", "*norm*"})) << report["refits"][v].dump();
        EXPECT_LT(report["refits"][v]["bytes"].get<std::uint64_t>(),
                  report["bytes_per_refit"].get<std::uint64_t>() / 10);
      }
    }
  }
}

}  // namespace
}  // namespace refit
