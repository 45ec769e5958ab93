// Sharded trainers on the GPU (issue 19, label gpu): M trainer processes
// each hold only their own shards in device memory and write them straight
// into the N engine processes' device weights over cuda_ipc (direct mode) or
// into their receive pools (staged); every byte is verified on the device
// after every refit. Skips where no GPU exists.
#include <gtest/gtest.h>

#include <cctype>
#include <string>

#include <nlohmann/json.hpp>

#include "cuda/gpu_test_util.h"
#include "job.h"
#include "process_harness.h"
#include "testing/ucx_test_util.h"

namespace refit {
namespace {

using nlohmann::json;
using testing::ProcessGroup;

struct ShardedGpuCase {
  std::string layout, model;
  int trainers, engines;
  std::string experts = "tp";  // --engine-experts
  std::string mode = "direct";
  std::string transport = "cuda_ipc";
  std::string names = "hf";  // --trainer-names
  std::string trainer_device = "cuda";    // --trainer-device: cpu for host shards into the device engines
  std::string register_host = "true";     // --register-host-weights
};

class ShardedGpuTest : public ::testing::TestWithParam<ShardedGpuCase> {};

// Catches: a trainer rank writing another rank's runs or at the wrong arena
// offset (verification on the device fails), a pinned sender copying its
// whole staging buffer into the slot or scattering whole bucket entries
// into the weights over the other ranks' parts (the _host_pinned cases),
// an engine rank that counts a bucket landed before every trainer's part
// did (it verifies too early: fails), and trainers that send more or less
// than the engines hold (the byte sums).
TEST_P(ShardedGpuTest, EveryByteComesFromTheTrainerThatHoldsItAndVerifiesOnTheDevice) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  const ShardedGpuCase& c = GetParam();
  // --engine-gpus 1: every engine rank on the one GPU a test machine may have.
  if (c.transport == "ucx") REFIT_SKIP_WITHOUT_UCX();
  std::vector<std::string> args = {"demo", "--json", "--device", "cuda", "--transport", c.transport, "--mode", c.mode,
                                   "--trainer-layout", c.layout, "--trainer-ranks", std::to_string(c.trainers),
                                   "--engine-ranks", std::to_string(c.engines), "--engine-gpus", "1",
                                   "--model", c.model, "--engine-experts", c.experts, "--refits", "3",
                                   "--bucket-size", "1MiB", "--timeout", "120", "--trainer-names", c.names,
                                   "--trainer-device", c.trainer_device, "--register-host-weights", c.register_host};
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
                                           ShardedGpuCase{"tp:2,fsdp:2", "tiny-moe", 4, 3, "ep", "staged"},
                                           // ucx: each rank puts only its part's ranges into the slot.
                                           ShardedGpuCase{"fsdp", "tiny", 3, 2, "tp", "staged", "ucx"},
                                           ShardedGpuCase{"tp:2,fsdp:2", "tiny-moe", 4, 3, "tp", "staged", "ucx"},
                                           ShardedGpuCase{"fsdp", "tiny", 3, 2, "tp", "direct", "ucx"},
                                           // Megatron-named trainers: sub-slices of fused and stacked tensors.
                                           ShardedGpuCase{"fsdp", "tiny", 3, 2, "tp", "direct", "cuda_ipc", "megatron"},
                                           ShardedGpuCase{"fsdp", "tiny-moe", 4, 3, "ep", "staged", "cuda_ipc",
                                                          "megatron"},
                                           // Host shards into device engines: registered (the copy engines read
                                           // them) or through pinned buffers, direct and staged.
                                           ShardedGpuCase{.layout = "fsdp", .model = "tiny", .trainers = 4,
                                                          .engines = 2, .trainer_device = "cpu"},
                                           ShardedGpuCase{.layout = "tp:2,fsdp:2", .model = "tiny-moe", .trainers = 4,
                                                          .engines = 3, .mode = "staged", .trainer_device = "cpu"},
                                           ShardedGpuCase{.layout = "fsdp", .model = "tiny", .trainers = 3,
                                                          .engines = 2, .trainer_device = "cpu",
                                                          .register_host = "false"},
                                           ShardedGpuCase{.layout = "fsdp", .model = "tiny", .trainers = 3,
                                                          .engines = 2, .mode = "staged", .trainer_device = "cpu",
                                                          .register_host = "false"}),
                         [](const auto& info) {
                           std::string name = info.param.layout + "_" + info.param.model + "_" +
                                              std::to_string(info.param.trainers) + "x" +
                                              std::to_string(info.param.engines) + "_" + info.param.experts +
                                              "_" + info.param.mode + "_" + info.param.transport +
                                              (info.param.names == "hf" ? "" : "_" + info.param.names) +
                                              (info.param.trainer_device == "cuda" ? "" : "_host") +
                                              (info.param.register_host == "true" ? "" : "_pinned");
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

// Staged cuda_ipc with two writers per slot (2 FSDP trainer ranks, 1 engine
// rank): a slot has one interprocess landing event, and a second writer's
// record replaces the first's, so each writer must wait for its own part
// before it says kLanded (pack.cc announce_after_stream). Before each part,
// trainer rank 0's stream waits 50 ms on the GPU (its bytes land late) and
// trainer rank 1 sleeps 10 ms on the host (its calls come last).
// Catches: a writer that announces its part without waiting for it (the
// engine reads poisoned or old bytes; "tensor 'model.embed_tokens.weight' is
// wrong at byte 0": tried once on the H200, 2 of 2 runs failed). Not caught:
// a writer that records the slot's event and announces at once (tried, 9 of
// 9 runs passed: on the H200's driver 580 an engine's query of the
// interprocess event did not report a slot landed while another process's
// earlier record was still pending; CUDA does not promise that, so each
// writer still waits for its own part).
TEST(ShardedGpuStaged, EveryWriterOfASlotWaitsForItsOwnPartBeforeItSaysLanded) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  testing::JobSpec spec;
  spec.engine_ranks = 1;
  spec.trainer_ranks = 2;
  spec.refits = 3;
  spec.transport = "cuda_ipc";
  spec.model = "tiny";
  spec.bucket_size = "1MiB";
  spec.setup_timeout_s = 60;
  spec.refit_timeout_s = 60;
  spec.rank_args = {"--device", "cuda", "--mode", "staged"};
  spec.extra["engine rank 0"] = {"--poison-recycled"};
  spec.extra["trainer rank 0"] = {"--trainer-layout", "fsdp", "--debug-gpu-delay-ms", "50"};
  spec.extra["trainer rank 1"] = {"--trainer-layout", "fsdp", "--debug-host-delay-ms", "10"};
  ProcessGroup group;
  ASSERT_TRUE(testing::start_job(group, spec));
  ASSERT_TRUE(group.wait_all(120)) << "processes left running:\n" << group.all_stderr();
  for (const std::string& name : group.names()) {
    EXPECT_EQ(group.exit_code(name), 0) << name << "\n" << group.all_stderr();
  }
  json report = json::parse(group.report(), nullptr, false);
  ASSERT_TRUE(report.is_object()) << group.report() << group.all_stderr();
  EXPECT_TRUE(report.value("verified", false)) << report.dump();
  EXPECT_EQ(report["refits"].size(), 3u) << report.dump();
}

}  // namespace
}  // namespace refit
