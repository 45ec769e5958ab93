// End to end: many engines (issue 18, step 1: fixed membership) in real
// processes. Engine 0 is fed by the trainer ranks; every other engine's rank
// r by rank r of its parent in the relay tree (--relay-fanout; 1: a chain),
// which forwards each bucket from its receive pool as it lands. Every
// engine verifies every byte of every version; a refit commits only once
// every rank of every engine has it. The relay tree's own rules are in
// src/control/relay_topology_test.cc, the receiver's hold on a slot until
// it was forwarded in src/receiver/receiver_tap_test.cc.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "chain_kill.h"
#include "job.h"
#include "kill_mid_job.h"
#include "process_harness.h"

namespace refit {
namespace {

using nlohmann::json;
using testing::chain_stopped_in_refit_2;
using testing::JobSpec;
using testing::ProcessGroup;
using testing::run_refit;

json run_engines_demo(std::vector<std::string> args) {
  std::vector<std::string> base = {"demo", "--json", "--model", "tiny", "--refits", "3", "--timeout", "120"};
  base.insert(base.end(), args.begin(), args.end());
  auto r = run_refit(base);
  EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
  return r.exit_code == 0 ? json::parse(r.out) : json();
}

// Every engine committed every version, verified; the trainers' links
// carried one engine's bytes per refit and every link together E times
// that; the report names the relay tree; each relaying rank forwarded its
// stream once per child.
void expect_relayed(const json& report, std::size_t engines, const std::vector<json>& parents) {
  ASSERT_FALSE(report.is_null());
  EXPECT_TRUE(report["verified"].get<bool>()) << report.dump(2);
  ASSERT_EQ(report["engines"].size(), engines) << report.dump(2);
  for (std::size_t k = 0; k < engines; ++k) {
    EXPECT_EQ(report["engines"][k]["engine"], k);
    EXPECT_EQ(report["engines"][k]["versions"], json::array({1, 2, 3})) << report["engines"][k].dump();
    EXPECT_TRUE(report["engines"][k]["lost"].is_null());
    EXPECT_GT(report["engines"][k]["gbps"].get<double>(), 0.0);
  }
  EXPECT_EQ(report["relay"]["parents"], json(parents)) << report["relay"].dump();
  ASSERT_EQ(report["refits"].size(), 3u);
  for (const json& refit : report["refits"]) {
    const auto bytes = refit["bytes"].get<std::uint64_t>();
    EXPECT_EQ(refit["trainer_link_bytes"].get<std::uint64_t>(), bytes) << refit.dump();
    EXPECT_EQ(refit["wire_bytes"].get<std::uint64_t>(), engines * bytes) << refit.dump();
  }
  std::vector<std::uint64_t> children(engines, 0);
  for (std::size_t k = 1; k < engines; ++k) ++children[parents[k].get<std::size_t>()];
  for (const json& rank : report["ranks"]) {
    const auto k = rank["engine"].get<std::size_t>();
    EXPECT_EQ(rank.value("relay_bytes", std::uint64_t{0}), children[k] * rank["bytes"].get<std::uint64_t>())
        << rank.dump();
  }
}

// A chain of three engines of two ranks over shm and tcp, 1 MiB buckets
// (tensors cut at bucket edges, many buckets in flight) and recycled slots
// poisoned, then the same with the default bucket size and pool. Catches:
// a slot recycled before its bucket was forwarded (the child receives
// poison: its verification fails), a child fed by the trainers instead of
// its parent (trainer_link_bytes), a relay that skips buckets completing no
// tensor (the child waits for them: timeout), versions committed before
// every engine had them (the coordinator's count of engine ranks).
// Tried once: release_slot without wait_forwarded failed verification of
// engine 1 under --poison-recycled.
TEST(ManyEngines, AChainOfThreeEnginesCommitsEveryVersionAndTheTrainersSendEachByteOnce) {
  for (const char* transport : {"shm", "tcp"}) {
    SCOPED_TRACE(transport);
    expect_relayed(run_engines_demo({"--engines", "3", "--engine-ranks", "2", "--transport", transport,
                                     "--bucket-size", "1MiB", "--poison-recycled"}),
                   3, {nullptr, 0, 1});
    expect_relayed(run_engines_demo({"--engines", "3", "--engine-ranks", "2", "--transport", transport}), 3,
                   {nullptr, 0, 1});
  }
}

// --relay-fanout 2: engine 0 feeds 1 and 2, engine 1 feeds 3; each
// relaying rank writes its stream once per child. Catches: a parent
// computed as k - 1 whatever the fanout, one child per parent served.
TEST(ManyEngines, AFanoutTwoTreeFeedsEveryEngineFromItsParent) {
  expect_relayed(run_engines_demo({"--engines", "4", "--engine-ranks", "1", "--relay-fanout", "2", "--transport",
                                   "tcp", "--bucket-size", "1MiB"}),
                 4, {nullptr, 0, 0, 1});
}

// Delta refits in a relay: engine 0 gets changed words from the trainers,
// and each relaying rank forwards a bucket that arrived encoded as its
// encoding to a child at the same base (every engine committed the same
// versions), so every link carries the encodings: wire bytes = 3 x the
// trainers'. Every engine verifies every byte. Catches: the decoded bytes
// relayed (wire bytes = trainers' + 2 x the bytes), an encoding relayed
// into a child that decodes it over another base (verification fails).
// Tried once: relay_payload always raw gave wire bytes of 2 x the bytes more.
TEST(ManyEngines, DeltaRefitsAreRelayedEncodedToEnginesAtTheSameBase) {
  const json report = run_engines_demo({"--engines", "3", "--engine-ranks", "1", "--transport", "tcp", "--delta",
                                        "--change-fraction", "0.01", "--bucket-size", "1MiB"});
  ASSERT_FALSE(report.is_null());
  EXPECT_TRUE(report["verified"].get<bool>()) << report.dump(2);
  for (const json& engine : report["engines"]) EXPECT_EQ(engine["versions"], json::array({1, 2, 3}));
  const json& first = report["refits"][0];
  EXPECT_EQ(first["wire_bytes"].get<std::uint64_t>(), 3 * first["bytes"].get<std::uint64_t>()) << "no base yet";
  for (std::size_t v = 1; v < 3; ++v) {
    const json& refit = report["refits"][v];
    const auto bytes = refit["bytes"].get<std::uint64_t>(), trainers = refit["trainer_link_bytes"].get<std::uint64_t>();
    EXPECT_LT(trainers, bytes / 10) << refit.dump();
    EXPECT_EQ(refit["wire_bytes"].get<std::uint64_t>(), 3 * trainers) << refit.dump();
  }
}

// The demo's table names the job's engines, who feeds each, the versions
// each committed and its rate, and every engine rank by engine and rank.
// Catches: the table printed as for one engine (a user would not see the
// relay tree nor which engine a rank belongs to).
TEST(ManyEngines, TheDemoTableShowsEveryEngineAndWhoFeedsIt) {
  auto r = run_refit({"demo", "--model", "tiny", "--engines", "3", "--engine-ranks", "1", "--refits", "2",
                      "--transport", "tcp", "--bucket-size", "1MiB", "--timeout", "120"});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("1 trainer rank -> 3 engines of 1 engine rank"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" engine  fed by  versions  last version"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("      0 trainers         2             2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("      2       1         2             2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("        2/0       64"), std::string::npos) << r.out;
}

// Settings relays do not carry yet are refused at setup, named once, by
// every process. Catches: --engines silently ignored in direct mode (only
// engine 0 would get the weights, and the job would still report success).
TEST(ManyEngines, DirectModeIsRefusedNamingTheSetting) {
  auto r = run_refit({"demo", "--model", "tiny", "--engines", "2", "--engine-ranks", "1", "--mode", "direct",
                      "--transport", "ucx", "--refits", "1", "--timeout", "60"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--engines 2 relays landed buckets from engine to engine out of the receive pool, which "
                       "--mode direct has not: use --mode staged"),
            std::string::npos)
      << r.err;
}

// An engine whose plan differs from engine 0's (another --layers) is
// refused at setup naming both engine ranks and the first tensor that
// differs; nothing is refitted. Catches: engines after 0 never compared
// (engine 1 would be fed buckets of another plan).
TEST(ManyEngines, AnEngineOfAnotherPlanIsRefusedNamingBothRanks) {
  JobSpec spec;
  spec.engines = 2;
  spec.engine_ranks = 1;
  spec.trainer_ranks = 1;
  spec.extra["engine 1 rank 0"] = {"--layers", "1"};
  ProcessGroup group;
  ASSERT_TRUE(testing::start_job(group, spec)) << group.all_stderr();
  ASSERT_TRUE(group.wait_all(60)) << group.all_stderr();
  const std::string err = group.err("coordinator");
  EXPECT_NE(err.find("plan digest differs: engine 0 rank 0 has"), std::string::npos) << err;
  EXPECT_NE(err.find(", engine 1 rank 0 has"), std::string::npos) << err;
  for (const auto& name : group.names()) EXPECT_NE(group.exit_code(name), 0) << name;
}

// kill -9 of the middle engine of a chain during refit 2 (the trainer
// stopped itself after its first bucket): with fixed membership the job
// fails, naming the lost engine rank, in every survivor and the report;
// nobody hangs on the relay. (Engines leaving and the survivors finishing,
// --min-engines, are the next step of issue 18.)
TEST(ManyEngines, AnEngineKilledMidRelayEndsTheJobNamingIt) {
  JobSpec spec = chain_stopped_in_refit_2(3, {});
  ProcessGroup group;
  ASSERT_TRUE(testing::start_job(group, spec)) << group.all_stderr();
  ASSERT_NO_FATAL_FAILURE(
      testing::KillMidJobAndExpectEverySurvivorToNameIt(group, "engine 1 rank 0", 60, "trainer rank 0", 2));
  const json report = json::parse(group.report());
  EXPECT_EQ(report["committed_version"], 1u) << report.dump(2);
}

// chain_kill.h's kill over `transport`.
std::pair<json, std::string> kill_one_of_a_chain_mid_relay(int victim, const char* transport) {
  JobSpec spec = chain_stopped_in_refit_2(4, {"--min-engines", "2"});
  spec.transport = transport;
  return testing::kill_one_of_a_chain_mid_relay(spec, victim);
}

// kill -9 of the middle engine of a chain of three during refit 2, with
// --min-engines 2: engine 1 is dropped, engine 0 feeds engine 2 from then
// on, refit 2 runs again on the two and every later refit commits; every
// survivor exits 0, the report is verified (every surviving engine
// verified every version) and names the lost engine and rank. Catches: an
// orphan left waiting for its dead parent (relink times out), the retry
// skipping version 2 (engine 2's versions), a drop counted as a failed
// refit (verified false). Tried once: retrying v + 1 instead of v gave
// engine 2 versions [1, 3, 4].
TEST(ManyEngines, AnEngineKilledMidRelayIsDroppedAndTheOthersGetEveryVersion) {
  for (const char* transport : {"shm", "tcp"}) {
    SCOPED_TRACE(transport);
    kill_one_of_a_chain_mid_relay(1, transport);
  }
}

// kill -9 of engine 0 itself, the one the trainer feeds, during refit 2
// (chain of three, --min-engines 2): it is dropped like any engine, the
// trainer links to engine 1 (the new root of the relay tree: a new data
// link, its pool opened), engine 1 relays to engine 2, refit 2 runs again
// and every later refit commits; every survivor exits 0 and the trainer's
// link still carries one stream per refit. Catches: a job that ends
// because engine 0 was lost although two engines stay, a trainer that
// relinks to the dead engine (its relink times out), engine 1 still
// waiting for a relay from engine 0 (no feeder ever links). Tried once:
// without the trainer's new target in the relink, the trainer's recovery
// failed connecting to the dead engine 0.
TEST(ManyEngines, EngineZeroKilledMidRelayIsDroppedAndTheTrainerFeedsTheNextEngine) {
  for (const char* transport : {"shm", "tcp"}) {
    SCOPED_TRACE(transport);
    const auto [report, trainer] = kill_one_of_a_chain_mid_relay(0, transport);
    EXPECT_NE(trainer.find("engine 1 rank 0 at"), std::string::npos) << trainer;
    EXPECT_EQ(report["relay"]["live"], json::parse(R"([{"engine": 1, "fed_by": null}, {"engine": 2, "fed_by": 1}])"))
        << report["relay"].dump();
  }
}

// Sharded trainers (two FSDP ranks, each writing parts of every bucket into
// both ranks of engine 0) and engine 0 killed in refit 2, --min-engines 1:
// engine 1 becomes the root; each trainer rank links to both of its ranks
// and engine 1 takes the trainers' parts (who writes which bytes of each
// bucket) from the relink; refits 2 and 3 commit, verified. Catches: the
// new root's ranks without the parts (they would wait for whole buckets
// from one feeder: the refit times out), a sharded trainer relinking to the
// dead engine's ranks. Tried once: the root's route without the parts left
// engine 1 at version 1.
TEST(ManyEngines, EngineZeroLostUnderShardedTrainersHandsTheirPartsToTheNextEngine) {
  JobSpec spec;
  spec.engines = 2;
  spec.engine_ranks = 2;
  spec.trainer_ranks = 2;
  spec.refits = 3;
  spec.transport = "tcp";
  spec.coordinator_args = {"--min-engines", "1"};
  for (const char* trainer : {"trainer rank 0", "trainer rank 1"}) spec.extra[trainer] = {"--trainer-layout", "fsdp:2"};
  testing::stop_mid_refit(spec, "trainer rank 0", 2);
  ProcessGroup group;
  ASSERT_TRUE(testing::start_job(group, spec)) << group.all_stderr();
  ASSERT_TRUE(testing::wait_for_refit_under_way(group, "trainer rank 0", 2)) << group.all_stderr();
  group.kill("engine 0 rank 0", SIGKILL);
  group.resume("trainer rank 0");
  ASSERT_TRUE(group.wait_all(90)) << group.all_stderr();
  for (const char* name : {"coordinator", "trainer rank 0", "trainer rank 1", "engine 1 rank 0", "engine 1 rank 1"}) {
    EXPECT_EQ(group.exit_code(name), 0) << name << "\n" << group.all_stderr();
  }
  const json report = json::parse(group.report());
  EXPECT_TRUE(report["verified"].get<bool>()) << report.dump(2);
  EXPECT_EQ(report["engines"][1]["versions"], json::array({1, 2, 3})) << report.dump(2);
  EXPECT_EQ(report["engines"][0]["versions"], json::array({1}));
}

// An engine stopped (SIGSTOP) in the middle of refit 2, past the
// coordinator's heartbeat deadline, with --min-engines 2: it is dropped
// like a dead one, and the leaf's parent stops relaying to it. Catches: a
// drop only on a closed connection (a stalled engine would end the job at
// the heartbeat deadline), a parent still waiting for the stalled child's
// credits (the retry times out).
TEST(ManyEngines, AnEngineStalledPastTheHeartbeatDeadlineIsDropped) {
  JobSpec spec = chain_stopped_in_refit_2(3, {"--min-engines", "2", "--heartbeat-timeout", "2"});
  ProcessGroup group;
  ASSERT_TRUE(testing::start_job(group, spec)) << group.all_stderr();
  ASSERT_TRUE(testing::wait_for_refit_under_way(group, "trainer rank 0", 2)) << group.all_stderr();
  group.kill("engine 2 rank 0", SIGSTOP);
  group.resume("trainer rank 0");
  ASSERT_TRUE(testing::wait_for_text(group, "coordinator", "engine 2 dropped from the job")) << group.all_stderr();
  for (const char* name : {"coordinator", "trainer rank 0", "engine 0 rank 0", "engine 1 rank 0"}) {
    ASSERT_TRUE(group.wait_one(name, 60)) << name << "\n" << group.all_stderr();
    EXPECT_EQ(group.exit_code(name), 0) << name << "\n" << group.all_stderr();
  }
  group.kill("engine 2 rank 0", SIGKILL);
  group.resume("engine 2 rank 0");
  const json report = json::parse(group.report());
  EXPECT_EQ(report["engines"][1]["versions"], json::array({1, 2, 3})) << report.dump(2);
  EXPECT_NE(report["engines"][2]["lost"].get<std::string>().find("heard nothing from it"), std::string::npos)
      << report["engines"][2].dump();
}

// The trainer killed in the middle of a relayed refit: no engine commits
// any of it, the job fails naming the trainer, every engine keeps version
// 1 (--min-engines does not save a job whose trainer is gone). Catches: an
// engine down the chain committing what the relay had forwarded so far.
TEST(ManyEngines, ATrainerKilledDuringARelayLeavesEveryEngineAtItsCommittedVersion) {
  JobSpec spec = chain_stopped_in_refit_2(3, {"--min-engines", "1"});
  ProcessGroup group;
  ASSERT_TRUE(testing::start_job(group, spec)) << group.all_stderr();
  ASSERT_NO_FATAL_FAILURE(
      testing::KillMidJobAndExpectEverySurvivorToNameIt(group, "trainer rank 0", 60, "trainer rank 0", 2));
  const json report = json::parse(group.report());
  EXPECT_EQ(report["committed_version"], 1u);
  for (const json& engine : report["engines"]) EXPECT_EQ(engine["versions"], json::array({1})) << engine.dump();
  for (const json& held : report["engines_at_end"]) EXPECT_EQ(held["weight_version"], 1u) << held.dump();
}

// `refit demo --min-engines 2` with engine 1's process killed at its go of
// refit 2: the job drops it and goes on, so the demo exits 0 with a
// verified report naming the lost engine (issue 18 item 3: "the demo exits
// 0"). Catches: the demo counting a dropped engine's exit as the job's
// failure (it exited 1), or killing every other process 5 s after it
// (its grace for a failed setup). Tried once: without dropped_by_the_job
// the demo failed, its report naming "engine 1 rank 0 died of signal 9" a
// process failure.
TEST(ManyEngines, TheDemoEndsWellWhenTheJobDropsAnEngine) {
  auto r = run_refit({"demo", "--json", "--model", "tiny", "--engines", "3", "--engine-ranks", "1", "--min-engines",
                      "2", "--refits", "3", "--transport", "tcp", "--bucket-size", "1MiB", "--timeout", "60",
                      "--debug-engine-fault", "1:go:2:kill"});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const json report = json::parse(r.out);
  EXPECT_TRUE(report["verified"].get<bool>()) << report.dump(2);
  EXPECT_FALSE(report.contains("process_failures")) << report.dump(2);
  EXPECT_EQ(report["engines"][2]["versions"], json::array({1, 2, 3}));
  EXPECT_TRUE(report["engines"][1]["lost"].is_string()) << report["engines"][1].dump();
}

// --min-engines above --engines is refused at setup, naming both.
// Catches: a job that could never drop an engine accepted silently.
TEST(ManyEngines, MinEnginesAboveEnginesIsRefused) {
  auto r = run_refit({"demo", "--model", "tiny", "--engines", "2", "--min-engines", "3", "--engine-ranks", "1",
                      "--refits", "1", "--timeout", "60"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--min-engines 3 is not a count of engines in 1..2 (--engines)"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace refit
