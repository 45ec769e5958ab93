// Delta refits on the GPU (issue 22 item 1): `--delta --device cuda
// --transport cuda_ipc` (and ucx: the remote delta sender, below; nccl is
// in nccl_gpu_test.cc). The trainer packs each bucket on its device,
// encodes it there against the version the engine rank committed
// (runtime/senders/device_delta_sender.cc) and copies the smaller into the
// slot; the engine decodes in the slot on its device over the committed
// bytes of its device weights (receiver_batches.cc decode_on_device) and
// verifies every byte on the device as before.
//
// Catches: a device encoding announced as raw (the engine applies the
// encoding's bytes: verification fails), a decode over the wrong base (the
// pack's gaps not zero, or the bases not swapped at the commit: verification
// of refit 3 fails), bases kept through a failed refit into live weights
// (the engine offers no base, so refit 3 must be full).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda/gpu_test_util.h"
#include "job.h"
#include "process_harness.h"
#include "testing/ucx_test_util.h"

namespace refit {
namespace {

using nlohmann::json;

json run_gpu_delta(const std::string& transport, const std::string& fraction, std::vector<std::string> extra = {},
                   const std::string& engine_ranks = "2") {
  std::vector<std::string> args = {"demo", "--json", "--device", "cuda", "--transport", transport, "--model",
                                   "tiny", "--engine-ranks", engine_ranks, "--engine-gpus", "1", "--refits", "3",
                                   "--bucket-size", "1MiB", "--delta", "--change-fraction", fraction, "--timeout",
                                   "120"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = testing::run_refit(args);
  EXPECT_EQ(r.exit_code, 0) << transport << " " << fraction << "\n" << r.err << r.out;
  return r.exit_code == 0 ? json::parse(r.out) : json();
}

// At 1% changed, every bucket after the first refit goes encoded in under
// a tenth of the bytes; at 100% none; every refit verifies.
void expect_deltas_after_the_first(const std::string& transport, const std::vector<std::string>& shadow) {
  const json sparse = run_gpu_delta(transport, "0.01", shadow);
  const json dense = run_gpu_delta(transport, "1", shadow);
  ASSERT_FALSE(sparse.is_null() || dense.is_null());
  for (const json* report : {&sparse, &dense}) {
    EXPECT_TRUE((*report)["verified"].get<bool>()) << report->dump();
    ASSERT_EQ((*report)["refits"].size(), 3u) << report->dump();
  }
  EXPECT_EQ(sparse["refits"][0]["encodings"]["words"], 0u) << transport << ": no base before the first commit";
  for (std::size_t v = 1; v < 3; ++v) {
    const json& s = sparse["refits"][v];
    EXPECT_EQ(s["encodings"]["full"], 0u) << transport << ": " << s.dump();
    EXPECT_LT(s["wire_bytes"].get<std::uint64_t>(), s["bytes"].get<std::uint64_t>() / 10) << transport << s.dump();
    EXPECT_EQ(dense["refits"][v]["encodings"]["words"], 0u) << transport << ": every word changed";
  }
}

// Over cuda_ipc (kDeviceDelta) and over ucx (kRemoteDelta: this build's
// UCX cannot register CUDA memory, so the trainer stages the chosen bytes
// through pinned buffers and the engine's stager copies them to its device
// slot), live and shadow weights.
TEST(DeltaGpu, LaterRefitsSendOnlyTheChangedWordsAndEveryRefitVerifies) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  std::vector<std::string> transports = {"cuda_ipc"};
  if (testing::ucx_built()) transports.push_back("ucx");
  for (const std::string& transport : transports) {
    for (const std::vector<std::string>& shadow : {std::vector<std::string>{}, {"--shadow"}}) {
      SCOPED_TRACE(transport + (shadow.empty() ? ", live" : ", shadow"));
      expect_deltas_after_the_first(transport, shadow);
    }
  }
}

// Device weights quantized on the trainer's GPU (--quantize fp8-block128)
// into an FP8 engine, delta-encoded on the device: later refits encoded,
// every code and scale verified. Catches: the device bases holding the bf16
// pack instead of the FP8 one (the decode would fail or verification).
TEST(DeltaGpu, QuantizedBucketsAreEncodedOnTheDevice) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  const json report = run_gpu_delta("cuda_ipc", "0.01", {"--quantize", "fp8-block128"}, "1");  // whole blocks
  ASSERT_FALSE(report.is_null());
  EXPECT_TRUE(report["verified"].get<bool>()) << report.dump();
  ASSERT_EQ(report["refits"].size(), 3u) << report.dump();
  for (std::size_t v = 1; v < 3; ++v) {
    const json& s = report["refits"][v];
    EXPECT_EQ(s["encodings"]["full"], 0u) << s.dump();
    EXPECT_LT(s["wire_bytes"].get<std::uint64_t>(), s["bytes"].get<std::uint64_t>() / 10) << s.dump();
  }
}

TEST(DeltaGpu, AFailedRefitIntoLiveWeightsSendsTheNextOneFull) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  testing::JobSpec spec;
  spec.refits = 4;
  spec.rank_args = {"--device", "cuda", "--delta", "--change-fraction", "0.01"};
  for (int e = 0; e < spec.engine_ranks; ++e) {
    spec.extra["engine rank " + std::to_string(e)] = {"--engine-gpus", "1"};  // both on the one GPU
  }
  spec.transport = "cuda_ipc";
  spec.extra["trainer rank 0"] = {"--debug-fail-refit", "2"};
  testing::ProcessGroup group;
  ASSERT_TRUE(testing::start_job(group, spec)) << group.all_stderr();
  ASSERT_TRUE(group.wait_all(120)) << group.all_stderr();
  const json report = json::parse(group.report());
  ASSERT_EQ(report["refits"].size(), 3u) << report.dump(2);
  for (const json& r : report["refits"]) EXPECT_TRUE(r["verified"].get<bool>()) << r.dump();
  EXPECT_EQ(report["refits"][1]["encodings"]["words"], 0u) << "refit 3 after the failure: " << report.dump(2);
  EXPECT_GT(report["refits"][2]["encodings"]["words"].get<std::uint64_t>(), 0u) << report["refits"][2].dump();
}

}  // namespace
}  // namespace refit
