// End to end: delta refits (`--delta`, issue 22) in real processes over shm,
// tcp and ucx. Each bucket goes as the smaller of its bytes and its changed
// words against the version the engine rank holds committed; the engines
// decode in their slots and verify every byte of every version as before.
// An engine rank without a whole committed version (the first refit, after
// a failed refit into live weights) gets every byte; one whose served
// weights stayed whole (shadow weights) keeps getting deltas. The codec's
// property tests are in src/delta/word_delta_test.cc, the frames' and the
// ledger's rules in src/net/frames_test.cc and src/receiver/.
#include <gtest/gtest.h>
#include <signal.h>

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
using testing::JobSpec;
using testing::ProcessGroup;
using testing::run_refit;

json run_delta_demo(const std::string& transport, const std::string& fraction) {
  auto r = run_refit({"demo", "--json", "--model", "tiny", "--engine-ranks", "2", "--refits", "3", "--transport",
                      transport, "--bucket-size", "1MiB", "--delta", "--change-fraction", fraction, "--timeout",
                      "120"});
  EXPECT_EQ(r.exit_code, 0) << transport << " " << fraction << "\n" << r.err << r.out;
  return r.exit_code == 0 ? json::parse(r.out) : json();
}

// 1 MiB buckets of tiny (tensors cut at bucket edges, several buckets per
// trainer rank): at 1% changed, refit 1 sends every bucket as it is and
// every later one sends every bucket encoded, in well under a tenth of the
// bytes; at 100% nothing is encoded and the wire carries the bytes. Every
// refit verifies. Catches: no base offered in the credits (refits 2 and 3
// full), a decode over the wrong base or into the wrong place (verification
// fails), the base not advanced at the commit (the decode's version check
// fails refit 3), encoded buckets counted at their full size (wire_bytes).
// Tried once: offering base 0 always made refits 2 and 3 full.
TEST(DeltaJob, LaterRefitsSendOnlyTheChangedWordsAndEveryRefitVerifies) {
  std::vector<std::string> transports = {"shm", "tcp"};
  if (testing::ucx_built()) transports.push_back("ucx");  // kRemoteDelta: encoded before the credit
  for (const std::string& transport : transports) {
    const json sparse = run_delta_demo(transport, "0.01");
    const json dense = run_delta_demo(transport, "1");
    ASSERT_FALSE(sparse.is_null() || dense.is_null());
    for (const json* report : {&sparse, &dense}) {
      EXPECT_TRUE((*report)["verified"].get<bool>()) << report->dump();
      ASSERT_EQ((*report)["refits"].size(), 3u);
    }
    for (std::size_t v = 0; v < 3; ++v) {
      const json& s = sparse["refits"][v];
      const json& d = dense["refits"][v];
      const auto bytes = s["bytes"].get<std::uint64_t>();
      ASSERT_GT(s["encodings"]["full"].get<std::uint64_t>() + s["encodings"]["words"].get<std::uint64_t>(), 2u);
      if (v == 0) {
        EXPECT_EQ(s["encodings"]["words"], 0u) << transport << ": no base before the first commit";
        EXPECT_EQ(s["wire_bytes"].get<std::uint64_t>(), bytes);
      } else {
        EXPECT_EQ(s["encodings"]["full"], 0u) << transport << " refit " << v + 1 << ": " << s.dump();
        EXPECT_LT(s["wire_bytes"].get<std::uint64_t>(), bytes / 10) << transport << ": " << s.dump();
      }
      EXPECT_EQ(d["encodings"]["words"], 0u) << transport << ": every word changed";
      EXPECT_EQ(d["wire_bytes"].get<std::uint64_t>(), d["bytes"].get<std::uint64_t>());
    }
  }
}

// A refit that fails after trainer rank 0 wrote part of it (--debug-fail-
// refit 2). Live weights are then no longer whole, so refit 3 goes full and
// refit 4 encoded again; shadow weights still serve refit 1 whole, so refit
// 3 is encoded against it. Every committed refit verifies. Catches: an
// engine that offers its version while its weights are incomplete (refit 3
// would decode over half-written bytes and fail verification), a trainer
// that keeps the failed refit's bytes as its base (refit 3's encodings are
// against version 2 and the engine refuses them), a shadow engine that
// stops offering its base after an abort. Tried once: offering the version
// without checking weights_complete() failed refit 3's verification. Over
// ucx the trainer has encoded refit 3's buckets before their credits name
// no base (live weights): it must send their bytes after all. Catches: the
// remote delta sender sending an encoding without comparing the credit's
// base (the engine refuses an encoded bucket where it offered no base).
TEST(DeltaJob, AFailedRefitSendsFullBytesToLiveWeightsAndDeltasToShadowWeights) {
  std::vector<std::string> transports = {"shm"};
  if (testing::ucx_built()) transports.push_back("ucx");
  for (const std::string& transport : transports) {
    for (bool shadow : {false, true}) {
      JobSpec spec;
      spec.transport = transport;
      spec.refits = 4;
      spec.rank_args = {"--delta", "--change-fraction", "0.01"};
      spec.extra["trainer rank 0"] = {"--debug-fail-refit", "2"};
      if (shadow) {
        for (int e = 0; e < spec.engine_ranks; ++e) spec.extra["engine rank " + std::to_string(e)] = {"--shadow"};
      }
      ProcessGroup group;
      ASSERT_TRUE(testing::start_job(group, spec)) << group.all_stderr();
      ASSERT_TRUE(group.wait_all(120)) << group.all_stderr();
      const json report = json::parse(group.report());
      ASSERT_EQ(report["failures"].size(), 1u) << report.dump(2);
      ASSERT_EQ(report["refits"].size(), 3u) << report.dump(2);
      std::vector<std::uint64_t> words;
      for (const json& r : report["refits"]) {
        EXPECT_TRUE(r["verified"].get<bool>()) << r.dump();
        words.push_back(r["encodings"]["words"].get<std::uint64_t>());
      }
      EXPECT_EQ(words[0], 0u) << "refit 1 has no base";
      EXPECT_EQ(words[1] > 0, shadow) << transport << ", " << (shadow ? "shadow" : "live")
                                      << " weights, refit 3: " << report.dump(2);
      EXPECT_GT(words[2], 0u) << "refit 4: " << report["refits"][2].dump();
    }
  }
}

// kill -9 of trainer rank 0 in the middle of refit 3, a delta refit (it
// stopped itself after sending its first bucket, encoded against refit 2):
// the job fails naming it, and every shadow engine rank still serves refit
// 2, whole and verified. Catches: an engine that commits, or serves, a
// version decoded from half a refit's deltas.
TEST(DeltaJob, ATrainerKilledMidDeltaLeavesEveryEngineAtItsCommittedVersion) {
  JobSpec spec;
  spec.refits = 4;
  spec.rank_args = {"--delta", "--change-fraction", "0.01"};
  for (int e = 0; e < spec.engine_ranks; ++e) spec.extra["engine rank " + std::to_string(e)] = {"--shadow"};
  testing::stop_mid_refit(spec, "trainer rank 0", 3);
  ProcessGroup group;
  ASSERT_TRUE(testing::start_job(group, spec)) << group.all_stderr();
  ASSERT_NO_FATAL_FAILURE(
      testing::KillMidJobAndExpectEverySurvivorToNameIt(group, "trainer rank 0", 60, "trainer rank 0", 3));
  const json report = json::parse(group.report());
  ASSERT_EQ(report["refits"].size(), 2u) << report.dump(2);
  EXPECT_GT(report["refits"][1]["encodings"]["words"].get<std::uint64_t>(), 0u) << "refit 2 was a delta refit";
  ASSERT_EQ(report["engines_at_end"].size(), 2u) << report.dump();
  for (const json& engine : report["engines_at_end"]) {
    EXPECT_EQ(engine["weight_version"], 2u) << engine.dump();
    EXPECT_EQ(engine["verified_version"], 2u) << engine.dump();
    EXPECT_TRUE(engine["weights_complete"].get<bool>()) << engine.dump();
  }
}

// Under --quantize fp8-block128 the buckets hold FP8 codes and scales,
// which the trainer quantizes before the pack: at 1% of bf16 elements
// changed later refits are encoded in under a tenth of the bytes (a code
// changes with its element, a block's codes all with its scale), and the
// engine verifies every code and scale against the CPU reference. One
// engine rank: tiny's blocks cannot be split over two. Catches: a decode
// over base bytes that are not the engine's codes and scales as served
// (verification fails), a conversion the bases miss (refit 3 fails).
TEST(DeltaJob, QuantizedBucketsAreEncodedLikeAnyBytes) {
  std::vector<std::string> transports = {"shm"};
  if (testing::ucx_built()) transports.push_back("ucx");
  for (const std::string& transport : transports) {
    auto r = run_refit({"demo", "--json", "--model", "tiny", "--engine-ranks", "1", "--refits", "3", "--transport",
                        transport, "--bucket-size", "1MiB", "--delta", "--change-fraction", "0.01", "--quantize",
                        "fp8-block128", "--timeout", "120"});
    ASSERT_EQ(r.exit_code, 0) << transport << "\n" << r.err << r.out;
    const json report = json::parse(r.out);
    EXPECT_TRUE(report["verified"].get<bool>()) << report.dump();
    EXPECT_GT(report["quantized_tensors"].get<std::uint64_t>(), 0u);
    ASSERT_EQ(report["refits"].size(), 3u);
    for (std::size_t v = 1; v < 3; ++v) {
      const json& refit = report["refits"][v];
      EXPECT_EQ(refit["encodings"]["full"], 0u) << transport << ": " << refit.dump();
      EXPECT_LT(refit["wire_bytes"].get<std::uint64_t>(), refit["bytes"].get<std::uint64_t>() / 10) << refit.dump();
    }
  }
}

// Release between refits drops each trainer's sender and link after every
// commit, not its bases: later refits are still encoded, and verify.
// Catches: the bases owned by the sender (every refit would go full).
TEST(DeltaJob, BasesOutliveTheReleaseBetweenRefits) {
  auto r = run_refit({"demo", "--json", "--model", "tiny", "--engine-ranks", "2", "--refits", "3", "--transport",
                      "tcp", "--delta", "--change-fraction", "0.01", "--release-between-refits", "--timeout", "120"});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const json report = json::parse(r.out);
  EXPECT_TRUE(report["verified"].get<bool>());
  ASSERT_EQ(report["refits"].size(), 3u);
  for (std::size_t v = 1; v < 3; ++v) {
    EXPECT_EQ(report["refits"][v]["encodings"]["full"], 0u) << report["refits"][v].dump();
    EXPECT_FALSE(report["refits"][v]["released_bytes"].empty());
  }
}

// The demo's table says what crossed the link per refit. Catches: the
// table printed without its delta part (a user would see only the bytes).
TEST(DeltaJob, TheDemoTableSaysWhatCrossedTheLink) {
  auto r = run_refit({"demo", "--model", "tiny", "--engine-ranks", "1", "--refits", "2", "--transport", "tcp",
                      "--delta", "--change-fraction", "0.01", "--timeout", "120"});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("wire bytes  of bytes  full buckets delta buckets"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1.000x             1             0"), std::string::npos) << r.out;  // refit 1: full
  EXPECT_NE(r.out.find("0.055x             0             1"), std::string::npos) << r.out;  // refit 2: 5.5%
}

// Settings delta is not built for, and ranks that disagree, are refused at
// setup, named once. Catches: --delta silently ignored in direct mode (the
// job would run full refits and report none), the agreement check dropped
// (a trainer would send encodings to an engine that never offered a base).
TEST(DeltaJob, SettingsItCannotServeAndRanksThatDisagreeAreRefusedNamingThem) {
  auto direct = run_refit({"demo", "--model", "tiny", "--engine-ranks", "1", "--refits", "1", "--delta", "--mode",
                           "direct", "--transport", "ucx", "--timeout", "60"});
  EXPECT_NE(direct.exit_code, 0);
  EXPECT_NE(direct.err.find("--delta is not built for --mode direct yet"), std::string::npos) << direct.err;
  JobSpec spec;
  spec.extra["trainer rank 1"] = {"--delta"};
  ProcessGroup group;
  ASSERT_TRUE(testing::start_job(group, spec)) << group.all_stderr();
  ASSERT_TRUE(group.wait_all(60)) << group.all_stderr();
  EXPECT_NE(group.err("coordinator").find("delta differs: engine rank 0 has no --delta, trainer rank 1 has --delta"),
            std::string::npos)
      << group.err("coordinator");
}

}  // namespace
}  // namespace refit
