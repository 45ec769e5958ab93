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

// An engine joining the running job on the GPU (issue 18 item 4): a chain
// of engines 0 -> 1 over cuda_ipc with --max-engines 3; engine 2 is
// started while refit 2 is in flight (the trainer stopped inside it), and
// once refit 2 commits engine 1 sends it version 2 read back from its
// device weights (device copies into device buffers, then into engine 2's
// mapped slots); engine 2 verifies it on the device and commits 3 and 4
// with the others. Catches: a catch-up that reads device weights as host
// memory (a crash), a joiner refused because its parent holds device
// weights (catch_up false in its join).
TEST(ManyEnginesGpu, AnEngineJoiningOnTheGpuCatchesUpFromItsParentsDeviceWeights) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  testing::JobSpec spec;
  spec.engines = 2;
  spec.engine_ranks = 1;
  spec.trainer_ranks = 1;
  spec.refits = 4;
  spec.transport = "cuda_ipc";
  spec.bucket_size = "4MiB";
  spec.rank_args = {"--device", "cuda"};
  spec.coordinator_args = {"--max-engines", "3"};
  for (const char* engine : {"engine 0 rank 0", "engine 1 rank 0", "engine 2 rank 0"}) {
    spec.extra[engine] = {"--engine-gpus", "1", "--poison-recycled"};
  }
  testing::stop_mid_refit(spec, "trainer rank 0", 2);
  testing::ProcessGroup group;
  ASSERT_TRUE(testing::start_job(group, spec)) << group.all_stderr();
  ASSERT_TRUE(testing::wait_for_refit_under_way(group, "trainer rank 0", 2)) << group.all_stderr();
  group.spawn("engine 2 rank 0",
              testing::job_rank_args(spec, testing::job_coordinator_address(group), "engine", 0, 2));
  ASSERT_TRUE(testing::wait_for_text(group, "coordinator", "engine 2 rank 0 joined from")) << group.all_stderr();
  group.resume("trainer rank 0");
  ASSERT_TRUE(group.wait_all(300)) << group.all_stderr();
  for (const auto& name : group.names()) EXPECT_EQ(group.exit_code(name), 0) << name << "\n" << group.all_stderr();
  const json report = json::parse(group.report());
  EXPECT_TRUE(report["verified"].get<bool>()) << report.dump(2);
  ASSERT_EQ(report["engines"].size(), 3u) << report.dump(2);
  EXPECT_EQ(report["engines"][2]["joined_at"], 2u) << report["engines"][2].dump();
  EXPECT_EQ(report["engines"][2]["versions"], json::array({2, 3, 4})) << report["engines"][2].dump();
  EXPECT_TRUE(report["engines"][2]["catch_up"]["verified"].get<bool>()) << report["engines"][2].dump();
}

}  // namespace
}  // namespace refit
