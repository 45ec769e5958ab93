// Tests of the engine's verification (weight_verify.h), host path: a refit is
// verified only when every byte of every shard was compared. The row-sharded
// (kRow) tensor is the case that matters: its shard is one strided run per row
// of the full tensor, so a check that stops after the first row misses the rest.
#include "runtime/weight_verify.h"

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/checkpoint_test_util.h"
#include "refit/content.h"
#include "refit/safetensors.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

constexpr std::uint64_t kVersion = 3, kSeed = 11;
constexpr int kRanks = 2;

// One row-sharded weight of 5 rows of 8 float32 columns: each of 2 ranks holds
// 4 columns of each row, 5 runs of 16 bytes at a stride of 32.
Model row_sharded_model() {
  Model m;
  m.preset = "test";
  m.weights.push_back(Weight{TensorSpec{"layer.o_proj.weight", DType::kFloat32, {5, 8}}, ShardRule::kRow});
  m.weights.push_back(Weight{TensorSpec{"norm.weight", DType::kFloat32, {8}}, ShardRule::kReplicated});
  return m;
}

// A host engine hosting `rank`, its weights filled with the synthetic content
// of kVersion, run by run, as a correct refit leaves them.
std::unique_ptr<ReferenceEngine> synthetic_engine(const Model& model, int rank) {
  std::vector<std::vector<TensorSpec>> streams;
  for (int r = 0; r < kRanks; ++r) streams.push_back(engine_stream(model, r, kRanks));
  auto engine = ReferenceEngine::Create(streams, std::vector<int>{rank});
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  for (const Weight& w : model.weights) {
    std::byte* shard = (*engine)->mutable_weight(rank, w.spec.name);
    const std::uint64_t key = content_key(kSeed, kVersion, w.spec.name);
    for_each_shard_run(w, rank, kRanks, [&](std::uint64_t full, std::uint64_t at, std::uint64_t bytes) {
      fill_content(key, full, std::span<std::byte>(shard + at, bytes));
    });
  }
  return std::move(*engine);
}

// Byte `column_byte` of row `row` of `rank`'s shard of the row-sharded weight.
std::byte& shard_byte(ReferenceEngine& engine, const Model& model, int rank, std::uint64_t row,
                      std::uint64_t column_byte) {
  const ShardRunLayout l = shard_run_layout(model.weights[0], rank, kRanks);
  return engine.mutable_weight(rank, model.weights[0].spec.name)[row * l.run + column_byte];
}

TEST(VerifySyntheticTest, CorrectRowShardedWeightsPass) {
  const Model model = row_sharded_model();
  for (int rank = 0; rank < kRanks; ++rank) {
    auto engine = synthetic_engine(model, rank);
    ASSERT_OK(verify_synthetic(model, *engine, rank, kRanks, /*on_device=*/false, kVersion, kSeed));
  }
}

// Catches: checking only the first row of a strided shard. Tried once: the
// row loop's bound `i < l.count` changed to `i < 1` in verify_synthetic made
// the middle-row and last-row cases pass verification, failing this test.
TEST(VerifySyntheticTest, OneWrongByteInAMiddleOrLastRowFails) {
  const Model model = row_sharded_model();
  for (int rank = 0; rank < kRanks; ++rank) {
    for (std::uint64_t row : {std::uint64_t{2}, std::uint64_t{4}}) {
      auto engine = synthetic_engine(model, rank);
      shard_byte(*engine, model, rank, row, 5) ^= std::byte{0x40};
      const Status s = verify_synthetic(model, *engine, rank, kRanks, /*on_device=*/false, kVersion, kSeed);
      ASSERT_EQ(s.code(), StatusCode::kDataLoss) << "rank " << rank << " row " << row << ": " << s.ToString();
      EXPECT_NE(s.message().find("'layer.o_proj.weight' is wrong at byte " + std::to_string(row * 16 + 5)),
                std::string::npos)
          << s.ToString();
    }
  }
}

// The checkpoint path: the same shard against a file's bytes.
class VerifyCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const Weight& w : model_.weights) data_.push_back(testing::content_of(w.spec, kVersion, kSeed));
    std::vector<SafetensorsWriteTensor> tensors;
    for (std::size_t i = 0; i < data_.size(); ++i) tensors.push_back({model_.weights[i].spec, data_[i]});
    ASSERT_OK(write_safetensors(dir_.file("model.safetensors"), tensors));
    ASSERT_OK_AND_ASSIGN(Checkpoint opened, Checkpoint::Open(dir_.file("model.safetensors")));
    checkpoint_ = std::make_unique<Checkpoint>(std::move(opened));
  }

  // A host engine hosting `rank` holding its shards of the file's tensors.
  std::unique_ptr<ReferenceEngine> engine_from_file(int rank) {
    std::vector<std::vector<TensorSpec>> streams;
    for (int r = 0; r < kRanks; ++r) streams.push_back(engine_stream(model_, r, kRanks));
    auto engine = ReferenceEngine::Create(streams, std::vector<int>{rank});
    EXPECT_TRUE(engine.ok()) << engine.status().ToString();
    for (std::size_t i = 0; i < model_.weights.size(); ++i) {
      const Weight& w = model_.weights[i];
      std::byte* shard = (*engine)->mutable_weight(rank, w.spec.name);
      copy_shard_range(w, rank, kRanks, data_[i].data(), 0,
                       std::span<std::byte>(shard, shard_spec(w, rank, kRanks).nbytes()));
    }
    return std::move(*engine);
  }

  Model model_ = row_sharded_model();
  std::vector<testing::Bytes> data_;
  testing::TempDir dir_;
  std::unique_ptr<Checkpoint> checkpoint_;
};

// Catches: comparing only the first row (or the first run) of a strided shard
// against the file. Tried once: memcmp over the first row's bytes (l.run)
// only in verify_checkpoint made the middle-row and last-row cases pass.
TEST_F(VerifyCheckpointTest, OneWrongByteInAMiddleOrLastRowFails) {
  for (int rank = 0; rank < kRanks; ++rank) {
    auto clean = engine_from_file(rank);
    ASSERT_OK(verify_checkpoint(model_, *checkpoint_, *clean, rank, kRanks, /*on_device=*/false, kVersion));
    for (std::uint64_t row : {std::uint64_t{2}, std::uint64_t{4}}) {
      auto engine = engine_from_file(rank);
      shard_byte(*engine, model_, rank, row, 9) ^= std::byte{0x01};
      const Status s = verify_checkpoint(model_, *checkpoint_, *engine, rank, kRanks, /*on_device=*/false, kVersion);
      ASSERT_EQ(s.code(), StatusCode::kDataLoss) << "rank " << rank << " row " << row << ": " << s.ToString();
      EXPECT_NE(s.message().find("at byte " + std::to_string(row * 16 + 9) + " of its shard"), std::string::npos)
          << s.ToString();
    }
  }
}

}  // namespace
}  // namespace refit
