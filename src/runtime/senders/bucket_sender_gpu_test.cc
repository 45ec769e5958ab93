// The CUDA bucket senders (label gpu) over a fake engine with TWO pool slots
// whose slots (or exposed weights) are device memory in this process: every
// bucket announced once, in order, with its bytes in place when kLanded went
// out, and never a credit awaited before the previous bucket was announced
// (the fake engine refuses that wait, where a real one waits forever).
//
// kRegisteredHost is issue 16's push deadlock: `refit push` (a checkpoint's
// registered host weights) into a cuda_ipc engine with 2 slots never
// completed refit 1, because that sender announced bucket j-1 only after the
// credit of bucket j.
#include <gtest/gtest.h>

#include <cstring>

#include "cuda/gpu_test_util.h"
#include "cuda/device.h"
#include "refit/reference_engine.h"
#include "refit/model.h"
#include "quant/fp8_block.h"
#include "refit/device_memory.h"
#include "runtime/bucket_sender.h"
#include "runtime/quantized_source.h"
#include "testing/fake_data_plane.h"

namespace refit {
namespace {

constexpr std::uint64_t kBucket = 256 << 10;
constexpr int kSlots = 2;

// Device memory as a one-sided target: `slots` slots, or one for direct mode.
class DeviceSlots : public RemoteTarget {
 public:
  std::vector<DeviceBuffer> slots;
  std::byte* mapped_slot(int slot) override {
    return slot >= 0 && slot < static_cast<int>(slots.size()) ? slots[static_cast<std::size_t>(slot)].data() : nullptr;
  }
  StatusOr<Ticket> submit(int, std::uint64_t, std::span<const std::byte>, std::uint64_t, Deadline) override {
    return Internal("one-sided");
  }
  StatusOr<bool> poll(Ticket) override { return true; }
  void cancel(Ticket) override {}
};

// The synthetic host weights, said to be stable (as a mapped checkpoint's
// are), so that the factory registers them.
class StableHostSource : public WeightSource {
 public:
  explicit StableHostSource(std::unique_ptr<WeightSource> inner) : inner_(std::move(inner)) {}
  const Model& model() const override { return inner_->model(); }
  MemoryKind memory() const override { return MemoryKind::kHost; }
  int device() const override { return -1; }
  Status prepare(std::uint64_t v, std::uint64_t seed) override { return inner_->prepare(v, seed); }
  const std::byte* data(std::size_t i) const override { return inner_->data(i); }
  std::vector<std::pair<const std::byte*, std::uint64_t>> stable_host_ranges() const override {
    const std::byte* lo = nullptr;
    const std::byte* hi = nullptr;
    for (std::size_t i = 0; i < model().weights.size(); ++i) {
      const std::byte* p = data(i);
      if (lo == nullptr || p < lo) lo = p;
      if (hi == nullptr || p + model().weights[i].spec.nbytes() > hi) hi = p + model().weights[i].spec.nbytes();
    }
    return {{lo, static_cast<std::uint64_t>(hi - lo)}};
  }

 private:
  std::unique_ptr<WeightSource> inner_;
};

struct GpuCase {
  const char* name;
  bool weights_on_device, direct, register_host_weights;
  SenderKind kind;
};

class GpuSenderTest : public ::testing::TestWithParam<GpuCase> {};

TEST_P(GpuSenderTest, EveryBucketLandsInPlaceWithTwoSlots) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  const GpuCase& c = GetParam();
  REFIT_ASSERT_OK_AND_ASSIGN(auto synthetic, make_synthetic_source("tiny", -1, c.weights_on_device ? MemoryKind::kCuda
                                                                                                    : MemoryKind::kHost,
                                                                   0));
  std::unique_ptr<WeightSource> source =
      c.weights_on_device ? std::move(synthetic) : std::make_unique<StableHostSource>(std::move(synthetic));
  REFIT_ASSERT_OK(source->prepare(1, 7));
  REFIT_ASSERT_OK_AND_ASSIGN(Plan plan, make_plan(engine_stream(source->model(), 0, 1), kBucket));
  ASSERT_GT(plan.buckets.size(), 4u);
  std::uint64_t arena_bytes = 0;
  const std::vector<std::uint64_t> offsets = weight_arena_offsets(plan.specs, &arena_bytes);
  DeviceSlots target;
  for (int s = 0; s < (c.direct ? 1 : kSlots); ++s) {
    REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer b, DeviceBuffer::Allocate(0, c.direct ? arena_bytes : kBucket));
    target.slots.push_back(std::move(b));
  }
  // The bytes of bucket j, copied back from the device, against the source's.
  auto in_place = [&](std::uint64_t, std::uint64_t j, std::uint64_t slot) {
    for (const PlanEntry& e : plan.buckets[j].entries) {
      std::vector<std::byte> want(e.bytes), got(e.bytes);
      const std::byte* full = source->data(e.tensor);
      std::vector<std::byte> host_full;
      if (c.weights_on_device) {
        host_full.resize(source->model().weights[e.tensor].spec.nbytes());
        if (!copy_device_to_host(host_full, full).ok()) return false;
        full = host_full.data();
      }
      copy_shard_range(source->model().weights[e.tensor], 0, 1, full, e.tensor_offset, want);
      const std::byte* at = c.direct ? target.slots[0].data() + offsets[e.tensor] + e.tensor_offset
                                     : target.slots[slot].data() + e.bucket_offset;
      if (!copy_device_to_host(got, at).ok() || std::memcmp(got.data(), want.data(), e.bytes) != 0) return false;
    }
    return true;
  };
  testing::FakeProtocol protocol(kSlots, in_place);
  SenderContext context;
  context.name = "trainer rank 0";
  context.plan = &plan;
  context.source = source.get();
  context.target = &target;
  context.protocol = &protocol;
  if (c.direct) context.arena_offsets = offsets;
  SenderSettings settings;
  settings.direct = c.direct;
  settings.weights_on_device = c.weights_on_device;
  settings.target_on_device = true;
  settings.register_host_weights = c.register_host_weights;
  settings.gpu = 0;
  REFIT_ASSERT_OK_AND_ASSIGN(auto sender, make_bucket_sender(std::move(context), settings));
  EXPECT_EQ(sender->kind(), c.kind) << sender_kind_name(sender->kind());
  const Deadline deadline = Deadline::AfterSeconds(30);
  for (std::uint64_t j = 0; j < plan.buckets.size(); ++j) REFIT_ASSERT_OK(sender->send(1, j, deadline));
  REFIT_ASSERT_OK(sender->finish(1, deadline));
  ASSERT_EQ(protocol.landed().size(), plan.buckets.size());
  for (std::uint64_t j = 0; j < plan.buckets.size(); ++j) {
    EXPECT_EQ(protocol.landed()[j].bucket, j);
    EXPECT_TRUE(protocol.landed()[j].bytes_in_place) << "bucket " << j;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Paths, GpuSenderTest,
    ::testing::Values(GpuCase{"pinned", false, false, false, SenderKind::kPinned},
                      GpuCase{"pinned_direct", false, true, false, SenderKind::kPinnedDirect},
                      GpuCase{"registered_host", false, false, true, SenderKind::kRegisteredHost},
                      GpuCase{"registered_direct", false, true, true, SenderKind::kDeviceDirect},
                      GpuCase{"device_kernel", true, false, false, SenderKind::kDeviceKernel},
                      GpuCase{"device_direct", true, true, false, SenderKind::kDeviceDirect}),
    [](const auto& info) { return std::string(info.param.name); });

// --quantize, direct mode, device weights: the sender quantizes each shard
// straight into the engine's weights. A NaN or Inf its kernels report fails
// finish() naming the tensor, element and version, with no bucket
// announced; without one, the arena holds the CPU reference's codes and
// scales. Catches: finish() not reading the reports (the buckets would be
// announced with the codes of an Inf), a kernel writing codes or scales
// anywhere but at their arena offsets, and the view's derive() still
// computing (the sender took the quantization: derive() must not touch the
// device, which the NaN case would then report from derive instead).
TEST(GpuQuantizingSender, DirectKernelsWriteTheArenaAndRefuseAnInfBeforeAnnouncing) {
  REFIT_SKIP_WITHOUT_CUDA_DEVICE();
  for (const bool with_inf : {false, true}) {
    Model model;
    model.preset = "test";
    model.weights.push_back(Weight{TensorSpec{"l.up_proj.weight", DType::kBFloat16, {300, 260}}, ShardRule::kColumn});
    model.weights.push_back(Weight{TensorSpec{"l.norm.weight", DType::kBFloat16, {260}}, ShardRule::kReplicated});
    std::vector<std::uint16_t> values(300 * 260 + 260);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<std::uint16_t>(0x3F80 + i % 97);
    if (with_inf) values[257 * 260 + 3] = 0xFF80;
    REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer weights, DeviceBuffer::Allocate(0, values.size() * 2));
    REFIT_ASSERT_OK(copy_host_to_device(weights.data(), {reinterpret_cast<const std::byte*>(values.data()),
                                                         values.size() * 2}));
    REFIT_ASSERT_OK_AND_ASSIGN(auto external, make_external_source(model, {weights.data(), weights.data() + 300 * 260 * 2},
                                                                   MemoryKind::kCuda, 0));
    REFIT_ASSERT_OK_AND_ASSIGN(auto source, with_quantization(std::move(external), parse_quantize("fp8-block128").value(), 1));
    REFIT_ASSERT_OK_AND_ASSIGN(Plan plan, make_plan(engine_stream(source->model(), 0, 1), 16 << 10));
    std::uint64_t arena_bytes = 0;
    const std::vector<std::uint64_t> offsets = weight_arena_offsets(plan.specs, &arena_bytes);
    DeviceSlots target;
    REFIT_ASSERT_OK_AND_ASSIGN(DeviceBuffer arena, DeviceBuffer::Allocate(0, arena_bytes));
    target.slots.push_back(std::move(arena));
    testing::FakeProtocol protocol(kSlots, [](std::uint64_t, std::uint64_t, std::uint64_t) { return true; });
    SenderContext context;
    context.name = "trainer rank 0";
    context.plan = &plan;
    context.source = source.get();
    context.target = &target;
    context.protocol = &protocol;
    context.arena_offsets = offsets;
    SenderSettings settings;
    settings.direct = true;
    settings.weights_on_device = true;
    settings.target_on_device = true;
    settings.gpu = 0;
    REFIT_ASSERT_OK_AND_ASSIGN(auto sender, make_bucket_sender(std::move(context), settings));
    ASSERT_EQ(sender->kind(), SenderKind::kDeviceDirect);
    REFIT_ASSERT_OK(source->prepare(4, 0));
    REFIT_ASSERT_OK(source->derive(4));  // the sender took the quantization: nothing to compute here
    const Deadline deadline = Deadline::AfterSeconds(30);
    for (std::uint64_t j = 0; j < plan.buckets.size(); ++j) REFIT_ASSERT_OK(sender->send(4, j, deadline));
    const Status finished = sender->finish(4, deadline);
    if (with_inf) {
      ASSERT_FALSE(finished.ok());
      EXPECT_NE(finished.message().find("tensor 'l.up_proj.weight' at weight version 4: element [257, 3] is -inf"),
                std::string::npos)
          << finished.ToString();
      EXPECT_TRUE(protocol.landed().empty());
      continue;
    }
    REFIT_ASSERT_OK(finished);
    EXPECT_EQ(protocol.landed().size(), plan.buckets.size());
    const Fp8Source src = fp8_dense_source(DType::kBFloat16, reinterpret_cast<const std::byte*>(values.data()), 1,
                                           300, 260);
    std::vector<std::uint8_t> codes(300 * 260);
    std::vector<float> scales(3 * 3);
    REFIT_ASSERT_OK(quantize_fp8_block(src, fp8_whole_box(src), codes, scales));
    std::vector<std::byte> got(arena_bytes);
    REFIT_ASSERT_OK(copy_device_to_host(got, target.slots[0].data()));
    EXPECT_EQ(std::memcmp(got.data() + offsets[0], codes.data(), codes.size()), 0);
    EXPECT_EQ(std::memcmp(got.data() + offsets[1], scales.data(), scales.size() * 4), 0);
    EXPECT_EQ(std::memcmp(got.data() + offsets[2], values.data() + 300 * 260, 520), 0);
  }
}

}  // namespace
}  // namespace refit
