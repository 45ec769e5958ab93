// Tests of the ReferenceEngine's contract: DESIGN.md rules 5, 6, 8 and 9.
// Each test names the engine mutation it catches (tried once, seen failing,
// reverted).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "refit/coordinator.h"
#include "refit/engine_rank.h"
#include "refit/model.h"
#include "refit/reference_engine.h"
#include "refit/trainer_rank.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

// Owns the bytes and specs behind a hand-built AlignedBatch.
struct Fixture {
  // streams[r]: rank r's shard specs; shards are uneven (rank 0 gets more rows).
  std::vector<std::vector<TensorSpec>> streams;
  std::vector<std::vector<std::vector<std::byte>>> bytes;  // [rank][tensor]

  explicit Fixture(int ranks) {
    const std::vector<std::pair<std::string, DType>> names = {
        {"embed", DType::kBFloat16}, {"norm", DType::kFloat32}, {"q", DType::kBFloat16},
        {"scale", DType::kInt8},     {"o", DType::kFloat32},     {"k", DType::kInt8}};
    streams.resize(ranks);
    bytes.resize(ranks);
    for (int r = 0; r < ranks; ++r) {
      for (std::size_t i = 0; i < names.size(); ++i) {
        // 7 rows over the ranks, unevenly: rank 0 holds the remainder.
        const std::int64_t rows = 7 / ranks + (r < 7 % ranks ? 1 : 0);
        TensorSpec spec{names[i].first, names[i].second, {rows, 5}};
        streams[r].push_back(spec);
        std::vector<std::byte> b(spec.nbytes());
        for (std::size_t k = 0; k < b.size(); ++k) b[k] = std::byte((r * 131 + i * 17 + k * 7 + 1) & 0xff);
        bytes[r].push_back(std::move(b));
      }
    }
  }

  // An aligned batch of tensors [first, last), payload[r] = rank r's views;
  // `order` permutes the payload lists (order[r] = the rank whose views are
  // put at index r).
  AlignedBatch batch(std::size_t first, std::size_t last, std::vector<int> order = {}) {
    const int ranks = static_cast<int>(streams.size());
    if (order.empty()) {
      for (int r = 0; r < ranks; ++r) order.push_back(r);
    }
    AlignedBatch out;
    out.sequence = first;
    for (std::size_t i = first; i < last; ++i) out.specs.push_back(&streams[0][i]);
    out.payload.resize(ranks);
    for (int r = 0; r < ranks; ++r) {
      const int src = order[r];
      for (std::size_t i = first; i < last; ++i) {
        out.payload[r].push_back(TensorView{&streams[src][i], bytes[src][i].data(), MemoryKind::kHost, -1});
      }
    }
    return out;
  }
};

// Rule 5. Catches: one post per tensor (posts would be 6) or one per batch
// (posts would be 1).
TEST(ReferenceEngine, OnePostPerDTypeGroup) {
  Fixture f(2);
  ReferenceEngine engine(f.streams, {0, 1});
  ASSERT_TRUE(engine.begin(1).ok());
  AlignedBatch batch = f.batch(0, 6);
  ASSERT_EQ(batch.groups().size(), 3u);  // bfloat16, float32, int8
  for (const auto& g : batch.groups()) {
    for (std::size_t i : g.indices) EXPECT_EQ(batch.specs[i]->dtype, g.dtype);
  }
  Status s = engine.apply(batch);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(engine.stats().posts, 3u);
  EXPECT_EQ(engine.stats().tensors_applied, 12u);
  // A single-dtype batch is a single post.
  ASSERT_TRUE(engine.apply(f.batch(0, 1)).ok());
  EXPECT_EQ(engine.stats().posts, 4u);
  ASSERT_TRUE(engine.commit(1).ok());
}

// Rule 5: a post never promotes or mixes dtypes. Catches an engine that
// checks only rank 0's spec (batch.specs) and not each rank's payload dtype.
TEST(ReferenceEngine, RejectsPayloadWhoseDTypeDiffersFromItsPost) {
  Fixture f(1);
  ReferenceEngine engine(f.streams, {0});
  ASSERT_TRUE(engine.begin(1).ok());
  AlignedBatch batch = f.batch(0, 6);
  TensorSpec wrong = f.streams[0][3];  // "scale" int8
  wrong.dtype = DType::kFloat32;
  wrong.shape = {f.streams[0][3].shape[0], 5};
  batch.payload[0][3].spec = &wrong;
  Status s = engine.apply(batch);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("scale"), std::string::npos) << s.message();
  EXPECT_EQ(engine.stats().posts, 0u);
}

// Rule 6. Catches: bumping the version in apply() (version would be 1 or 2
// before commit) or bumping it in abort().
TEST(ReferenceEngine, VersionBumpsOncePerRefitAfterCommit) {
  Fixture f(2);
  ReferenceEngine engine(f.streams, {0, 1});
  EXPECT_EQ(engine.weight_version(), 0u);
  ASSERT_TRUE(engine.begin(1).ok());
  ASSERT_TRUE(engine.apply(f.batch(0, 2)).ok());
  EXPECT_EQ(engine.weight_version(), 0u);
  ASSERT_TRUE(engine.apply(f.batch(2, 6)).ok());
  EXPECT_EQ(engine.weight_version(), 0u);
  ASSERT_TRUE(engine.commit(1).ok());
  EXPECT_EQ(engine.weight_version(), 1u);
  EXPECT_TRUE(engine.weights_complete());

  // A failed refit keeps version 1 and reports the weights incomplete.
  ASSERT_TRUE(engine.begin(2).ok());
  ASSERT_TRUE(engine.apply(f.batch(0, 3)).ok());
  engine.abort(2, Aborted("trainer rank 0 died"));
  EXPECT_EQ(engine.weight_version(), 1u);
  EXPECT_FALSE(engine.weights_complete());
  EXPECT_FALSE(engine.commit(2).ok());  // no refit open any more
  EXPECT_EQ(engine.weight_version(), 1u);

  // The retry succeeds.
  ASSERT_TRUE(engine.begin(2).ok());
  ASSERT_TRUE(engine.apply(f.batch(0, 6)).ok());
  ASSERT_TRUE(engine.commit(2).ok());
  EXPECT_EQ(engine.weight_version(), 2u);
  EXPECT_TRUE(engine.weights_complete());
}

TEST(ReferenceEngine, ProtocolMisuseFails) {
  Fixture f(1);
  ReferenceEngine engine(f.streams, {0});
  EXPECT_EQ(engine.apply(f.batch(0, 1)).code(), StatusCode::kFailedPrecondition);  // before begin
  EXPECT_EQ(engine.commit(1).code(), StatusCode::kFailedPrecondition);             // without begin
  ASSERT_TRUE(engine.begin(1).ok());
  EXPECT_FALSE(engine.begin(1).ok());   // twice
  Status s = engine.commit(3);          // a different version
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("3"), std::string::npos);
  ASSERT_TRUE(engine.commit(1).ok());
  EXPECT_EQ(engine.apply(f.batch(0, 1)).code(), StatusCode::kFailedPrecondition);  // after commit
  EXPECT_FALSE(engine.begin(1).ok());   // does not advance the version
  EXPECT_EQ(engine.weight_version(), 1u);
}

// Rule 8: a transposed payload list with uneven shards fails, naming tensor
// and rank. Catches an engine that skips the per-rank shape check.
TEST(ReferenceEngine, TransposedPayloadFailsNamingTensorAndRank) {
  Fixture f(2);
  ReferenceEngine engine(f.streams, {0, 1});
  ASSERT_TRUE(engine.begin(1).ok());
  Status s = engine.apply(f.batch(0, 6, /*order=*/{1, 0}));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("'embed'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("rank 0"), std::string::npos) << s.message();
  EXPECT_EQ(engine.stats().posts, 0u);
  // Nothing was written.
  std::vector<std::byte> zeros(f.streams[0][0].nbytes());
  EXPECT_EQ(std::memcmp(engine.weight(0, "embed"), zeros.data(), zeros.size()), 0);
}

// Rule 8 with one process per engine rank: an engine hosting only rank 1 must
// take payload[1]. Catches an engine that indexes the payload by its hosted
// index (payload[0]) instead of by TP rank: the shape check fails on a good
// batch, and with even shards the bytes would be rank 0's.
TEST(ReferenceEngine, HostedRankTakesItsOwnPayload) {
  for (int ranks : {2, 7}) {  // 7 rows over 2 ranks: uneven; over 7: even
    Fixture f(ranks);
    ReferenceEngine engine(f.streams, {1});
    for (bool elsewhere_has_data : {true, false}) {
      const std::uint64_t version = elsewhere_has_data ? 1 : 2;
      ASSERT_TRUE(engine.begin(version).ok());
      AlignedBatch batch = f.batch(0, 6);
      if (!elsewhere_has_data) {
        for (auto& v : batch.payload[0]) v.data = nullptr;  // hosted elsewhere: ignored
      }
      Status s = engine.apply(batch);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_TRUE(engine.commit(version).ok());
      for (std::size_t i = 0; i < 6; ++i) {
        const TensorSpec& spec = f.streams[1][i];
        const std::byte* w = engine.weight(1, spec.name);
        ASSERT_NE(w, nullptr);
        EXPECT_EQ(std::memcmp(w, f.bytes[1][i].data(), spec.nbytes()), 0) << spec.name << " ranks=" << ranks;
      }
    }
    EXPECT_EQ(engine.weight(0, "embed"), nullptr);  // not hosted here
    EXPECT_EQ(engine.stats().tensors_applied, 12u);
  }
}

TEST(ReferenceEngine, ChecksNamesCountsAndBytes) {
  Fixture f(2);
  ReferenceEngine engine(f.streams, {0, 1});
  ASSERT_TRUE(engine.begin(1).ok());
  {
    AlignedBatch b = f.batch(0, 2);
    b.payload[1][1].spec = &f.streams[1][2];  // "q" where "norm" belongs
    Status s = engine.apply(b);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("'norm' on rank 1"), std::string::npos) << s.message();
  }
  {
    AlignedBatch b = f.batch(0, 2);
    b.payload.pop_back();
    EXPECT_EQ(engine.apply(b).code(), StatusCode::kFailedPrecondition);
  }
  {
    AlignedBatch b = f.batch(0, 2);
    b.payload[1][0].data = nullptr;  // hosted rank without bytes
    Status s = engine.apply(b);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("'embed' on hosted rank 1"), std::string::npos) << s.message();
  }
  EXPECT_EQ(engine.stats().posts, 0u);
  // The good batch lands on both ranks bit-exact.
  ASSERT_TRUE(engine.apply(f.batch(0, 6)).ok());
  for (int r = 0; r < 2; ++r) {
    for (std::size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(std::memcmp(engine.weight(r, f.streams[r][i].name), f.bytes[r][i].data(), f.bytes[r][i].size()), 0);
    }
  }
}

// Rule 9. Catches: a flush per apply (would be 3 after the first refit) or no
// flush at commit.
TEST(ReferenceEngine, OneCacheFlushPerCommit) {
  Fixture f(2);
  ReferenceEngine engine(f.streams, {0, 1});
  ASSERT_TRUE(engine.begin(1).ok());
  for (std::size_t i = 0; i < 6; i += 2) ASSERT_TRUE(engine.apply(f.batch(i, i + 2)).ok());
  EXPECT_EQ(engine.stats().cache_flushes, 0u);
  ASSERT_TRUE(engine.commit(1).ok());
  EXPECT_EQ(engine.stats().cache_flushes, 1u);
  ASSERT_TRUE(engine.begin(2).ok());
  ASSERT_TRUE(engine.apply(f.batch(0, 6)).ok());
  engine.abort(2, Aborted("test"));
  EXPECT_EQ(engine.stats().cache_flushes, 1u);  // an aborted refit flushes nothing here
  ASSERT_TRUE(engine.begin(2).ok());
  ASSERT_TRUE(engine.apply(f.batch(0, 6)).ok());
  ASSERT_TRUE(engine.commit(2).ok());
  EXPECT_EQ(engine.stats().cache_flushes, 2u);
  EXPECT_EQ(engine.stats().begins, 3u);
}


// An Engine that forwards every call to a ReferenceEngine and records it:
// "begin V", "apply SEQUENCE", "commit V", "abort V", and "flush" right
// after the call during which the engine's cache-flush counter rose (once
// per flush). The order rule 9 is about, read from outside the engine.
class RecordingEngine : public Engine {
 public:
  explicit RecordingEngine(ReferenceEngine& engine) : engine_(engine) {}
  Status begin(std::uint64_t version) override {
    return Record("begin " + std::to_string(version), engine_.begin(version));
  }
  Status apply(const AlignedBatch& batch) override {
    return Record("apply " + std::to_string(batch.sequence), engine_.apply(batch));
  }
  Status commit(std::uint64_t version) override {
    return Record("commit " + std::to_string(version), engine_.commit(version));
  }
  void abort(std::uint64_t version, const Status& why) override {
    engine_.abort(version, why);
    (void)Record("abort " + std::to_string(version), Status::Ok());
  }
  std::uint64_t weight_version() const override { return engine_.weight_version(); }
  bool weights_complete() const override { return engine_.weights_complete(); }
  const std::vector<std::string>& calls() const { return calls_; }

 private:
  Status Record(std::string call, Status status) {
    calls_.push_back(std::move(call));
    for (; flushes_ < engine_.stats().cache_flushes; ++flushes_) calls_.push_back("flush");
    return status;
  }
  ReferenceEngine& engine_;
  std::uint64_t flushes_ = 0;
  std::vector<std::string> calls_;
};

// Rule 9, in order: the one flush of a refit comes with its commit, after
// its last aligned batch; begin, apply, abort and a refused commit flush
// nothing.
// Catches: the flush counted before commit()'s checks (a refused commit(2)
// after the abort would flush: `++stats_.cache_flushes` moved to the top of
// ReferenceEngine::commit), or counted in begin() or apply().
TEST(ReferenceEngine, TheFlushComesWithTheCommitAfterTheLastBatchAndNeverWithoutOne) {
  Fixture f(2);
  ReferenceEngine engine(f.streams, {0, 1});
  RecordingEngine recorder(engine);
  ASSERT_OK(recorder.begin(1));
  for (std::size_t i = 0; i < 6; i += 2) ASSERT_OK(recorder.apply(f.batch(i, i + 2)));
  ASSERT_OK(recorder.commit(1));
  ASSERT_OK(recorder.begin(2));
  ASSERT_OK(recorder.apply(f.batch(0, 3)));
  recorder.abort(2, Aborted("trainer rank 0 died"));
  EXPECT_FALSE(recorder.commit(2).ok());  // no refit open: refused, and no flush
  ASSERT_OK(recorder.begin(2));
  ASSERT_OK(recorder.apply(f.batch(0, 6)));
  ASSERT_OK(recorder.commit(2));
  const std::vector<std::string> expected = {"begin 1", "apply 0",  "apply 2",  "apply 4", "commit 1",
                                             "flush",   "begin 2",  "apply 0",  "abort 2", "commit 2",
                                             "begin 2", "apply 0",  "commit 2", "flush"};
  EXPECT_EQ(recorder.calls(), expected);
}

// Rule 9 as a job drives it: a coordinator, a trainer rank and an engine
// rank (EngineRank, over shm, 1 MiB buckets: several aligned batches), all
// in this process, run 3 refits; the trainer fails refit 2 after its first
// bucket (--debug-fail-refit 2), so refits 1 and 3 commit. The engine rank's
// calls, recorded: each committed refit applies every aligned batch of the
// job's schedule (the report's aligned_batches, sequences 0..n-1), then
// commits and flushes once; refit 2 applies a part, is aborted and flushes
// nothing.
// Catches: an engine rank that commits a failed refit instead of aborting
// it (engine_rank.cc next(): `engine_->abort(version, status)` replaced by
// `(void)engine_->commit(version)`: refit 2 flushes), and one that stops
// taking batches before the aligner's last (after 10 of 54: no refit
// commits, each is aborted after "apply 9").
TEST(ReferenceEngine, AJobFlushesOncePerCommittedRefitAfterItsLastBatchAndNeverForAFailedOne) {
  ASSERT_OK_AND_ASSIGN(Model model, make_model("tiny", -1));
  const std::vector<std::vector<TensorSpec>> streams = {engine_stream(model, 0, 1)};
  ReferenceEngine engine(streams, {0});
  RecordingEngine recorder(engine);
  constexpr std::uint64_t kBucket = 1 << 20;

  CoordinatorOptions coordinator_options;
  coordinator_options.refits = 3;
  coordinator_options.seed = 7;
  coordinator_options.setup_timeout_s = 30;
  coordinator_options.refit_timeout_s = 30;
  coordinator_options.log_joins = false;
  std::promise<int> listening;
  JobReport report;
  std::thread coordinator([&] {
    bool told = false;
    report = run_coordinator(coordinator_options, [&](int port) {
      told = true;
      listening.set_value(port);
    });
    if (!told) listening.set_value(-1);
  });
  const int port = listening.get_future().get();
  const std::string address = "127.0.0.1:" + std::to_string(port);

  RankOptions trainer_options;
  trainer_options.coordinator = address;
  trainer_options.bucket_size = kBucket;
  trainer_options.setup_timeout_s = 30;
  trainer_options.refit_timeout_s = 30;
  trainer_options.debug_fail_refit = 2;
  Status trainer_status;
  std::thread trainer([&] {
    if (port < 0) return;
    trainer_status = [&]() -> Status {
      ASSIGN_OR_RETURN(auto source, make_rank_source(trainer_options));
      ASSIGN_OR_RETURN(auto rank, TrainerRank::Join(trainer_options, std::move(source)));
      return rank->serve();
    }();
  });

  EngineOptions engine_options;
  engine_options.coordinator = address;
  engine_options.bucket_size = kBucket;
  engine_options.setup_timeout_s = 30;
  engine_options.refit_timeout_s = 30;
  EngineBinding binding;
  binding.stream = streams[0];
  binding.engine = &recorder;
  std::vector<std::uint64_t> committed;
  int failed = 0;
  const Status engine_status = port < 0 ? Internal("the coordinator did not listen") : [&]() -> Status {
    ASSIGN_OR_RETURN(auto rank, EngineRank::Join(engine_options, binding));
    for (;;) {
      auto next = rank->next();
      if (!next.ok() && rank->recovered()) {
        ++failed;
        continue;
      }
      if (!next.ok()) return next.status();
      if (!*next) return Status::Ok();
      committed.push_back(**next);
    }
  }();
  trainer.join();
  coordinator.join();

  ASSERT_OK(engine_status);
  EXPECT_OK(trainer_status);
  EXPECT_EQ(committed, (std::vector<std::uint64_t>{1, 3}));
  EXPECT_EQ(failed, 1);
  EXPECT_EQ(report.committed_version, 3u) << report.json;
  const auto json = nlohmann::json::parse(report.json, nullptr, false);
  ASSERT_TRUE(json.is_object()) << report.json;
  const std::uint64_t batches = json.value("aligned_batches", std::uint64_t{0});
  ASSERT_GE(batches, 2u) << "one aligned batch cannot show the flush after the last one\n" << report.json;

  const std::vector<std::string>& calls = recorder.calls();
  const auto begin2 = std::find(calls.begin(), calls.end(), "begin 2");
  ASSERT_NE(begin2, calls.end());
  std::uint64_t partial = 0;  // refit 2's batches applied before its abort
  for (auto it = begin2 + 1; it != calls.end() && *it == "apply " + std::to_string(partial); ++it) ++partial;
  EXPECT_LT(partial, batches);
  std::vector<std::string> expected;
  const auto refit = [&](std::uint64_t version, std::uint64_t applied, bool commits) {
    expected.push_back("begin " + std::to_string(version));
    for (std::uint64_t b = 0; b < applied; ++b) expected.push_back("apply " + std::to_string(b));
    if (commits) {
      expected.push_back("commit " + std::to_string(version));
      expected.push_back("flush");
    } else {
      expected.push_back("abort " + std::to_string(version));
    }
  };
  refit(1, batches, true);
  refit(2, partial, false);
  refit(3, batches, true);
  EXPECT_EQ(calls, expected);
  EXPECT_EQ(engine.stats().cache_flushes, 2u);
}

}  // namespace
}  // namespace refit
