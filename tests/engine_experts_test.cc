// End to end: expert-parallel engines (`--engine-experts ep`, issue 19 item
// 1). Each engine rank holds whole experts (about E/N of them) and TP slices
// of everything else; full-weight and sharded trainers feed it, and every
// engine rank verifies every byte of every refit against its own shards.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "job.h"
#include "process_harness.h"
#include "refit/expert_parallel.h"
#include "refit/model.h"

namespace refit {
namespace {

using nlohmann::json;
using testing::JobSpec;
using testing::ProcessGroup;
using testing::run_refit;
using testing::start_job;

struct ExpertsCase {
  std::string transport, layout;
  int trainers, engines;
};

class EngineExpertsDemoTest : public ::testing::TestWithParam<ExpertsCase> {};

// Bytes of engine rank `rank`'s stream under --engine-experts ep.
std::uint64_t ep_stream_bytes(int rank, int ranks) {
  Model model = make_model("tiny-moe", -1).value();
  model = engine_expert_model(std::move(model), EngineExperts::kEp, ranks).value();
  std::uint64_t bytes = 0;
  for (const TensorSpec& s : engine_stream(model, rank, ranks)) bytes += s.nbytes();
  return bytes;
}

// Catches: the demo not passing --engine-experts to its ranks, or a side
// ignoring it (tried: trainers keep tp while engines take ep: setup refuses,
// naming the first expert tensor; engines and trainers both dropping it:
// each rank's bytes are then the TP slices' and differ from the EP stream's
// below, 64 experts over 3 ranks being 22/21/21 whole experts against TP
// slices of 43/43/42 rows), and engines verifying against TP shards.
TEST_P(EngineExpertsDemoTest, EachEngineRankGetsWholeExpertsAndVerifies) {
  const ExpertsCase& c = GetParam();
  auto r = run_refit({"demo", "--json", "--model", "tiny-moe", "--engine-experts", "ep", "--transport", c.transport,
                      "--trainer-layout", c.layout, "--trainer-ranks", std::to_string(c.trainers), "--engine-ranks",
                      std::to_string(c.engines), "--refits", "2", "--bucket-size", "1MiB", "--timeout", "120"});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  json report = json::parse(r.out);
  EXPECT_TRUE(report["verified"].get<bool>());
  ASSERT_EQ(report["ranks"].size(), static_cast<std::size_t>(c.engines));
  std::uint64_t total = 0;
  for (int e = 0; e < c.engines; ++e) {
    const json& rank = report["ranks"][static_cast<std::size_t>(e)];
    EXPECT_EQ(rank["bytes"].get<std::uint64_t>(), ep_stream_bytes(e, c.engines)) << "engine rank " << e;
    total += ep_stream_bytes(e, c.engines);
  }
  EXPECT_EQ(report["bytes_per_refit"].get<std::uint64_t>(), total);
  EXPECT_EQ(report["duplicate_bytes"], 0) << report.dump();
}

INSTANTIATE_TEST_SUITE_P(Experts, EngineExpertsDemoTest,
                         ::testing::Values(ExpertsCase{"shm", "full", 3, 3}, ExpertsCase{"tcp", "full", 2, 2},
                                           ExpertsCase{"shm", "fsdp", 2, 3}, ExpertsCase{"tcp", "fsdp", 4, 3}),
                         [](const auto& info) {
                           const ExpertsCase& c = info.param;
                           return c.transport + "_" + c.layout + "_" + std::to_string(c.trainers) + "_to_" +
                                  std::to_string(c.engines);
                         });

// Catches: a job whose engines split experts by EP while its trainers pack
// TP slices accepted (the engines would verify-fail every refit, or worse):
// setup refuses it, naming the first expert tensor and each side's rule.
TEST(EngineExperts, TrainersAndEnginesThatDisagreeAreRefusedNamingTheTensor) {
  JobSpec spec;
  spec.model = "tiny-moe";
  spec.refits = 1;
  spec.extra["engine rank 0"] = {"--engine-experts", "ep"};
  spec.extra["engine rank 1"] = {"--engine-experts", "ep"};
  ProcessGroup group;
  ASSERT_TRUE(start_job(group, spec));
  ASSERT_TRUE(group.wait_all(spec.setup_timeout_s + 20)) << "processes hung:\n" << group.all_stderr();
  for (const auto& name : group.names()) EXPECT_NE(group.exit_code(name), 0) << name << "\n" << group.all_stderr();
  const std::string coordinator = group.err("coordinator");
  EXPECT_NE(coordinator.find("model.layers.0.mlp.experts.0.gate_proj.weight"), std::string::npos) << coordinator;
  EXPECT_NE(coordinator.find("(rule expert)"), std::string::npos) << coordinator;
  EXPECT_NE(coordinator.find("(rule column)"), std::string::npos) << coordinator;
}

// Catches: --engine-experts ep on a model without experts accepted (every
// rank would silently run TP): the engine refuses it, naming the model.
TEST(EngineExperts, ADenseModelIsRefusedNamingIt) {
  auto r = run_refit({"demo", "--model", "tiny", "--engine-experts", "ep", "--refits", "1", "--timeout", "60"});
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.err.find("model 'tiny', --engine-experts ep: the model has no expert tensors"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace refit
