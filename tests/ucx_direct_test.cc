// Direct mode over ucx (issue 5): the engine rank exposes its weight arena
// once (expose_memory: ucp_mem_map of the arena, one slot) and each trainer
// rank writes every packed run of every bucket at its offset in the arena;
// no receive pool, no credits. `refit demo --transport ucx --mode direct`
// verified bit-exact on every engine rank after every refit, over UCX's tcp
// (active-message writes) and shared-memory (ucp_put_nbx) transports, and
// the report saying which memory path ran.
//
// Every test skips with the reason when refit was built without UCX.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>

#include <nlohmann/json.hpp>

#include "process_harness.h"
#include "transport/transport.h"
#include "testing/scoped_env.h"
#include "testing/ucx_test_util.h"

namespace refit {
namespace {

using nlohmann::json;
using testing::run_refit;

struct DirectCase {
  std::string tls;
  int engine_ranks;
  int trainer_ranks;
  std::string model;
  std::string bucket;
};

class UcxDirectTest : public ::testing::TestWithParam<DirectCase> {};

// Every byte of every engine rank's weights verified after each of 3
// refits (the content depends on tensor, offset and version, so a stale
// byte from the previous version fails too).
// Catches (each tried once): runs written at their bucket offset instead of
// their arena offset (verification fails), adjacent runs merged when they
// are not adjacent in the arena, a bucket announced (kLanded) before its
// writes completed (the engine verifies bytes still on their way), and
// capabilities().direct left false (the ranks refuse --mode direct at setup).
TEST_P(UcxDirectTest, EveryByteLandsInTheEnginesWeights) {
  REFIT_SKIP_WITHOUT_UCX();
  const DirectCase& c = GetParam();
  testing::ScopedEnv tls("UCX_TLS", c.tls);
  auto r = run_refit({"demo", "--json", "--transport", "ucx", "--mode", "direct", "--engine-ranks",
                      std::to_string(c.engine_ranks), "--trainer-ranks", std::to_string(c.trainer_ranks), "--model",
                      c.model, "--refits", "3", "--bucket-size", c.bucket, "--timeout", "120"});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  json report = json::parse(r.out);
  EXPECT_TRUE(report["verified"].get<bool>());
  EXPECT_FALSE(report.contains("error"));
  EXPECT_EQ(report["transport"], "ucx");
  EXPECT_EQ(report["mode"], "direct");
  EXPECT_EQ(report["ucx_memory_path"], "host");
  ASSERT_EQ(report["refits"].size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(report["refits"][i]["version"], i + 1);
  ASSERT_EQ(report["ranks"].size(), static_cast<std::size_t>(c.engine_ranks));
  for (const auto& rank : report["ranks"]) {
    EXPECT_EQ(rank["tensors"], report["tensors"]) << rank.dump();
    EXPECT_EQ(rank["memory_path"], "host") << rank.dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxDirectTest,
                         ::testing::Values(DirectCase{"tcp", 1, 1, "tiny", "512KiB"},
                                           DirectCase{"tcp", 2, 3, "tiny-moe", "1MiB"},
                                           DirectCase{"sm", 2, 2, "tiny", "256KiB"},
                                           DirectCase{"sm", 1, 2, "tiny-moe", "4MiB"}),
                         [](const auto& info) {
                           const DirectCase& c = info.param;
                           return c.tls + "_e" + std::to_string(c.engine_ranks) + "_t" +
                                  std::to_string(c.trainer_ranks) + "_" + (c.model == "tiny" ? "tiny" : "tinymoe");
                         });

// The staged path reports its memory path too (host weights, host pools).
// Catches: a report without ucx_memory_path (the field the GPU runs read).
TEST(UcxMemoryPath, StagedHostJobReportsHost) {
  REFIT_SKIP_WITHOUT_UCX();
  testing::ScopedEnv tls("UCX_TLS", "tcp");
  auto r = run_refit({"demo", "--json", "--transport", "ucx", "--refits", "1", "--bucket-size", "1MiB", "--timeout",
                      "120"});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  json report = json::parse(r.out);
  EXPECT_EQ(report["ucx_memory_path"], "host");
  ASSERT_FALSE(report["trainer_ranks"].empty());
  EXPECT_EQ(report["trainer_ranks"][0]["memory_path"], "host");
}

}  // namespace
}  // namespace refit
