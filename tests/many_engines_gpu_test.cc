// Many engines on the GPU (label gpu; issues 18 and 23): engines of one
// rank each, every process on one GPU (--engine-gpus 1), relayed from
// device receive pool to device receive pool over cuda_ipc (a device copy
// into the child's mapped slot, then kLanded) and over nccl (each relaying
// rank an NCCL pair with each child; every process its own NCCL host,
// nccl_env.h), recycled slots poisoned; every byte verified on the device
// after every refit. Skips where no GPU exists (nccl: or nccl was not built).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "chain_kill.h"
#include "cuda/gpu_test_util.h"
#include "job.h"
#include "nccl_env.h"
#include "process_harness.h"
#include "cuda/device.h"

namespace refit {
namespace {

using nlohmann::json;

// The report of a chain of three engines and three refits: verified, every
// engine holds every version, the trainer's link carried one engine's bytes
// per refit and the links together three.
void expect_a_relayed_chain_of_three(const json& report) {
  EXPECT_TRUE(report["verified"].get<bool>()) << report.dump(2);
  ASSERT_EQ(report["engines"].size(), 3u);
  for (const json& engine : report["engines"]) EXPECT_EQ(engine["versions"], json::array({1, 2, 3}));
  for (const json& refit : report["refits"]) {
    EXPECT_EQ(refit["trainer_link_bytes"], refit["bytes"]) << refit.dump();
    EXPECT_EQ(refit["wire_bytes"].get<std::uint64_t>(), 3 * refit["bytes"].get<std::uint64_t>()) << refit.dump();
  }
}

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
  expect_a_relayed_chain_of_three(report);
}

// A job of `engines` engines of one rank and one trainer rank over nccl on
// one GPU: every process its own NCCL host (nccl_env.h, also the joiner
// "engine 2 rank 0"), recycled slots poisoned.
testing::JobSpec nccl_engines(int engines, int refits) {
  testing::JobSpec spec;
  spec.engines = engines;
  spec.engine_ranks = 1;
  spec.trainer_ranks = 1;
  spec.refits = refits;
  spec.transport = "nccl";
  spec.bucket_size = "1MiB";
  spec.setup_timeout_s = 60;
  spec.refit_timeout_s = 60;
  spec.rank_args = {"--device", "cuda"};
  for (int k = 0; k < 3; ++k) {
    const std::string name = "engine " + std::to_string(k) + " rank 0";
    spec.extra[name] = {"--engine-gpus", "1", "--poison-recycled"};
    spec.env[name] = testing::nccl_own_host_env(name);
  }
  spec.env["trainer rank 0"] = testing::nccl_own_host_env("trainer rank 0");
  return spec;
}

// A chain of three engines over nccl, 1 MiB buckets (issue 23 item 1):
// every engine commits every version, verified on the device; the
// trainer's link carries one engine's bytes, the links together three.
// Catches: relays over nccl refused at setup again (the job fails), a
// relay that submits from the wrong device or before the bucket landed in
// its own pool (poison reaches the child: verification fails), a child's
// recv posted for another slot (verification or a hang to the deadline).
TEST(ManyEnginesGpu, AChainOfThreeEnginesOverNcclVerifiesEveryByte) {
  REFIT_SKIP_WITHOUT_NCCL();
  const testing::JobSpec spec = nccl_engines(3, 3);
  testing::ProcessGroup group;
  ASSERT_TRUE(testing::start_job(group, spec)) << group.all_stderr();
  ASSERT_TRUE(group.wait_all(300)) << "hung:\n" << group.all_stderr();
  for (const auto& name : group.names()) EXPECT_EQ(group.exit_code(name), 0) << name << "\n" << group.all_stderr();
  const json report = json::parse(group.report());
  expect_a_relayed_chain_of_three(report);
}

// kill -9 of an engine of a chain of three over nccl during refit 2, with
// --min-engines 2 (issue 23 item 1), as the process tests do over shm and
// tcp (chain_kill.h): the middle engine (engine 0 then feeds engine 2) and
// engine 0 (the trainer then feeds engine 1). Every survivor exits 0 and
// verifies every version. Catches: a new feeder that opens the orphan's
// pool with the communicator id its dead feeder used (its NCCL init waits
// on a bootstrap that is gone: the refit times out and the job fails;
// without RemoteTarget::relinked() in RelayForwarder::link or
// TrainerRank::Impl::relink_to), an nccl target that refuses frames from
// its new feeder ("is fed by engine 1 (relay) and got a frame from ...").
// Tried once each on an H200 (docs/nccl_relays_gpu_2026-12-07s29_h200.log):
// RelayForwarder::link without relinked() (refit 2 timed out waiting for
// engine 0's and engine 2's sent), relink_to without it (the trainer's
// NCCL init failed: "remote process exited"), the target's peer check kept
// on the new-communicator frame ("is fed by engine 1 (relay) and got a
// frame from engine 0 (relay)").
TEST(ManyEnginesGpu, AnEngineKilledMidRelayOverNcclIsDroppedAndTheOthersGetEveryVersion) {
  REFIT_SKIP_WITHOUT_NCCL();
  for (int victim : {1, 0}) {
    SCOPED_TRACE("engine " + std::to_string(victim) + " killed");
    testing::JobSpec spec = nccl_engines(3, 4);
    spec.coordinator_args = {"--min-engines", "2"};
    testing::stop_mid_refit(spec, "trainer rank 0", 2);
    const auto [report, trainer] = testing::kill_one_of_a_chain_mid_relay(spec, victim, 240);
    if (victim == 0) {
      EXPECT_NE(trainer.find("engine 1 rank 0 at"), std::string::npos) << trainer;
    }
  }
}

// An engine joining the running job on the GPU (issue 18 item 4; over
// nccl issue 23 item 1): a chain of engines 0 -> 1 with --max-engines 3;
// engine 2 is started while refit 2 is in flight (the trainer stopped
// inside it), and once refit 2 commits engine 1 sends it version 2 read
// back from its device weights (device copies into device buffers, then
// into engine 2's mapped slots, or sent over a new NCCL pair); engine 2
// verifies it on the device and commits 3 and 4 with the others. Catches:
// a catch-up that reads device weights as host memory (a crash), a joiner
// refused because its parent holds device weights (catch_up false in its
// join), a joiner's pool opened over nccl with no new pair (the catch-up
// waits on the joiner's own half-started communicator: refused at its
// deadline).
class JoinGpuTest : public ::testing::TestWithParam<std::string> {};

TEST_P(JoinGpuTest, AnEngineJoiningOnTheGpuCatchesUpFromItsParentsDeviceWeights) {
  const std::string transport = GetParam();
  if (transport == "nccl") {
    REFIT_SKIP_WITHOUT_NCCL();
  } else {
    REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  }
  testing::JobSpec spec = nccl_engines(2, 4);
  if (transport != "nccl") spec.env.clear();
  spec.transport = transport;
  spec.bucket_size = "4MiB";
  spec.coordinator_args = {"--max-engines", "3"};
  testing::stop_mid_refit(spec, "trainer rank 0", 2);
  testing::ProcessGroup group;
  ASSERT_TRUE(testing::start_job(group, spec)) << group.all_stderr();
  ASSERT_TRUE(testing::wait_for_refit_under_way(group, "trainer rank 0", 2)) << group.all_stderr();
  testing::spawn_job_rank(group, spec, "engine 2 rank 0",
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

INSTANTIATE_TEST_SUITE_P(Transports, JoinGpuTest, ::testing::Values("cuda_ipc", "nccl"));

}  // namespace
}  // namespace refit
