// GPU end to end (label gpu): bf16 trainers on the GPU into FP8 engines on
// the same GPU over cuda_ipc (`--quantize`, issue 20). Direct mode
// quantizes straight into the engine's weights (the device-direct sender's
// kernels), staged mode through the view's codes and scales; engines with
// two ranks split every FP8 tensor on block edges. Every code, scale and
// copied byte is verified by the engines against the CPU reference after
// every refit. Skips where no GPU exists.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cuda/gpu_test_util.h"
#include "job.h"
#include "process_harness.h"

namespace refit {
namespace {

using nlohmann::json;

struct QuantizeGpuCase {
  std::string mode, model, quantize;
  int engine_ranks, trainer_ranks;
  std::string trainer_layout = "full";  // "fsdp": sharded ranks whose cuts split blocks (the amax exchange)
};

class QuantizeGpuTest : public ::testing::TestWithParam<QuantizeGpuCase> {};

// Catches: the fused direct kernels writing a shard's codes or scales
// anywhere but where the engine holds them (the engine's verification
// fails), two trainer ranks feeding one engine rank each leaving the other's
// FP8 tensors out, staged packs of a view whose arena was never filled, and
// (the fsdp cases: 3 ranks of tiny's 1408-row MLP hold 470 rows each, so
// blocks span two ranks) GPU shards quantized without the exchanged amax.
TEST_P(QuantizeGpuTest, EveryCodeAndScaleVerified) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  const QuantizeGpuCase& c = GetParam();
  auto r = testing::run_refit({"demo", "--json", "--device", "cuda", "--transport", "cuda_ipc", "--mode", c.mode,
                               "--model", c.model, "--quantize", c.quantize, "--engine-ranks",
                               std::to_string(c.engine_ranks), "--trainer-ranks", std::to_string(c.trainer_ranks),
                               "--trainer-layout", c.trainer_layout, "--engine-gpus", "1", "--refits", "3",
                               "--bucket-size", "1MiB", "--poison-recycled", "--timeout", "120"},
                              600);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const json report = json::parse(r.out);
  EXPECT_TRUE(report["verified"].get<bool>());
  EXPECT_GT(report["quantized_tensors"].get<std::uint64_t>(), 0u);
  ASSERT_EQ(report["refits"].size(), 3u);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, QuantizeGpuTest,
    ::testing::Values(QuantizeGpuCase{"direct", "tiny", "fp8-block128", 1, 1},
                      QuantizeGpuCase{"direct", "tiny", "fp8-block128", 1, 2},
                      QuantizeGpuCase{"staged", "tiny", "fp8-block128", 1, 1},
                      QuantizeGpuCase{"direct", "tiny", "fp8-block128:*.q_proj.weight,*.o_proj.weight", 2, 2},
                      QuantizeGpuCase{"staged", "tiny-moe", "fp8-block128:*.experts.*", 1, 1},
                      QuantizeGpuCase{"direct", "tiny", "fp8-block128", 1, 3, "fsdp"},
                      QuantizeGpuCase{"staged", "tiny", "fp8-block128", 1, 3, "fsdp"},
                      QuantizeGpuCase{"direct", "tiny-moe", "fp8-block128", 1, 2, "fsdp"},
                      QuantizeGpuCase{"staged", "tiny-moe", "fp8-block128", 1, 2, "fsdp"}),
    [](const auto& info) {
      const QuantizeGpuCase& c = info.param;
      return c.mode + "_" + (c.model == "tiny" ? "tiny" : "tinymoe") + "_" + std::to_string(c.trainer_ranks) + "x" +
             std::to_string(c.engine_ranks) + (c.trainer_layout == "full" ? "" : "_" + c.trainer_layout);
    });

}  // namespace
}  // namespace refit
