// The ucx transport end to end on one host: `refit demo --transport ucx`
// verified bit-exact over UCX's tcp and shared-memory transports, and a
// killed rank failing every survivor with its name (as failure_test.cc does
// for shm and tcp). Across real network interfaces: netns_test.cc.
//
// Every test skips with the reason when refit was built without UCX.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>

#include <nlohmann/json.hpp>

#include "job.h"
#include "transport/transport.h"
#include "testing/scoped_env.h"
#include "testing/ucx_test_util.h"

namespace refit {
namespace {

using nlohmann::json;
using testing::JobSpec;
using testing::ProcessGroup;
using testing::run_refit;
using testing::start_job;

struct UcxDemoCase {
  std::string tls;
  int engine_ranks;
  int trainer_ranks;
  std::string model;
  std::string mode;  // staged or direct
};

class UcxDemoTest : public ::testing::TestWithParam<UcxDemoCase> {};

// DESIGN.md rules 2 and 8 over ucx: every engine rank verifies every byte of
// its shard after every refit (content depends on tensor, offset and
// version), with recycled slots poisoned.
// Catches: a write that is not in the engine's memory when poll returns
// (kLanded overtaking the bytes: verification fails), a wrong slot or offset
// in the remote address, a descriptor whose addr is not the pool's.
TEST_P(UcxDemoTest, EveryByteVerifiedOnEveryRank) {
  REFIT_SKIP_WITHOUT_UCX();
  const UcxDemoCase& c = GetParam();
  testing::ScopedEnv tls("UCX_TLS", c.tls);
  auto r = run_refit({"demo", "--json", "--transport", "ucx", "--engine-ranks", std::to_string(c.engine_ranks),
                      "--trainer-ranks", std::to_string(c.trainer_ranks), "--model", c.model, "--refits", "3",
                      "--bucket-size", "512KiB", "--poison-recycled", "--mode", c.mode, "--timeout", "120"});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  json report = json::parse(r.out);
  EXPECT_TRUE(report["verified"].get<bool>());
  EXPECT_FALSE(report.contains("error"));
  EXPECT_EQ(report["transport"], "ucx");
  ASSERT_EQ(report["refits"].size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(report["refits"][i]["version"], i + 1);
    EXPECT_GT(report["refits"][i]["bytes"].get<std::uint64_t>(), 0u);
  }
  ASSERT_EQ(report["ranks"].size(), static_cast<std::size_t>(c.engine_ranks));
  for (const auto& rank : report["ranks"]) EXPECT_EQ(rank["tensors"], report["tensors"]) << rank.dump();
}

INSTANTIATE_TEST_SUITE_P(
    Tls, UcxDemoTest,
    ::testing::Values(UcxDemoCase{"tcp", 1, 1, "tiny", "staged"}, UcxDemoCase{"tcp", 3, 3, "tiny", "staged"},
                      UcxDemoCase{"tcp", 2, 3, "tiny-moe", "staged"}, UcxDemoCase{"sm", 2, 2, "tiny", "staged"},
                      UcxDemoCase{"sm", 3, 3, "tiny-moe", "staged"}),
    [](const auto& info) {
      const UcxDemoCase& c = info.param;
      return c.tls + "_e" + std::to_string(c.engine_ranks) + "_t" + std::to_string(c.trainer_ranks) + "_" +
             (c.model == "tiny" ? "tiny" : "tinymoe") + "_" + c.mode;
    });

struct UcxKillCase {
  std::string victim;
  int refit;  // the refit the kill lands in (1: the first)
};

class UcxKillTest : public ::testing::TestWithParam<UcxKillCase> {};

// A rank killed mid-job over UCX's tcp transport: every survivor exits
// non-zero within the refit deadline naming it, nothing is committed past
// the failure. A killed trainer must not take its engine down with it.
// The kill lands inside refit c.refit: a trainer (the victim, or trainer
// rank 0) stops itself right after submitting its first bucket of that
// refit (--debug-stop-after-bucket), the test waits for its line, kills the
// victim and resumes the stopped trainer; so refits 1..c.refit-1 and no
// other are committed.
// Catches: an engine process aborted by UCX when its trainer dies mid-write
// (UCX 1.13's software put), a trainer that hangs on writes into a dead
// engine (no peer error handling), survivors that do not name the victim.
TEST_P(UcxKillTest, EverySurvivorFailsNamingTheLostRank) {
  REFIT_SKIP_WITHOUT_UCX();
  const UcxKillCase& c = GetParam();
  testing::ScopedEnv tls("UCX_TLS", "tcp");
  JobSpec spec;
  spec.engine_ranks = 2;
  spec.trainer_ranks = 2;
  spec.refits = 1000;
  spec.transport = "ucx";
  spec.refit_timeout_s = 10;
  ProcessGroup group;
  const std::string stopped = c.victim.rfind("trainer", 0) == 0 ? c.victim : "trainer rank 0";
  testing::stop_mid_refit(spec, stopped, static_cast<std::uint64_t>(c.refit));
  ASSERT_TRUE(start_job(group, spec));
  ASSERT_TRUE(testing::wait_for_refit_under_way(group, stopped, static_cast<std::uint64_t>(c.refit)))
      << group.all_stderr();
  group.kill(c.victim, SIGKILL);
  if (stopped != c.victim) group.resume(stopped);
  ASSERT_TRUE(group.wait_all(spec.refit_timeout_s + 10)) << "a survivor hung:\n" << group.all_stderr();
  for (const auto& name : group.names()) {
    if (name == c.victim) continue;
    EXPECT_NE(group.exit_code(name), 0) << name << " exited 0 after " << c.victim << " died\n" << group.all_stderr();
    EXPECT_LT(group.exit_code(name), 128) << name << " died of a signal (not an orderly failure):\n"
                                         << group.err(name);
    EXPECT_NE(group.err(name).find(c.victim), std::string::npos) << name << ":\n" << group.err(name);
  }
  auto report = json::parse(group.report());
  EXPECT_FALSE(report["verified"].get<bool>());
  const auto& refits = report["refits"];
  EXPECT_EQ(refits.size(), static_cast<std::size_t>(c.refit - 1)) << report.dump();
  for (std::size_t i = 0; i < refits.size(); ++i) EXPECT_EQ(refits[i]["version"], i + 1);
}

INSTANTIATE_TEST_SUITE_P(Roles, UcxKillTest,
                         ::testing::Values(UcxKillCase{"trainer rank 0", 3}, UcxKillCase{"engine rank 1", 3},
                                           UcxKillCase{"trainer rank 1", 1}),
                         [](const auto& info) {
                           std::string v = info.param.victim;
                           for (char& ch : v) {
                             if (ch == ' ') ch = '_';
                           }
                           return v + "_refit" + std::to_string(info.param.refit);
                         });

}  // namespace
}  // namespace refit
