// Sharded trainers on the GPU (issue 19, label gpu): M trainer processes
// each hold only their own shards in device memory and write them straight
// into the N engine processes' device weights over cuda_ipc (direct mode);
// every byte is verified on the device after every refit. Skips where no
// GPU exists.
#include <gtest/gtest.h>

#include <cctype>
#include <string>

#include <nlohmann/json.hpp>

#include "cuda/gpu_test_util.h"
#include "process_harness.h"

namespace refit {
namespace {

using nlohmann::json;

struct ShardedGpuCase {
  std::string layout, model;
  int trainers, engines;
  std::string experts = "tp";  // --engine-experts
  std::string mode = "direct";
};

class ShardedGpuTest : public ::testing::TestWithParam<ShardedGpuCase> {};

// Catches: a trainer rank writing another rank's runs or at the wrong arena
// offset (verification on the device fails), an engine rank that counts a
// bucket landed before every trainer's part did (it verifies too early:
// fails), and trainers that send more or less than the engines hold (the
// byte sums).
TEST_P(ShardedGpuTest, EveryByteComesFromTheTrainerThatHoldsItAndVerifiesOnTheDevice) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  const ShardedGpuCase& c = GetParam();
  // --engine-gpus 1: every engine rank on the one GPU a test machine may have.
  std::vector<std::string> args = {"demo", "--json", "--device", "cuda", "--transport", "cuda_ipc", "--mode", c.mode,
                                   "--trainer-layout", c.layout, "--trainer-ranks", std::to_string(c.trainers),
                                   "--engine-ranks", std::to_string(c.engines), "--engine-gpus", "1",
                                   "--model", c.model, "--engine-experts", c.experts, "--refits", "3",
                                   "--bucket-size", "1MiB", "--timeout", "120"};
  if (c.mode == "staged") args.push_back("--poison-recycled");  // a slot reused holds no old bytes
  auto r = testing::run_refit(args, 600);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  json report = json::parse(r.out);
  EXPECT_TRUE(report["verified"].get<bool>());
  EXPECT_EQ(report["device"], "cuda");
  ASSERT_EQ(report["refits"].size(), 3u);
  std::uint64_t sent = 0;
  for (const auto& t : report["trainer_ranks"]) sent += t["bytes"].get<std::uint64_t>();
  EXPECT_EQ(sent, report["bytes_per_refit"].get<std::uint64_t>());
  EXPECT_EQ(report["gathered_bytes"], 0);
  EXPECT_EQ(report["duplicate_bytes"], 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ShardedGpuTest,
                         ::testing::Values(ShardedGpuCase{"fsdp", "tiny", 4, 2},         // M > N
                                           ShardedGpuCase{"fsdp", "tiny", 1, 3},         // M < N
                                           ShardedGpuCase{"tp:2,fsdp:2", "tiny", 4, 3},  // products, uneven
                                           ShardedGpuCase{"tp", "tiny-moe", 2, 4},
                                           // Expert-parallel engines: per-expert tensors whole on one rank.
                                           ShardedGpuCase{"fsdp", "tiny-moe", 2, 3, "ep"},
                                           // Staged: several writers per slot, each waiting for its own part.
                                           ShardedGpuCase{"fsdp", "tiny", 4, 2, "tp", "staged"},
                                           ShardedGpuCase{"tp:2,fsdp:2", "tiny-moe", 4, 3, "ep", "staged"}),
                         [](const auto& info) {
                           std::string name = info.param.layout + "_" + info.param.model + "_" +
                                              std::to_string(info.param.trainers) + "x" +
                                              std::to_string(info.param.engines) + "_" + info.param.experts +
                                              "_" + info.param.mode;
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace refit
