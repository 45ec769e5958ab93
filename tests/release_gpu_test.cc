// GPU end to end (label gpu): release between refits over cuda_ipc on one
// GPU (issue 21 item 6). After every commit the trainers close their IPC
// mappings, then the engines free the receive pool (and, with --shadow, the
// arena not served); the bytes each engine rank reports are the growth of
// the device's free memory across its release. Skips where no GPU exists.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cuda/gpu_test_util.h"
#include "process_harness.h"
#include "refit/model.h"
#include "refit/reference_engine.h"

namespace refit {
namespace {

using nlohmann::json;

// Catches: a trainer that keeps its IPC mapping (the engine's cudaFree then
// returns nothing to the device: released_bytes far below the pool), a pool
// not re-created or not re-opened at the acquire (the next refit fails or
// its verification does), the shadow arena kept.
TEST(ReleaseGpu, TheDeviceGetsThePoolAndTheShadowArenaBackEveryRefit) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  const std::uint64_t arena = shadow_arena_stride(engine_stream(make_model("tiny", -1).value(), 0, 1));
  for (bool shadow : {false, true}) {
    std::vector<std::string> args = {"demo", "--json", "--device", "cuda", "--transport", "cuda_ipc", "--model", "tiny",
                                     "--engine-ranks", "1", "--engine-gpus", "1", "--refits", "3", "--bucket-size",
                                     "4MiB", "--pool-slots", "4", "--release-between-refits", "--timeout", "120"};
    if (shadow) args.push_back("--shadow");
    auto r = testing::run_refit(args, 600);
    ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
    const json report = json::parse(r.out);
    EXPECT_TRUE(report["verified"].get<bool>());
    ASSERT_EQ(report["refits"].size(), 3u);
    const std::uint64_t pool = 4 * (std::uint64_t{4} << 20);  // 4 slots of (at most) the 4 MiB bucket
    for (const json& refit : report["refits"]) {
      const std::uint64_t returned = refit["released_bytes"][0].get<std::uint64_t>();
      // The driver counts in pages of 2 MiB. What returns with the pool (and
      // the arena) also includes what refit held beside them for the refit
      // (the pool's landing events, the prepared copies' descriptors): about
      // 32 MiB more on an H100 for tiny.
      EXPECT_GE(returned + (std::uint64_t{2} << 20), (shadow ? arena : 0) + pool / 2) << refit.dump();
      EXPECT_LE(returned, (shadow ? arena : 0) + pool + (std::uint64_t{64} << 20)) << refit.dump();
    }
  }
}

}  // namespace
}  // namespace refit
