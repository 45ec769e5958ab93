// End to end: sharded trainers (issue 19). `refit demo --trainer-layout ...`
// starts M trainer processes that each generate only their own shards
// (FSDP2 dim-0 chunks, Megatron TP, or both) and N engine processes of
// refit's TP rules; every engine byte comes from the one trainer rank that
// holds it (the transfer plan), several trainer ranks write parts of one
// bucket, and every engine rank verifies every byte of every refit.
#include <gtest/gtest.h>

#include <cctype>

#include <nlohmann/json.hpp>

#include "process_harness.h"

namespace refit {
namespace {

using nlohmann::json;
using testing::run_refit;

struct ShardedCase {
  std::string transport, layout, model;
  int trainers, engines;
  std::string bucket;
};

class ShardedDemoTest : public ::testing::TestWithParam<ShardedCase> {};

// Catches: a trainer rank packing its runs for another trainer rank's share
// (SenderContext::feed_rank 0 for every rank: the engines refuse the parts'
// byte counts or fail verification; tried), parts landing without every
// part (SharedBuckets.* at the unit level), and trainers sending more or
// less than the engines hold (the byte sum below).
TEST_P(ShardedDemoTest, EveryEngineByteComesFromTheTrainerThatHoldsItAndVerifies) {
  const ShardedCase& c = GetParam();
  auto r = run_refit({"demo", "--json", "--transport", c.transport, "--trainer-layout", c.layout, "--trainer-ranks",
                      std::to_string(c.trainers), "--engine-ranks", std::to_string(c.engines), "--model", c.model,
                      "--refits", "3", "--bucket-size", c.bucket, "--poison-recycled", "--timeout", "120"});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  json report = json::parse(r.out);
  EXPECT_TRUE(report["verified"].get<bool>());
  ASSERT_EQ(report["refits"].size(), 3u);
  ASSERT_EQ(report["trainer_ranks"].size(), static_cast<std::size_t>(c.trainers));
  // What the trainer ranks sent adds up to what the engine ranks hold:
  // nothing gathered, nothing twice.
  std::uint64_t sent = 0;
  for (const auto& t : report["trainer_ranks"]) sent += t["bytes"].get<std::uint64_t>();
  EXPECT_EQ(sent, report["bytes_per_refit"].get<std::uint64_t>());
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ShardedDemoTest,
    ::testing::Values(ShardedCase{"shm", "fsdp", "tiny", 4, 2, "1MiB"},         // M > N
                      ShardedCase{"shm", "fsdp", "tiny", 1, 3, "256KiB"},       // M < N: one rank feeds all three
                      ShardedCase{"shm", "tp:2,fsdp:2", "tiny", 4, 3, "1MiB"},  // products, uneven engine shards
                      ShardedCase{"tcp", "fsdp", "tiny", 3, 2, "512KiB"},       // two-sided: parts as ranges
                      ShardedCase{"tcp", "tp", "tiny-moe", 2, 4, "512KiB"}),
    [](const ::testing::TestParamInfo<ShardedCase>& info) {
      std::string name = info.param.transport + "_" + info.param.layout + "_" + info.param.model + "_" +
                         std::to_string(info.param.trainers) + "x" + std::to_string(info.param.engines);
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

// Catches: a layout whose degrees do not multiply to the trainer ranks
// accepted (every rank would compute another transfer plan), and full
// trainers fewer than the engine ranks accepted.
TEST(ShardedDemo, LayoutsThatCannotFeedTheJobAreRefusedNamingTheSetting) {
  auto bad = run_refit({"demo", "--trainer-layout", "tp:3,fsdp:2", "--trainer-ranks", "4", "--engine-ranks", "2"}, 60);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("tp 3 x fsdp 2 = 6 ranks, but there are 4 trainer ranks"), std::string::npos) << bad.err;
  auto fewer = run_refit({"demo", "--trainer-ranks", "2", "--engine-ranks", "3"}, 60);
  EXPECT_NE(fewer.exit_code, 0);
  EXPECT_NE(fewer.err.find("fewer trainer ranks (2) than engine ranks (3)"), std::string::npos) << fewer.err;
}

}  // namespace
}  // namespace refit
