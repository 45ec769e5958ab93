// The coordinator's setup of sharded trainers (sharded_topology.h), driven
// with hand-made joins: two engine ranks of one bucket each, fed by two
// trainer ranks that each write a part of every bucket.
#include "control/sharded_topology.h"

#include <gtest/gtest.h>

#include "control/topology.h"
#include "refit/plan.h"
#include "testing/expect_has.h"

namespace refit {
namespace {

constexpr std::uint64_t kBucket = 1 << 20;

std::vector<TensorSpec> Stream() { return {TensorSpec{"w", DType::kBFloat16, {8, 100}}}; }  // 1600 bytes

Join Common(Role role, int rank) {
  Join j;
  j.role = role;
  j.rank = rank;
  j.mode = "staged";
  j.transport = "shm";
  j.bucket_size = kBucket;
  j.trainer_ranks = 2;
  j.engine_ranks = 2;
  return j;
}

Join Engine(int rank) {
  Join e = Common(Role::kEngine, rank);
  e.specs = Stream();
  e.plan_digest = make_plan(e.specs, kBucket)->digest_hex();
  e.data_address = "127.0.0.1:" + std::to_string(4000 + rank);
  e.descriptor = "pool-" + std::to_string(rank);
  e.pool_slots = 2;
  e.supported_dtypes = {"bfloat16"};
  return e;
}

// Trainer `rank` writes `bytes` of bucket 0 of both engine ranks.
Join Trainer(int rank, std::uint64_t bytes) {
  Join t = Common(Role::kTrainer, rank);
  t.layout = "fsdp:2";
  t.transfer_digest = "0123456789abcdef";
  t.stream_dtypes = {{"bfloat16", "w"}};
  for (std::uint64_t e = 0; e < 2; ++e) t.feeds.push_back(Feed{e, Engine(0).plan_digest, {Part{0, bytes}}});
  return t;
}

// Catches: feeders or parts dealt by anything but the joins' feeds (a
// round-robin engine setup, feeder indices that are trainer ranks when they
// differ, targets of the wrong engine rank).
TEST(ShardedTopology, EachEngineHearsWhoWritesWhichPartAndEachTrainerWhereToSend) {
  const std::vector<Join> trainers = {Trainer(0, 800), Trainer(1, 800)};
  const std::vector<Join> engines = {Engine(0), Engine(1)};
  auto topology = plan_topology(trainers, engines, 7, false);
  ASSERT_TRUE(topology.ok()) << topology.status().ToString();
  for (const refit::Setup& e : topology->engine_setups) {
    EXPECT_EQ(e.feeders, (std::vector<std::uint64_t>{0, 1}));
    ASSERT_EQ(e.parts.size(), 1u);
    EXPECT_EQ(e.parts[0], (std::vector<Part>{{0, 800}, {1, 800}}));
    EXPECT_EQ(e.seed, 7u);
  }
  for (const refit::Setup& t : topology->trainer_setups) {
    ASSERT_EQ(t.targets.size(), 2u);
    EXPECT_EQ(t.targets[1], (EngineTarget{1, "127.0.0.1:4001", "pool-1", "cpu"}));
    EXPECT_EQ(t.feeder_count, 0u);  // the full-weight fields stay unset
  }
}

// Catches: parts that leave a bucket short (or overfull) accepted, which
// would leave engine bytes unwritten or written twice.
TEST(ShardedTopology, PartsThatDoNotFillABucketAreRefusedNamingTheBucketAndTheEngine) {
  const std::vector<Join> engines = {Engine(0), Engine(1)};
  Status s = plan_topology({Trainer(0, 800), Trainer(1, 799)}, engines, 7, false).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_HAS(s.message(), "the trainer ranks' parts of bucket 0 of engine rank 0 add up to 1599 bytes, its entries "
                          "hold 1600");
}

// Catches: trainers of different layouts or transfer plans accepted
// (their parts would not fit together), and a feed's plan digest not
// compared with the engine's.
TEST(ShardedTopology, TrainersThatPlannedDifferentlyAreRefusedNamingBothSides) {
  const std::vector<Join> engines = {Engine(0), Engine(1)};
  Join other_layout = Trainer(1, 800);
  other_layout.layout = "tp:2";
  EXPECT_HAS(plan_topology({Trainer(0, 800), other_layout}, engines, 7, false).status().message(),
             "trainer layout differs: trainer rank 0 has 'fsdp:2', trainer rank 1 has 'tp:2'");
  Join other_plan = Trainer(1, 800);
  other_plan.transfer_digest = "fedcba9876543210";
  EXPECT_HAS(plan_topology({Trainer(0, 800), other_plan}, engines, 7, false).status().message(),
             "transfer plan digest mismatch: trainer rank 0 computed 0123456789abcdef, trainer rank 1 computed "
             "fedcba9876543210");
  Join other_stream = Trainer(1, 800);
  other_stream.feeds[1].plan_digest = "0000000000000000";
  EXPECT_HAS(plan_topology({Trainer(0, 800), other_stream}, engines, 7, false).status().message(),
             "plan digest mismatch: trainer rank 1 computed 0000000000000000 for engine rank 1's stream");
}

// Catches: full-weight trainers fewer than the engine ranks accepted at
// setup (the coordinator no longer refuses them before the joins).
TEST(ShardedTopology, FullWeightTrainersFewerThanEngineRanksAreRefusedAtSetup) {
  Join t = Common(Role::kTrainer, 0);
  t.trainer_ranks = 1;
  std::vector<Join> engines = {Engine(0), Engine(1)};
  for (Join& e : engines) e.trainer_ranks = 1;
  EXPECT_HAS(plan_topology({t}, engines, 7, false).status().message(),
             "fewer trainer ranks (1) than engine ranks (2)");
}

}  // namespace
}  // namespace refit
