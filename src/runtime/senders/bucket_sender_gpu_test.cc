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
#include "runtime/bucket_sender.h"
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

}  // namespace
}  // namespace refit
