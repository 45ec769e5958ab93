// GPU end to end (label gpu): trainer and engine ranks as separate processes
// on one GPU, over cuda_ipc, staged (receive pool in device memory, poisoned
// when recycled) and direct (trainers write into the engine's weights); every
// byte verified on the device after every refit. Skips where no GPU exists.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cuda/gpu_test_util.h"
#include "job.h"
#include "process_harness.h"
#include "cuda/device.h"

namespace refit {
namespace {

using nlohmann::json;
using testing::ProcessGroup;

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

// cuda_ipc on one GPU: the trainer announces a bucket (kLanded) as soon as
// its pack is queued, with the slot's landing event recorded after it; the
// engine reads the slot only once that event completed. Buckets of 8 GiB
// take ~4 ms to pack: far longer than kLanded takes to arrive, and longer
// than a time slice, so an apply launched early runs in the middle of the
// pack (two processes' kernels on one GPU take turns; a pack shorter than a
// slice finishes before the apply can start, which hid this with smaller
// buckets). Recycled slots are poisoned. Catches: an engine that reads the
// slot when kLanded arrives (CudaIpcTarget::wait_landed returning at once).
TEST(GpuDemo, StagedBucketsAnnouncedBeforeTheirPackFinishedAreReadAfterIt) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  auto r = testing::run_refit({"demo", "--json", "--device", "cuda", "--transport", "cuda_ipc", "--mode", "staged",
                               "--model", "llama3-8b", "--engine-ranks", "1", "--refits", "3", "--bucket-size",
                               "8GiB", "--poison-recycled", "--timeout", "120"},
                              600);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  json report = json::parse(r.out);
  EXPECT_TRUE(report["verified"].get<bool>());
  ASSERT_EQ(report["refits"].size(), 3u);
}

// DESIGN.md rule 7 on the device: an engine rank whose base_gpu_id + rank is
// not a local index inside CUDA_VISIBLE_DEVICES fails at setup naming it,
// with engine_local_device's own error (run_engine maps through it; the
// mapping itself is unit-tested on the CPU in src/cuda/device_test.cc,
// EngineLocalDeviceTest.LocalIndexNotPhysicalId). Catches: run_engine not
// checking the local index (any later CUDA error would fail the demo too,
// without this text).
TEST(GpuDemo, EngineRankBeyondTheVisibleDevicesFailsAtSetup) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  int visible = *cuda_device_count();
  auto r = testing::run_refit({"demo", "--device", "cuda", "--transport", "cuda_ipc", "--engine-ranks",
                               std::to_string(visible + 1), "--refits", "1", "--setup-timeout", "20"},
                              120);
  EXPECT_NE(r.exit_code, 0);
  const std::string v = std::to_string(visible);
  EXPECT_NE(r.err.find("engine rank " + v), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("engine device: base_gpu_id + tp_rank = " + v + " is not a visible device (base_gpu_id 0, "
                       "tp_rank " + v + ", " + v + " visible device(s)); base_gpu_id is a local index inside "
                       "CUDA_VISIBLE_DEVICES"),
            std::string::npos)
      << r.err;
}

class CudaIpcAcrossGpusTest : public ::testing::TestWithParam<std::string> {};

// Issue "Several GPUs": a trainer rank whose weights are on GPU 0 refits an
// engine rank on GPU 1 over cuda_ipc, every byte verified on the device.
// Catches: the trainer's pack kernel writing into the engine's slot (staged)
// or weights (direct) on another GPU without peer access enabled from the
// trainer's GPU (an illegal address: seen on the 2-GPU H200 machine before
// open_target_on enabled it), and trainers or engines placed on the wrong GPU.
TEST_P(CudaIpcAcrossGpusTest, TrainerOnGpu0RefitsAnEngineOnGpu1) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  if (*cuda_device_count() < 2) GTEST_SKIP() << "needs two visible GPUs, " << *cuda_device_count() << " visible";
  const std::string mode = GetParam();
  testing::JobSpec spec;
  spec.engine_ranks = 1;
  spec.trainer_ranks = 1;
  spec.refits = 3;
  spec.transport = "cuda_ipc";
  spec.model = "tiny-moe";
  spec.setup_timeout_s = 60;
  spec.refit_timeout_s = 60;
  spec.rank_args = {"--device", "cuda", "--mode", mode};
  spec.extra["engine rank 0"] = {"--base-gpu-id", "1"};
  if (mode == "staged") spec.extra["engine rank 0"].push_back("--poison-recycled");
  spec.extra["trainer rank 0"] = {"--gpu", "0"};
  ProcessGroup group;
  ASSERT_TRUE(testing::start_job(group, spec)) << group.all_stderr();
  ASSERT_TRUE(group.wait_all(240)) << "hung:\n" << group.all_stderr();
  for (const auto& name : group.names()) EXPECT_EQ(group.exit_code(name), 0) << name << "\n" << group.all_stderr();
  const json report = json::parse(group.report());
  EXPECT_TRUE(report["verified"].get<bool>()) << report.dump();
  EXPECT_EQ(report["refits"].size(), 3u) << report.dump();
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaIpcAcrossGpusTest, ::testing::Values("staged", "direct"));

}  // namespace
}  // namespace refit
