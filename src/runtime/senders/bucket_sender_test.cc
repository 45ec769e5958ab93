// The bucket senders that run without a GPU (host pack, host direct, remote
// write), each over an in-memory fake transport and a fake engine protocol
// (src/testing/fake_data_plane.h), and the choice of sender for every
// combination of settings.
#include "runtime/bucket_sender.h"

#include <gtest/gtest.h>

#include <cstring>

#include "refit/reference_engine.h"
#include "refit/model.h"
#include "testing/fake_data_plane.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

using testing::FakeProtocol;
using testing::FakeRemoteTarget;

constexpr std::uint64_t kBucket = 256 << 10;
constexpr int kEngineRanks = 2;
constexpr int kRank = 1;

// A refit of the tiny preset's rank-1 shards in 256 KiB buckets, with a
// fake engine that checks each kLanded against the bytes in the target.
class SenderRig {
 public:
  SenderRig(bool direct, bool one_sided, int slots = 2) : direct_(direct) {
    auto source = make_synthetic_source("tiny", -1, MemoryKind::kHost, -1);
    EXPECT_OK(source);
    source_ = std::move(*source);
    EXPECT_OK(source_->prepare(1, 7));
    auto plan = make_plan(engine_stream(source_->model(), kRank, kEngineRanks), kBucket);
    EXPECT_OK(plan);
    plan_ = std::move(*plan);
    std::uint64_t arena_bytes = 0;
    offsets_ = weight_arena_offsets(plan_.specs, &arena_bytes);
    target_ = direct ? std::make_unique<FakeRemoteTarget>(1, arena_bytes, one_sided)
                     : std::make_unique<FakeRemoteTarget>(slots, kBucket, one_sided);
    protocol_ = std::make_unique<FakeProtocol>(
        slots, [this](std::uint64_t, std::uint64_t j, std::uint64_t slot) { return in_place(j, slot); });
  }

  SenderContext context() {
    SenderContext c;
    c.name = "trainer rank 1";
    c.plan = &plan_;
    c.source = source_.get();
    c.pack_rank = kRank;
    c.engine_ranks = kEngineRanks;
    c.target = target_.get();
    c.protocol = protocol_.get();
    if (direct_) c.arena_offsets = offsets_;
    return c;
  }

  // Sends every bucket of refit 1, then finishes it.
  Status refit(BucketSender& sender) {
    const Deadline deadline = Deadline::AfterSeconds(10);
    for (std::uint64_t j = 0; j < plan_.buckets.size(); ++j) RETURN_IF_ERROR(sender.send(1, j, deadline));
    return sender.finish(1, deadline);
  }

  // Every bucket announced exactly once, in order, in the slot its credit
  // granted, with its bytes in place when kLanded went out.
  void expect_every_bucket_landed() const {
    const auto& landed = protocol_->landed();
    ASSERT_EQ(landed.size(), plan_.buckets.size());
    for (std::uint64_t j = 0; j < landed.size(); ++j) {
      EXPECT_EQ(landed[j].bucket, j);
      EXPECT_EQ(landed[j].version, 1u);
      EXPECT_EQ(landed[j].slot, direct_ ? 0u : protocol_->credit(j)) << "bucket " << j;
      EXPECT_TRUE(landed[j].bytes_in_place) << "bucket " << j << " was announced before its bytes were in place";
    }
  }

  const Plan& plan() const { return plan_; }
  FakeRemoteTarget& target() { return *target_; }

 private:
  // The bytes of bucket j's entries (cut independently with copy_shard_range)
  // are where the plan puts them: in the slot, or in the weight arena.
  bool in_place(std::uint64_t j, std::uint64_t slot) const {
    const std::byte* base = target_->slot(static_cast<int>(direct_ ? 0 : slot));
    for (const PlanEntry& e : plan_.buckets[j].entries) {
      const Weight& w = source_->model().weights[e.tensor];
      std::vector<std::byte> want(e.bytes);
      copy_shard_range(w, kRank, kEngineRanks, source_->data(e.tensor), e.tensor_offset, want);
      const std::byte* at = direct_ ? base + offsets_[e.tensor] + e.tensor_offset : base + e.bucket_offset;
      if (std::memcmp(at, want.data(), e.bytes) != 0) return false;
    }
    return true;
  }

  bool direct_;
  std::unique_ptr<WeightSource> source_;
  Plan plan_;
  std::vector<std::uint64_t> offsets_;
  std::unique_ptr<FakeRemoteTarget> target_;
  std::unique_ptr<FakeProtocol> protocol_;
};

SenderSettings host_settings(bool direct, bool one_sided, bool remote_write) {
  SenderSettings s;
  s.direct = direct;
  s.transport = "fake";
  s.capabilities.one_sided = one_sided;
  s.capabilities.remote_write = remote_write;
  return s;
}

struct HostCase {
  const char* name;
  bool direct, one_sided, remote_write;
  SenderKind kind;
};

class HostSenderTest : public ::testing::TestWithParam<HostCase> {};

// Catches: a sender that packs the wrong shard or puts an entry at the wrong
// offset (the bytes are not in place), announces a bucket before its write
// completed (the two-sided fake completes a write only after a few polls),
// announces in the wrong slot, skips or repeats a bucket, or waits for the
// credit of bucket j before announcing j-1 (with two slots the fake engine
// refuses, as a real one would wait forever: issue 16's deadlock).
TEST_P(HostSenderTest, EveryBucketLandsInPlaceWithTwoSlots) {
  const HostCase& c = GetParam();
  SenderRig rig(c.direct, c.one_sided);
  ASSERT_GT(rig.plan().buckets.size(), 4u);
  ASSERT_OK_AND_ASSIGN(auto sender,
                       make_bucket_sender(rig.context(), host_settings(c.direct, c.one_sided, c.remote_write)));
  EXPECT_EQ(sender->kind(), c.kind);
  EXPECT_EQ(sender->stream(), nullptr);
  ASSERT_OK(rig.refit(*sender));
  rig.expect_every_bucket_landed();
  EXPECT_EQ(rig.target().writes_in_flight(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Paths, HostSenderTest,
    ::testing::Values(HostCase{"host_pack_mapped", false, true, false, SenderKind::kHostPack},
                      HostCase{"host_pack_two_sided", false, false, false, SenderKind::kHostPack},
                      HostCase{"host_direct", true, true, false, SenderKind::kHostDirect},
                      HostCase{"remote_write_staged", false, false, true, SenderKind::kRemoteWrite},
                      HostCase{"remote_write_direct", true, false, true, SenderKind::kRemoteWrite}),
    [](const auto& info) { return std::string(info.param.name); });

// Catches: abandon() that leaves a remote write in flight (the next refit's
// write into the same staging buffer would race it), or a finish() that
// returns before the last write completed.
TEST(RemoteWriteSender, AbandonCancelsTheWriteInFlight) {
  SenderRig rig(/*direct=*/false, /*one_sided=*/false);
  ASSERT_OK_AND_ASSIGN(auto sender, make_bucket_sender(rig.context(), host_settings(false, false, true)));
  const Deadline deadline = Deadline::AfterSeconds(10);
  ASSERT_OK(sender->send(1, 0, deadline));
  ASSERT_OK(sender->send(1, 1, deadline));
  EXPECT_EQ(rig.target().writes_in_flight(), 1u);  // bucket 1's
  sender->abandon();
  EXPECT_EQ(rig.target().writes_in_flight(), 0u);
  EXPECT_EQ(rig.target().cancelled(), 1);
  ASSERT_OK(sender->finish(1, deadline));  // nothing left to announce
}

// The choice, made once at setup, for every combination of settings.
// Catches: a combination that takes another path than the one it needs
// (e.g. registered host weights sent through the pinned buffers, or device
// weights through the registered path).
TEST(ChooseSender, EachCombinationTakesItsPath) {
  struct Row {
    bool remote_write, weights_on_device, target_on_device, direct, registered;
    SenderKind want;
  };
  const Row rows[] = {
      {false, false, false, false, false, SenderKind::kHostPack},
      {false, false, false, true, false, SenderKind::kHostDirect},
      {false, false, true, false, false, SenderKind::kPinned},
      {false, false, true, true, false, SenderKind::kPinnedDirect},
      {false, false, true, false, true, SenderKind::kRegisteredHost},
      {false, false, true, true, true, SenderKind::kDeviceDirect},
      {false, true, true, false, false, SenderKind::kDeviceKernel},
      {false, true, true, true, false, SenderKind::kDeviceDirect},
      {true, false, false, false, false, SenderKind::kRemoteWrite},
      {true, true, true, true, false, SenderKind::kRemoteWrite},
      {true, true, true, false, false, SenderKind::kRemoteWrite},
  };
  for (const Row& r : rows) {
    SenderSettings s;
    s.capabilities.remote_write = r.remote_write;
    s.weights_on_device = r.weights_on_device;
    s.target_on_device = r.target_on_device;
    s.direct = r.direct;
    // --delta: host weights into a host pool, device weights into a device
    // pool, and remote writes, staged, take their delta senders; every
    // other path stays (and make_bucket_sender refuses it).
    s.delta = true;
    const bool staged_remote = r.want == SenderKind::kRemoteWrite && !r.direct;
    const SenderKind with_delta = r.want == SenderKind::kHostPack       ? SenderKind::kHostDelta
                                  : r.want == SenderKind::kDeviceKernel ? SenderKind::kDeviceDelta
                                  : staged_remote                       ? SenderKind::kRemoteDelta
                                                                        : r.want;
    EXPECT_EQ(choose_sender(s, r.registered), with_delta) << sender_kind_name(r.want) << " with --delta";
    s.delta = false;
    EXPECT_EQ(choose_sender(s, r.registered), r.want)
        << "remote_write " << r.remote_write << " weights_on_device " << r.weights_on_device << " target_on_device "
        << r.target_on_device << " direct " << r.direct << " registered " << r.registered << ": got "
        << sender_kind_name(choose_sender(s, r.registered));
  }
}

}  // namespace
}  // namespace refit
