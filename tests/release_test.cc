// End to end: release between refits (`--release-between-refits`, issue 21
// item 6) in real processes. After every commit the trainers let go of the
// engines' pools and the engines free them (and a staged shadow arena),
// then take them again before the next refit; every refit still verifies.
// The Python binding's test (refit_test.py) checks that no process maps a
// pool between refits; the phase machine's rules are in
// src/control/release_phases_test.cc.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "process_harness.h"
#include "refit/model.h"
#include "refit/reference_engine.h"

namespace refit {
namespace {

using nlohmann::json;
using testing::run_refit;

json run_demo(std::vector<std::string> extra) {
  std::vector<std::string> args = {"demo", "--json", "--model", "tiny", "--engine-ranks", "2", "--refits", "3",
                                   "--release-between-refits", "--timeout", "120"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = run_refit(args);
  EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
  return r.exit_code == 0 ? json::parse(r.out) : json();
}

// Every refit of every layout and transport verifies, and each engine rank
// returns the same bytes after every refit: its receive pool, and with
// --shadow (staged) exactly one weight arena more. Catches: a pool not
// re-created at the acquire (the next refit fails to link or to verify), a
// trainer that keeps its old target (it writes into the freed pool), a
// shadow arena not released (the difference would be 0) or released with
// the served one (the readers' checks and the verification fail), the
// released bytes reported for the wrong refit.
TEST(ReleaseBetweenRefits, EveryRefitVerifiesAndEachEngineReturnsItsPoolAndShadowArena) {
  const Model tiny = make_model("tiny", -1).value();
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--transport", "shm"},
        std::vector<std::string>{"--transport", "tcp", "--trainer-layout", "fsdp", "--trainer-ranks", "3"}}) {
    const json plain = run_demo(layout);
    std::vector<std::string> shadow_args = layout;
    for (const char* a : {"--shadow", "--readers", "2"}) shadow_args.push_back(a);
    const json shadow = run_demo(shadow_args);
    ASSERT_FALSE(plain.is_null() || shadow.is_null());
    for (const json* report : {&plain, &shadow}) {
      EXPECT_TRUE((*report)["verified"].get<bool>()) << report->dump();
      ASSERT_EQ((*report)["refits"].size(), 3u);
    }
    EXPECT_EQ(shadow["torn_reads"].get<std::uint64_t>(), 0u);
    for (std::size_t v = 0; v < 3; ++v) {
      const json& pool = plain["refits"][v]["released_bytes"];
      const json& both = shadow["refits"][v]["released_bytes"];
      ASSERT_EQ(pool.size(), 2u) << plain.dump();
      ASSERT_EQ(both.size(), 2u) << shadow.dump();
      for (int e = 0; e < 2; ++e) {
        const std::uint64_t stride = shadow_arena_stride(engine_stream(tiny, e, 2));
        EXPECT_GT(pool[e].get<std::uint64_t>(), 0u);
        EXPECT_EQ(pool[e], plain["refits"][0]["released_bytes"][e]) << "refit " << v + 1;
        EXPECT_EQ(both[e].get<std::uint64_t>(), pool[e].get<std::uint64_t>() + stride)
            << "engine rank " << e << ", refit " << v + 1 << ": the shadow arena not served was not released";
      }
    }
  }
}

// Without the flag nothing is released: no released_bytes in the report
// (the default a user runs). Catches: a release that happens by default.
TEST(ReleaseBetweenRefits, TheDefaultReleasesNothing) {
  auto r = run_refit({"demo", "--json", "--model", "tiny", "--refits", "2", "--transport", "shm", "--timeout", "120"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = json::parse(r.out);
  for (const json& refit : report["refits"]) EXPECT_FALSE(refit.contains("released_bytes")) << refit.dump();
}

}  // namespace
}  // namespace refit
