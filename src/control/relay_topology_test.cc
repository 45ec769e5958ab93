// The relay tree and the setups of many engines (relay_topology.h).
#include "control/relay_topology.h"
#include "testing/expect_has.h"

#include <gtest/gtest.h>

namespace refit {
namespace {

// Engines of `ranks` ranks each, every rank with the same settings and a
// one-tensor stream; joins by k * R + r, setups as plan_topology leaves
// engine 0's.
struct Engines {
  std::vector<Join> joins;
  Topology topology;
};

Engines make_engines(int engines, int ranks) {
  Engines e;
  for (int k = 0; k < engines; ++k) {
    for (int r = 0; r < ranks; ++r) {
      Join j;
      j.role = Role::kEngine;
      j.rank = r;
      j.engine = static_cast<std::uint64_t>(k);
      j.mode = "staged";
      j.transport = "tcp";
      j.bucket_size = 1 << 20;
      j.pool_slots = 3;
      j.plan_digest = "digest-of-rank-" + std::to_string(r);
      j.specs = {TensorSpec{"w" + std::to_string(r), DType::kFloat32, {4}}};
      j.data_address = "127.0.0.1:" + std::to_string(5000 + 10 * k + r);
      j.descriptor = "pool-" + std::to_string(k) + "-" + std::to_string(r);
      e.joins.push_back(j);
    }
  }
  e.topology.engine_setups.assign(static_cast<std::size_t>(ranks), refit::Setup{});
  for (int r = 0; r < ranks; ++r) e.topology.engine_setups[static_cast<std::size_t>(r)].feeders = {0};
  return e;
}

// The job's engine slots when every engine joined at setup.
int slots(const Engines& e, int ranks) { return static_cast<int>(e.joins.size()) / ranks; }

// A chain and a fanout-2 tree: each engine after 0 is fed by its parent's
// relay feeder, each relaying rank lists exactly its children (same rank),
// every setup says the engine count and its engine, and engine 0 keeps its
// trainer feeders. Catches: parent k - 1 whatever the fanout, a child
// linked to another rank of its parent, engine 0's children copied into
// every engine's setup.
TEST(RelayTopology, EveryEngineIsFedByItsParentsSameRank) {
  EXPECT_EQ(relay_parent(1, 1), 0u);
  EXPECT_EQ(relay_parent(3, 1), 2u);
  EXPECT_EQ(relay_parent(2, 2), 0u);
  EXPECT_EQ(relay_parent(3, 2), 1u);
  EXPECT_EQ(relay_parent(4, 2), 1u);
  for (std::uint64_t fanout : {1u, 2u}) {
    Engines e = make_engines(4, 2);
    ASSERT_TRUE(plan_relay(e.joins, 2, fanout, false, slots(e, 2), e.topology).ok());
    ASSERT_EQ(e.topology.engine_setups.size(), 8u);
    for (std::size_t g = 0; g < 8; ++g) {
      const refit::Setup& s = e.topology.engine_setups[g];
      const std::uint64_t k = g / 2, r = g % 2;
      EXPECT_EQ(s.engines, 4u);
      EXPECT_EQ(s.engine, k);
      if (k == 0) {
        EXPECT_EQ(s.feeders, std::vector<std::uint64_t>{0});
      } else {
        EXPECT_EQ(s.feeders, std::vector<std::uint64_t>{relay_feeder(relay_parent(k, fanout))}) << g;
      }
      std::vector<std::uint64_t> children;
      for (const EngineTarget& t : s.relay) {
        EXPECT_EQ(t.engine_rank, r);
        EXPECT_EQ(t.address, e.joins[t.engine * 2 + r].data_address);
        EXPECT_EQ(t.descriptor, e.joins[t.engine * 2 + r].descriptor);
        children.push_back(t.engine);
      }
      std::vector<std::uint64_t> expected;
      for (std::uint64_t c = 1; c < 4; ++c) {
        if (relay_parent(c, fanout) == k) expected.push_back(c);
      }
      EXPECT_EQ(children, expected) << "engine " << k << " rank " << r << " fanout " << fanout;
    }
  }
}

// An engine rank that differs from engine 0's same rank is refused naming
// both and the field; what relays do not carry yet is refused naming the
// setting; device pools relay over cuda_ipc and nccl. Catches: engines
// after 0 never compared, a plan digest compared against another rank of
// engine 0, nccl refused again or ucx let through with device pools.
// Tried once: the check without `&& transport != "nccl"` failed the nccl
// case.
TEST(RelayTopology, DisagreementsAndSettingsRelaysDoNotCarryAreRefusedNamed) {
  Engines e = make_engines(3, 2);
  e.joins[5].plan_digest = "other";
  e.joins[5].specs[0].shape = {8};
  Status s = plan_relay(e.joins, 2, 1, false, slots(e, 2), e.topology);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_HAS(s.message(), "plan digest differs: engine 0 rank 1 has digest-of-rank-1, engine 2 rank 1 has other: ");
  EXPECT_HAS(s.message(), "tensor 0 differs in shape");
  e = make_engines(2, 1);
  e.joins[1].delta = true;
  EXPECT_HAS(plan_relay(e.joins, 1, 1, false, slots(e, 1), e.topology).message(),
             "delta differs: engine 0 rank 0 has no --delta, engine 1 rank 0 has --delta");
  e = make_engines(2, 1);
  for (Join& j : e.joins) j.mode = "direct";
  EXPECT_HAS(plan_relay(e.joins, 1, 1, false, slots(e, 1), e.topology).message(),
             "which --mode direct has not: use --mode staged");
  e = make_engines(2, 1);
  for (Join& j : e.joins) j.device = "cuda";
  EXPECT_HAS(plan_relay(e.joins, 1, 1, false, slots(e, 1), e.topology).message(),
             "between device pools over cuda_ipc and nccl only so far, not --transport tcp with --device cuda");
  for (Join& j : e.joins) j.transport = "ucx";
  EXPECT_HAS(plan_relay(e.joins, 1, 1, false, slots(e, 1), e.topology).message(),
             "not --transport ucx with --device cuda");
  for (const char* carried : {"cuda_ipc", "nccl"}) {
    e = make_engines(2, 1);
    for (Join& j : e.joins) j.device = "cuda", j.transport = carried;
    EXPECT_TRUE(plan_relay(e.joins, 1, 1, false, slots(e, 1), e.topology).ok()) << carried;
  }
  e = make_engines(2, 1);
  EXPECT_HAS(plan_relay(e.joins, 1, 1, true, slots(e, 1), e.topology).message(),
             "--release-between-refits is not supported");
  e = make_engines(1, 2);  // one engine: nothing to relay, the setups untouched
  ASSERT_TRUE(plan_relay(e.joins, 2, 1, true, slots(e, 2), e.topology).ok());
  EXPECT_EQ(e.topology.engine_setups.size(), 2u);
  EXPECT_EQ(e.topology.engine_setups[0].engines, 1u);
}

}  // namespace
}  // namespace refit
