// `refit push` of a safetensors checkpoint into running engine ranks, and
// `refit save` of what they hold, as separate processes over real sockets and
// shared memory.
//
// Each engine rank opens the same checkpoint to learn its model and verifies
// every byte it received against its shard of the file; `refit save` writes
// what it holds, and this test compares those files with the shards cut here
// from the original bytes (a second, independent check).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "job.h"
#include "process_harness.h"
#include "refit/content.h"
#include "refit/format.h"
#include "refit/model.h"
#include "refit/plan.h"
#include "refit/safetensors.h"

namespace refit::testing {
namespace {

namespace fs = std::filesystem;

// A temporary directory removed with everything in it.
struct TempDir {
  TempDir() {
    char dir[] = "/tmp/refit-push-XXXXXX";
    path = ::mkdtemp(dir);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string path;
};

// Writes `model`'s weights with content `seed` as a sharded checkpoint
// directory: two safetensors files and model.safetensors.index.json.
void write_checkpoint(const Model& model, std::uint64_t seed, const std::string& dir,
                      std::vector<std::vector<std::byte>>* bytes) {
  bytes->clear();
  for (const Weight& w : model.weights) {
    bytes->emplace_back(w.spec.nbytes());
    fill_content(content_key(seed, 1, w.spec.name), 0, bytes->back());
  }
  std::vector<SafetensorsWriteTensor> first, second;
  std::string weight_map;
  for (std::size_t i = 0; i < model.weights.size(); ++i) {
    const bool in_first = i < model.weights.size() / 2;
    (in_first ? first : second).push_back({model.weights[i].spec, (*bytes)[i]});
    weight_map += std::string(weight_map.empty() ? "" : ",") + "\"" + model.weights[i].spec.name + "\": \"" +
                  (in_first ? "part-1.safetensors" : "part-2.safetensors") + "\"";
  }
  ASSERT_TRUE(write_safetensors(dir + "/part-1.safetensors", first).ok());
  ASSERT_TRUE(write_safetensors(dir + "/part-2.safetensors", second).ok());
  std::ofstream(dir + "/model.safetensors.index.json") << "{\"metadata\": {}, \"weight_map\": {" << weight_map << "}}";
}

struct PushJob {
  int engine_ranks = 1;
  std::string engine_model;   // what the engines open
  std::string pushed;         // what push sends
  std::string save_dir;       // engines write rank-R.safetensors here
};

// Starts an on-demand coordinator and the engine ranks, then runs push.
void run_push_job(ProcessGroup& g, const PushJob& job) {
  const std::string n = std::to_string(job.engine_ranks);
  std::string address = g.spawn_coordinator({"--refits", "0", "--trainer-ranks", n, "--engine-ranks", n,
                                             "--setup-timeout", "30", "--timeout", "30"});
  ASSERT_FALSE(address.empty());
  for (int r = 0; r < job.engine_ranks; ++r) {
    g.spawn("engine rank " + std::to_string(r),
            {"save", "--coordinator", address, "--rank", std::to_string(r), "--engine-ranks", n, "--trainer-ranks", n,
             "--model", job.engine_model, "--bucket-size", "256KiB", "--setup-timeout", "30", "--timeout", "30",
             "--out", job.save_dir + "/rank-" + std::to_string(r) + ".safetensors"});
  }
  g.spawn("push", {"push", job.pushed, "--coordinator", address, "--engine-ranks", n, "--bucket-size", "256KiB",
                   "--setup-timeout", "30", "--timeout", "30"});
}

class PushTest : public ::testing::TestWithParam<int> {};

// Catches: a push that sends the wrong rank's shard, misplaces or drops
// bytes (the engines' verification against the file and the saved files
// differ), a push that does not finish the on-demand job (timeout), a save
// that writes something other than what the engine holds, and a summary
// line without its bytes or with "trainer rank(s)" back.
TEST_P(PushTest, EveryEngineRankHoldsItsShardOfTheFile) {
  const int ranks = GetParam();
  TempDir dir;
  auto model = make_model("tiny", -1);
  ASSERT_TRUE(model.ok());
  std::vector<std::vector<std::byte>> bytes;
  write_checkpoint(*model, 11, dir.path, &bytes);

  ProcessGroup g;
  run_push_job(g, {ranks, dir.path, dir.path, dir.path});
  ASSERT_TRUE(g.wait_all(120)) << g.all_stderr();
  for (const std::string& name : g.names()) EXPECT_EQ(g.exit_code(name), 0) << name << "\n" << g.all_stderr();
  EXPECT_NE(g.report().find("\"verified\": true"), std::string::npos) << g.report();
  std::uint64_t sent = 0;  // every engine rank's shards: a replicated tensor goes to each
  for (int r = 0; r < ranks; ++r) {
    for (const Weight& w : model->weights) sent += shard_spec(w, r, ranks).nbytes();
  }
  EXPECT_NE(g.err("push").find("committed as version 1 by " + format_count(ranks, "trainer rank") + " (" +
                               format_bytes(sent) + " sent per refit) in "),
            std::string::npos)
      << g.err("push");

  for (int r = 0; r < ranks; ++r) {
    auto saved = SafetensorsFile::Open(dir.path + "/rank-" + std::to_string(r) + ".safetensors");
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    ASSERT_EQ(saved->tensors().size(), model->weights.size());
    EXPECT_EQ(saved->metadata().at("refit_version"), "1");
    for (std::size_t i = 0; i < model->weights.size(); ++i) {
      const Weight& w = model->weights[i];
      const TensorSpec spec = shard_spec(w, r, ranks);
      const SafetensorsTensor* t = saved->find(w.spec.name);
      ASSERT_NE(t, nullptr) << w.spec.name;
      std::vector<std::byte> want(spec.nbytes());
      copy_shard_range(w, r, ranks, bytes[i].data(), 0, want);
      auto got = saved->data(*t);
      ASSERT_EQ(got.size(), want.size()) << w.spec.name << " on rank " << r;
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << w.spec.name << " on rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, PushTest, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "_engine_ranks"; });

// Catches: engines that do not verify against the file (a push of other
// bytes with the same shapes would then be reported as verified).
TEST(PushRejection, OtherBytesWithTheSameShapesFailVerificationNamingTheTensor) {
  TempDir expected, other;
  auto model = make_model("tiny", -1);
  ASSERT_TRUE(model.ok());
  std::vector<std::vector<std::byte>> bytes;
  write_checkpoint(*model, 11, expected.path, &bytes);
  write_checkpoint(*model, 12, other.path, &bytes);
  ProcessGroup g;
  run_push_job(g, {1, expected.path, other.path, expected.path});
  ASSERT_TRUE(g.wait_all(120)) << g.all_stderr();
  // The refit fails and is reported; the engine recovers (keeping version 0)
  // and the push ends the job.
  EXPECT_NE(g.exit_code("push"), 0);
  EXPECT_NE(g.exit_code("coordinator"), 0);
  EXPECT_NE(g.report().find("differs from " + expected.path), std::string::npos) << g.report();
  EXPECT_NE(g.err("push").find("differs from " + expected.path), std::string::npos) << g.err("push");
  EXPECT_FALSE(fs::exists(expected.path + "/rank-0.safetensors")) << "a failed refit must not be saved";
}

// Catches: a push of a checkpoint with other tensors than the engines hold
// getting past setup (rule 1: the plan digests must match).
TEST(PushRejection, ADifferentModelIsRefusedAtSetup) {
  TempDir expected, other;
  auto tiny = make_model("tiny", -1);
  auto moe = make_model("tiny-moe", -1);
  ASSERT_TRUE(tiny.ok() && moe.ok());
  std::vector<std::vector<std::byte>> bytes;
  write_checkpoint(*tiny, 11, expected.path, &bytes);
  write_checkpoint(*moe, 11, other.path, &bytes);
  ProcessGroup g;
  run_push_job(g, {1, expected.path, other.path, expected.path});
  ASSERT_TRUE(g.wait_all(120)) << g.all_stderr();
  EXPECT_NE(g.exit_code("push"), 0);
  EXPECT_NE(g.exit_code("coordinator"), 0);
  EXPECT_NE(g.err("push").find("plan digest mismatch"), std::string::npos) << g.err("push");
}

// Catches: push_one_rank without report_rank_setup_failure when
// make_rank_source fails (the coordinator and the engines wait out the 30 s
// setup timeout and say "missing trainer rank 0"), and first_cause printing
// the second rank's same failure again as "another rank failed".
TEST(PushRejection, ACheckpointPushCannotOpenStopsEveryProcessAtOnceNamingIt) {
  TempDir dir;
  const std::string missing = dir.path + "/missing.safetensors";
  ProcessGroup g;
  const auto started = std::chrono::steady_clock::now();
  run_push_job(g, {2, "tiny", missing, dir.path});
  ASSERT_TRUE(g.wait_all(60)) << g.all_stderr();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_LT(took, 10) << "the job waited for the setup deadline\n" << g.all_stderr();
  for (const std::string& name : g.names()) {
    EXPECT_NE(g.exit_code(name), 0) << name;
    EXPECT_NE(g.err(name).find(missing), std::string::npos) << name << "\n" << g.err(name);
    if (name != "push") {
      EXPECT_NE(g.err(name).find("failed its setup before joining"), std::string::npos) << g.err(name);
    }
  }
  EXPECT_EQ(g.err("push").find("another rank failed"), std::string::npos) << g.err("push");
}

// Catches: a malformed file reaching the network instead of failing at once
// with the file and the broken rule named.
TEST(PushRejection, AMalformedFileFailsBeforeJoining) {
  TempDir dir;
  const std::string path = dir.path + "/broken.safetensors";
  std::ofstream(path) << "not a safetensors file";
  RunResult r = run_refit({"push", path, "--coordinator", "127.0.0.1:1", "--setup-timeout", "5"}, 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
}

}  // namespace
}  // namespace refit::testing
