// A broken CUDA context ends the job at once (label gpu). After a sticky
// error (here an illegal address, injected with --debug-cuda-fault-refit)
// every later CUDA call of the process fails the same way, so the trainer
// must not relink and fail every later refit: it reports the failure with
// the cause and "restart", exits, and the coordinator ends the job naming it.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda/gpu_test_util.h"
#include "job.h"
#include "process_harness.h"
#include "cuda/device.h"

namespace refit::testing {
namespace {

using Json = nlohmann::json;

// Catches: a trainer that treats the sticky error as recoverable (the
// mutation: refit_or_report without the cuda_context_health check): it
// relinks, refit 3 fails the same way, the failures list holds refits 2 and
// 3 and the job goes on failing; and a report that does not say what broke
// or that the process must restart.
TEST(CudaFaultGpuTest, AStickyErrorInATrainerEndsTheJobNamingIt) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  ProcessGroup g;
  JobSpec spec;
  spec.transport = "cuda_ipc";
  spec.engine_ranks = 1;
  spec.trainer_ranks = 1;
  spec.refits = 4;
  spec.extra["trainer rank 0"] = {"--device", "cuda", "--debug-cuda-fault-refit", "2"};
  spec.extra["engine rank 0"] = {"--device", "cuda"};
  const auto started = std::chrono::steady_clock::now();
  ASSERT_TRUE(start_job(g, spec)) << g.all_stderr();
  ASSERT_TRUE(g.wait_all(120)) << "hung:\n" << g.all_stderr();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  // "At once": well inside the 20 s setup and refit deadlines, which a
  // relink attempt or a rank waiting for its lost peer would run into.
  EXPECT_LT(seconds, 15.0) << g.all_stderr();

  EXPECT_NE(g.exit_code("trainer rank 0"), 0) << "the trainer with a broken context must exit\n" << g.all_stderr();
  EXPECT_NE(g.exit_code("coordinator"), 0) << g.all_stderr();
  const std::string trainer = g.err("trainer rank 0");
  EXPECT_EQ(trainer.find("relinked"), std::string::npos) << "no relink with a broken context\n" << trainer;

  const Json report = Json::parse(g.report());
  std::vector<int> committed;
  for (const Json& r : report["refits"]) committed.push_back(r["version"].get<int>());
  EXPECT_EQ(committed, (std::vector<int>{1})) << "nothing after the broken refit\n" << report.dump(2);
  ASSERT_EQ(report["failures"].size(), 1u) << report.dump(2) << g.all_stderr();
  const std::string error = report["failures"][0]["error"].get<std::string>();
  EXPECT_EQ(report["failures"][0]["version"], 2);
  EXPECT_NE(error.find("cudaErrorIllegalAddress"), std::string::npos) << error;
  EXPECT_NE(error.find("restart the process"), std::string::npos) << error;
  EXPECT_NE(error.find("trainer rank 0"), std::string::npos) << error;
}

}  // namespace
}  // namespace refit::testing
