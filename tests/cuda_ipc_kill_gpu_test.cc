// GPU (label gpu): kill -9 of a rank in the middle of a job over cuda_ipc,
// trainer and engine as separate processes on one GPU. The failure tests of
// failure_test.cc do this over shm and tcp on the CPU; on the GPU two things
// differ. A staged trainer announces a bucket (kLanded) while its pack is
// still queued, with the slot's interprocess landing event recorded after
// it: killed then, its event is never completed by anyone, and the engine,
// which polls that event before reading the slot, must still fail within
// the refit deadline. An engine killed while a trainer holds its pool or its
// weights mapped (cudaIpcOpenMemHandle) leaves the trainer writing into
// memory whose owner is gone: the trainer must fail naming the engine, not
// hang in a copy or report the refit complete. Skips where no GPU exists.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda/gpu_test_util.h"
#include "job.h"
#include "kill_mid_job.h"
#include "process_harness.h"
#include "cuda/device.h"

namespace refit {
namespace {

using nlohmann::json;
using testing::ProcessGroup;

// A job over cuda_ipc on one GPU: a coordinator, engine rank 0, trainer rank 0.
struct Job {
  std::string mode = "staged";
  std::string model = "tiny";
  std::string bucket = "1MiB";
  int refits = 3;
  int refit_timeout_s = 60;
  std::vector<std::string> rank_extra;     // appended to both ranks' flags
  std::vector<std::string> trainer_extra;  // appended to the trainer's
};

// Starts `job` (tests/job.h); false when the coordinator did not listen.
bool Start(ProcessGroup& group, const Job& job) {
  testing::JobSpec spec;
  spec.engine_ranks = 1;
  spec.trainer_ranks = 1;
  spec.refits = job.refits;
  spec.transport = "cuda_ipc";
  spec.model = job.model;
  spec.bucket_size = job.bucket;
  spec.setup_timeout_s = 60;
  spec.refit_timeout_s = job.refit_timeout_s;
  spec.rank_args = {"--device", "cuda", "--mode", job.mode};
  spec.rank_args.insert(spec.rank_args.end(), job.rank_extra.begin(), job.rank_extra.end());
  if (job.mode == "staged") spec.extra["engine rank 0"] = {"--poison-recycled"};
  spec.extra["trainer rank 0"] = job.trainer_extra;
  return testing::start_job(group, spec);
}

struct KillCase {
  std::string victim, mode;
};

class CudaIpcKillTest : public ::testing::TestWithParam<KillCase> {};

// Catches: an engine whose wait for a landing event is bounded by nothing
// (a dead trainer's event never completes: the engine would hang past the
// deadline), a trainer whose writes into a dead engine's mapping are
// reported as a committed refit, and errors that do not name the lost rank.
TEST_P(CudaIpcKillTest, EverySurvivorFailsNamingTheLostRank) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  const KillCase& c = GetParam();
  Job job;
  job.mode = c.mode;
  job.model = "tiny-moe";
  job.bucket = "256KiB";
  job.refits = 100000;  // far more than will run: the kill lands mid-job
  job.refit_timeout_s = 15;
  // The kill lands inside refit 3: trainer rank 0 stops itself there after its first bucket.
  job.trainer_extra.insert(job.trainer_extra.end(), {"--debug-stop-after-bucket", "3"});
  ProcessGroup group;
  ASSERT_TRUE(Start(group, job)) << group.all_stderr();
  ASSERT_NO_FATAL_FAILURE(testing::KillMidJobAndExpectEverySurvivorToNameIt(group, c.victim, job.refit_timeout_s + 15,
                                                                            "trainer rank 0", 3));
  const json report = json::parse(group.report());
  ASSERT_GE(report["refits"].size(), 1u) << "no refit committed before the kill: " << report.dump();
  for (std::size_t i = 0; i < report["refits"].size(); ++i) EXPECT_EQ(report["refits"][i]["version"], i + 1);
}

INSTANTIATE_TEST_SUITE_P(Roles, CudaIpcKillTest,
                         ::testing::Values(KillCase{"trainer rank 0", "staged"}, KillCase{"engine rank 0", "staged"},
                                           KillCase{"trainer rank 0", "direct"}, KillCase{"engine rank 0", "direct"}),
                         [](const auto& info) {
                           std::string v = info.param.victim;
                           for (char& ch : v) {
                             if (ch == ' ') ch = '_';
                           }
                           return v + "_" + info.param.mode;
                         });

// The case a random kill rarely hits: the trainer announces its first bucket
// of refit 2 while the bucket's pack, and the slot's landing event after it,
// wait on its stream behind a 30 s GPU delay, then dies by SIGKILL
// (--debug-die-after-announce). The engine, polling that event, must stop at
// once when the link to the trainer breaks or the coordinator aborts, far
// inside the 60 s refit and bucket deadlines.
// Catches: CudaIpcTarget::wait_landed polling without its `interrupted`
// check (the engine waits the whole deadline for an event nobody will
// complete; mutation tried, see docs/TESTING.md).
TEST(CudaIpcKill, ATrainerKilledBeforeItsAnnouncedPackRanEndsTheEngineAtOnce) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  Job job;  // staged, tiny, 1 MiB buckets, 3 refits, 60 s refit deadline
  job.rank_extra = {"--bucket-timeout", "60"};
  job.trainer_extra = {"--debug-die-after-announce", "2"};
  ProcessGroup group;
  ASSERT_TRUE(Start(group, job)) << group.all_stderr();
  ASSERT_TRUE(group.wait_one("trainer rank 0", 120)) << group.all_stderr();
  ASSERT_EQ(group.exit_code("trainer rank 0"), 128 + SIGKILL) << group.all_stderr();
  ASSERT_NE(group.err("trainer rank 0").find("dying by SIGKILL"), std::string::npos) << group.all_stderr();
  const auto died = std::chrono::steady_clock::now();
  ASSERT_TRUE(group.wait_all(20)) << "a survivor still runs 20 s after the trainer died:\n" << group.all_stderr();
  const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - died).count();
  EXPECT_LT(took_s, 10.0) << group.all_stderr();
  for (const std::string name : {"coordinator", "engine rank 0"}) {
    EXPECT_NE(group.exit_code(name), 0) << name << "\n" << group.all_stderr();
    EXPECT_NE(group.err(name).find("trainer rank 0"), std::string::npos) << name << ":\n" << group.err(name);
  }
  const json report = json::parse(group.report());
  EXPECT_FALSE(report["verified"].get<bool>());
  EXPECT_EQ(report["refits"].size(), 1u) << report.dump();
}

}  // namespace
}  // namespace refit
