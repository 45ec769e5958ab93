// End to end: sharded trainers (issue 19). `refit demo --trainer-layout ...`
// starts M trainer processes that each generate only their own shards
// (FSDP2 dim-0 chunks, Megatron TP, or both) and N engine processes of
// refit's TP rules; every engine byte comes from the one trainer rank that
// holds it (the transfer plan), several trainer ranks write parts of one
// bucket, and every engine rank verifies every byte of every refit.
#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "job.h"
#include "kill_mid_job.h"
#include "process_harness.h"
#include "testing/ucx_test_util.h"

namespace refit {
namespace {

using nlohmann::json;
using testing::run_refit;

struct ShardedCase {
  std::string transport, layout, model;
  int trainers, engines;
  std::string bucket;
  std::string names = "hf";    // --trainer-names
  std::string experts = "tp";  // --engine-experts
  std::string mode = "staged";
};

class ShardedDemoTest : public ::testing::TestWithParam<ShardedCase> {};

// Catches: a trainer rank packing its runs for another trainer rank's share
// (SenderContext::feed_rank 0 for every rank: the engines refuse the parts'
// byte counts or fail verification; tried), parts landing without every
// part (SharedBuckets.* at the unit level), trainers sending more or less
// than the engines hold (the byte sum below), and a ucx rank putting its
// whole staging buffer into the slot over the other ranks' parts (tried:
// "tensor 'model.embed_tokens.weight' is wrong at byte 0" on both ucx cases)
// or, direct, whole bucket entries at their arena offsets (the _direct
// cases).
// The Megatron cases catch a mapped plan whose runs read the engine
// tensor's index instead of src_tensor (tried: the engines refuse the
// parts' byte counts or find wrong bytes), and content or correspondences
// that disagree with the engine's tensors (verification fails).
TEST_P(ShardedDemoTest, EveryEngineByteComesFromTheTrainerThatHoldsItAndVerifies) {
  const ShardedCase& c = GetParam();
  if (c.transport == "ucx") REFIT_SKIP_WITHOUT_UCX();
  auto r = run_refit({"demo", "--json", "--transport", c.transport, "--trainer-layout", c.layout, "--trainer-ranks",
                      std::to_string(c.trainers), "--engine-ranks", std::to_string(c.engines), "--model", c.model,
                      "--refits", "3", "--bucket-size", c.bucket, "--poison-recycled", "--timeout", "120",
                      "--trainer-names", c.names, "--engine-experts", c.experts, "--mode", c.mode});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  json report = json::parse(r.out);
  EXPECT_TRUE(report["verified"].get<bool>());
  ASSERT_EQ(report["refits"].size(), 3u);
  ASSERT_EQ(report["trainer_ranks"].size(), static_cast<std::size_t>(c.trainers));
  // What the trainer ranks sent adds up to what the engine ranks hold:
  // nothing gathered, nothing twice.
  std::uint64_t sent = 0, to_engines = 0;
  std::vector<std::uint64_t> per_engine(static_cast<std::size_t>(c.engines), 0);
  for (const auto& t : report["trainer_ranks"]) {
    sent += t["bytes"].get<std::uint64_t>();
    EXPECT_EQ(t["gathered_bytes"], 0) << t.dump();
    for (const auto& e : t["engines"]) {
      const int er = e["engine_rank"].get<int>();
      ASSERT_GE(er, 0);
      ASSERT_LT(er, c.engines);
      to_engines += e["bytes"].get<std::uint64_t>();
      per_engine[static_cast<std::size_t>(er)] += e["bytes"].get<std::uint64_t>();
    }
  }
  EXPECT_EQ(sent, report["bytes_per_refit"].get<std::uint64_t>());
  EXPECT_EQ(to_engines, sent) << "the per-engine bytes must add up to the rank's bytes";
  // Every engine rank got something, from the ranks that named it.
  for (int e = 0; e < c.engines; ++e) EXPECT_GT(per_engine[static_cast<std::size_t>(e)], 0u) << "engine rank " << e;
  EXPECT_EQ(report["gathered_bytes"], 0) << report.dump();
  EXPECT_EQ(report["duplicate_bytes"], 0) << report.dump();
}

// The same fields for full-weight trainers: each rank holds (has gathered)
// the whole model and writes its buckets into one engine rank.
// Catches: a gathered_bytes that is 0 whatever the layout (the sharded
// cases' 0 would then prove nothing), and a duplicate_bytes that does not
// count a byte sent twice (tried: a coordinator summing each trainer rank's
// engines twice reports duplicate_bytes = bytes_per_refit here).
TEST(ShardedDemo, FullTrainersReportTheWholeModelGatheredAndNothingTwice) {
  auto r = run_refit({"demo", "--json", "--trainer-ranks", "4", "--engine-ranks", "2", "--refits", "2"}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  json report = json::parse(r.out);
  ASSERT_TRUE(report["verified"].get<bool>());
  const std::uint64_t model = report["bytes_per_refit"].get<std::uint64_t>();
  std::uint64_t gathered = 0;
  for (const auto& t : report["trainer_ranks"]) {
    ASSERT_EQ(t["engines"].size(), 1u) << t.dump();
    EXPECT_EQ(t["engines"][0]["engine_rank"], t["rank"].get<int>() % 2) << t.dump();
    gathered += t["gathered_bytes"].get<std::uint64_t>();
  }
  // tiny's weights are replicated or split over 2 engine ranks: each full
  // rank holds at least one engine rank's stream and at most both.
  EXPECT_GE(gathered, 4 * (model / 2));
  EXPECT_EQ(report["gathered_bytes"].get<std::uint64_t>(), gathered);
  EXPECT_EQ(report["duplicate_bytes"], 0) << report.dump();
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ShardedDemoTest,
    ::testing::Values(ShardedCase{"shm", "fsdp", "tiny", 4, 2, "1MiB"},         // M > N
                      ShardedCase{"shm", "fsdp", "tiny", 1, 3, "256KiB"},       // M < N: one rank feeds all three
                      ShardedCase{"shm", "tp:2,fsdp:2", "tiny", 4, 3, "1MiB"},  // products, uneven engine shards
                      ShardedCase{"tcp", "fsdp", "tiny", 3, 2, "512KiB"},       // two-sided: parts as ranges
                      ShardedCase{"tcp", "tp", "tiny-moe", 2, 4, "512KiB"},
                      // Remote writes: each rank puts only its part's ranges into the slot.
                      ShardedCase{"ucx", "fsdp", "tiny", 3, 2, "512KiB"},
                      ShardedCase{"ucx", "tp:2,fsdp:2", "tiny-moe", 4, 3, "512KiB"},
                      // Megatron-named trainers: fused linear_qkv and linear_fc1 and stacked experts into the
                      // engine's Hugging Face tensors, each sub-slice straight from the shard that holds it.
                      ShardedCase{"shm", "fsdp", "tiny", 3, 2, "1MiB", "megatron"},
                      ShardedCase{"tcp", "fsdp", "tiny-moe", 4, 3, "512KiB", "megatron", "ep"},
                      ShardedCase{"ucx", "fsdp", "tiny-moe", 2, 3, "512KiB", "megatron"},
                      // Direct: each rank writes only its runs into the engines' exposed weights.
                      ShardedCase{"ucx", "tp:2,fsdp:2", "tiny", 4, 3, "512KiB", "hf", "tp", "direct"},
                      ShardedCase{"ucx", "fsdp", "tiny", 3, 2, "512KiB", "hf", "tp", "direct"},
                      ShardedCase{"ucx", "fsdp", "tiny-moe", 2, 3, "512KiB", "megatron", "ep", "direct"}),
    [](const ::testing::TestParamInfo<ShardedCase>& info) {
      std::string name = info.param.transport + "_" + info.param.layout + "_" + info.param.model + "_" +
                         std::to_string(info.param.trainers) + "x" + std::to_string(info.param.engines) +
                         (info.param.names == "hf" ? "" : "_" + info.param.names) +
                         (info.param.experts == "tp" ? "" : "_" + info.param.experts) +
                         (info.param.mode == "staged" ? "" : "_" + info.param.mode);
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

struct ShardedKillCase {
  std::string victim, transport;
  int trainers, engines;
  int refit;  // the refit the kill lands in
};

class ShardedKillTest : public ::testing::TestWithParam<ShardedKillCase> {};

std::vector<std::string> FsdpTrainers(testing::JobSpec& spec) {
  std::vector<std::string> names;
  for (int t = 0; t < spec.trainer_ranks; ++t) {
    const std::string name = "trainer rank " + std::to_string(t);
    spec.extra[name] = {"--trainer-layout", "fsdp"};
    names.push_back(name);
  }
  return names;
}

// A rank killed with SIGKILL in the middle of a sharded refit (M != N: a
// trainer rank that feeds several engine ranks, an engine rank fed by
// several trainer ranks): every survivor exits non-zero naming it, the
// refit in flight is not committed. The stopped trainer halts right after
// writing its first part of the refit (--debug-stop-after-bucket, sharded
// path). Catches: a survivor that waits past the refit deadline or exits 0
// (a sharded trainer's channel threads blocked on a dead engine's credits),
// a refit in flight reported committed, and the sharded send path ignoring
// the stop hook (the wait for its line times out). Tried: without the
// abort callback's loop shutting every channel's link the cases still
// pass (the links' own deadlines and the engines' exits end the waits in
// time), so that loop is a latency measure these cases do not pin down.
TEST_P(ShardedKillTest, EverySurvivorFailsNamingTheLostRank) {
  const ShardedKillCase& c = GetParam();
  testing::JobSpec spec;
  spec.trainer_ranks = c.trainers;
  spec.engine_ranks = c.engines;
  spec.transport = c.transport;
  spec.bucket_size = "256KiB";
  spec.refits = 1000;  // far more than will run: the kill lands mid-job
  spec.refit_timeout_s = 10;
  FsdpTrainers(spec);
  const std::string stopped = c.victim.rfind("trainer", 0) == 0 ? c.victim : "trainer rank 0";
  testing::stop_mid_refit(spec, stopped, static_cast<std::uint64_t>(c.refit));
  testing::ProcessGroup group;
  ASSERT_TRUE(testing::start_job(group, spec)) << group.all_stderr();
  ASSERT_NO_FATAL_FAILURE(testing::KillMidJobAndExpectEverySurvivorToNameIt(
      group, c.victim, spec.refit_timeout_s + 10, stopped, static_cast<std::uint64_t>(c.refit)));
  const json report = json::parse(group.report());
  EXPECT_EQ(report["refits"].size(), static_cast<std::size_t>(c.refit - 1)) << report.dump();
}

INSTANTIATE_TEST_SUITE_P(Roles, ShardedKillTest,
                         ::testing::Values(ShardedKillCase{"trainer rank 1", "shm", 3, 2, 2},   // M > N
                                           ShardedKillCase{"engine rank 2", "shm", 1, 3, 2},    // M < N
                                           ShardedKillCase{"engine rank 0", "tcp", 3, 2, 1},    // fed by 2 ranks
                                           ShardedKillCase{"trainer rank 0", "tcp", 2, 3, 2}),  // feeds 2 ranks
                         [](const auto& info) {
                           std::string v = info.param.victim + "_" + info.param.transport + "_" +
                                           std::to_string(info.param.trainers) + "x" +
                                           std::to_string(info.param.engines);
                           for (char& ch : v) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return v;
                         });

// A sharded refit that fails while every process lives (a trainer rank's
// injected fault after its first part): the job relinks every channel and
// the next refits commit, every byte verified. Catches: channels that are
// not relinked after a failed refit (the next refit's parts land on a
// link with the failed refit's frames in flight and fail), and the sharded
// path ignoring --debug-fail-refit (no failure recorded).
TEST(ShardedRecovery, AFailedShardedRefitLeavesTheJobRunningOnTheNext) {
  testing::JobSpec spec;
  spec.trainer_ranks = 3;
  spec.engine_ranks = 2;
  spec.refits = 4;
  spec.bucket_size = "256KiB";
  FsdpTrainers(spec);
  spec.extra["trainer rank 1"].insert(spec.extra["trainer rank 1"].end(), {"--debug-fail-refit", "2"});
  testing::ProcessGroup g;
  ASSERT_TRUE(testing::start_job(g, spec)) << g.all_stderr();
  ASSERT_TRUE(g.wait_all(120)) << g.all_stderr();
  EXPECT_EQ(g.exit_code("coordinator"), 1) << g.all_stderr();
  const json report = json::parse(g.report());
  ASSERT_EQ(report["failures"].size(), 1u) << report.dump(2);
  EXPECT_EQ(report["failures"][0]["version"], 2) << report.dump(2);
  // The first failure to reach the coordinator names trainer rank 1: its
  // own, or an engine rank's whose link from it closed (the failing rank
  // shuts every channel's link down at once, which an engine rank may
  // report first). The trainer rank says why.
  EXPECT_NE(report["failures"][0]["error"].get<std::string>().find("trainer rank 1"), std::string::npos)
      << report.dump(2);
  EXPECT_NE(g.err("trainer rank 1").find("injected fault in refit 2"), std::string::npos) << g.err("trainer rank 1");
  std::vector<int> committed;
  for (const json& r : report["refits"]) {
    EXPECT_TRUE(r["verified"].get<bool>()) << r.dump();
    committed.push_back(r["version"].get<int>());
  }
  EXPECT_EQ(committed, (std::vector<int>{1, 3, 4}));
}

}  // namespace
}  // namespace refit
