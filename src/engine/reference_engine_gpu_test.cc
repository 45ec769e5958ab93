// GPU tests of the ReferenceEngine on a device (label gpu): the batches it
// remembers and replays (refit/engine.h). Skipped with the reason when there
// is no CUDA device. Each test names the mutation it catches.
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cuda/gpu_test_util.h"
#include "cuda/device.h"
#include "refit/reference_engine.h"

namespace refit {
namespace {

class ReferenceEngineGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { REFIT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 29 + seed * 101 + (i >> 7)) & 0xFF);
  return v;
}

// A refit moves the same batches from the same staging slots again and
// again; the engine replays what it validated. Catches: a batch taken to be
// a remembered one although its bytes sit in another slot (the key without
// the data pointers: refit 2 would copy slot A again), and a replay that
// copies what the slot held when the batch was first seen instead of what it
// holds now (refit 3).
TEST_F(ReferenceEngineGpuTest, ARepeatedBatchIsReplayedFromTheSlotItNamesNow) {
  const std::vector<TensorSpec> stream = {{"w.bf16", DType::kBFloat16, {300, 7}},
                                          {"w.f32", DType::kFloat32, {65, 3}},
                                          {"w.bf16.b", DType::kBFloat16, {1024, 33}}};
  ReferenceEngineOptions options;
  options.memory = MemoryKind::kCuda;
  options.device = 0;
  REFIT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ReferenceEngine> engine,
                             ReferenceEngine::Create({stream}, {0}, options));
  std::uint64_t slot_bytes = 0;
  const std::vector<std::uint64_t> at = weight_arena_offsets(stream, &slot_bytes);
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer slot_a, DeviceBuffer::Allocate(0, slot_bytes));
  REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer slot_b, DeviceBuffer::Allocate(0, slot_bytes));
  auto batch_in = [&](const DeviceBuffer& slot) {
    AlignedBatch b;
    b.sequence = 0;
    b.payload.resize(1);
    for (std::size_t i = 0; i < stream.size(); ++i) {
      b.specs.push_back(&stream[i]);
      b.payload[0].push_back(TensorView{&stream[i], slot.data() + at[i], MemoryKind::kCuda, 0});
    }
    return b;
  };
  // Refit v applies the batch in `slot` filled with pattern `seed`; every
  // weight must then hold that slot's bytes.
  auto refit = [&](std::uint64_t v, const DeviceBuffer& slot, unsigned seed) {
    const std::vector<std::byte> content = pattern(slot_bytes, seed);
    REFIT_ASSERT_OK(copy_host_to_device(slot.data(), content));
    REFIT_ASSERT_OK(engine->begin(v));
    REFIT_ASSERT_OK(engine->apply(batch_in(slot)));
    REFIT_ASSERT_OK(engine->commit(v));
    for (std::size_t i = 0; i < stream.size(); ++i) {
      std::vector<std::byte> got(stream[i].nbytes());
      REFIT_ASSERT_OK(copy_device_to_host(got, engine->weight(0, stream[i].name)));
      ASSERT_EQ(0, std::memcmp(got.data(), content.data() + at[i], got.size()))
          << "refit " << v << ": weight '" << stream[i].name << "' does not hold the bytes of the slot it was sent in";
    }
  };
  refit(1, slot_a, 1);
  refit(2, slot_b, 2);
  refit(3, slot_a, 3);
  refit(4, slot_b, 4);
  EXPECT_EQ(engine->stats().posts, 4u * 2u);  // two dtype groups per apply, replayed or not
  EXPECT_EQ(engine->stats().tensors_applied, 4u * stream.size());
}

}  // namespace
}  // namespace refit
