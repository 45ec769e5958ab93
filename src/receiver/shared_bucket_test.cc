// Buckets written by several trainer links (sharded trainers, issue 19):
// Receiver::set_feeders. Two trainer threads over loopback TCP write their
// parts of each bucket into the receiver's shm pool, each announcing its own
// part with kLanded.
//
// Each test names the receiver mutation it catches.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "receiver/receiver.h"
#include "testing/expect_has.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

using namespace std::chrono_literals;

constexpr std::uint64_t kBucket = 4096;

std::byte ByteAt(std::uint64_t version, std::uint32_t tensor, std::uint64_t offset) {
  return static_cast<std::byte>((version * 131 + tensor * 31 + offset * 7 + (offset >> 8)) & 0xff);
}

// Link k's part of a bucket: the first half of every entry (k == 0) or the rest (k == 1).
std::pair<std::uint64_t, std::uint64_t> Half(const PlanEntry& e, std::size_t k) {
  return k == 0 ? std::pair{std::uint64_t{0}, e.bytes / 2} : std::pair{e.bytes / 2, e.bytes};
}

BucketFeeders Halves(const Plan& plan) {
  BucketFeeders feeders(plan.buckets.size());
  for (std::size_t j = 0; j < plan.buckets.size(); ++j) {
    for (std::size_t k = 0; k < 2; ++k) {
      std::uint64_t bytes = 0;
      for (const PlanEntry& e : plan.buckets[j].entries) bytes += Half(e, k).second - Half(e, k).first;
      feeders[j].push_back({k, bytes});
    }
  }
  return feeders;
}

struct PartOptions {
  std::uint64_t extra_bytes = 0;                    // announces its part with this many more bytes
  std::chrono::milliseconds delay{0};               // waits this long before writing each part
  std::vector<std::uint64_t> only_buckets;          // non-empty: announce only these (others: not at all)
  bool stray_landing = false;  // at its first credit, first announces bucket 0 too (which it does not write)
};

// Trainer link k: for every credit, writes its part of each entry (its
// half, or all of it where it is the bucket's only writer) and announces it.
class PartWriter {
 public:
  PartWriter(const Plan* plan, const BucketFeeders* feeders, std::size_t k, std::unique_ptr<Link> link,
             std::unique_ptr<RemoteTarget> target, PartOptions options)
      : plan_(plan), feeders_(feeders), k_(k), link_(std::move(link)), target_(std::move(target)),
        options_(std::move(options)) {
    thread_ = std::thread([this] { run(); });
  }
  ~PartWriter() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    for (;;) {
      StatusOr<FrameHeader> h = link_->recv_header(Deadline::After(10s));
      if (!h.ok() || h->type != FrameType::kCredit) return;
      const std::uint64_t version = h->a, j = h->b, slot = h->c;
      if (options_.stray_landing) {
        options_.stray_landing = false;
        (void)link_->send(encode(LandedFrame{version, 0, slot, 1}), {}, Deadline::After(5s));
      }
      const bool whole = (*feeders_)[j].size() == 1;
      std::this_thread::sleep_for(options_.delay);  // a slow writer, not a synchronisation
      std::byte* mapped = target_->mapped_slot(static_cast<int>(slot));
      std::uint64_t bytes = 0;
      for (const PlanEntry& e : plan_->buckets[j].entries) {
        const auto [lo, hi] = whole ? std::pair{std::uint64_t{0}, e.bytes} : Half(e, k_);
        for (std::uint64_t b = lo; b < hi; ++b) mapped[e.bucket_offset + b] = ByteAt(version, e.tensor, e.tensor_offset + b);
        bytes += hi - lo;
      }
      if (!options_.only_buckets.empty() &&
          std::find(options_.only_buckets.begin(), options_.only_buckets.end(), j) == options_.only_buckets.end()) {
        continue;
      }
      if (!link_->send(encode(LandedFrame{version, j, slot, bytes + options_.extra_bytes}), {}, Deadline::After(5s)).ok()) {
        return;
      }
    }
  }

  const Plan* plan_;
  const BucketFeeders* feeders_;
  std::size_t k_;
  std::unique_ptr<Link> link_;
  std::unique_ptr<RemoteTarget> target_;
  PartOptions options_;
  std::thread thread_;
};

// One receiver over shm fed by two PartWriters; members are torn down
// receiver first, so the writers see EOF.
class SharedRig {
 public:
  explicit SharedRig(std::vector<TensorSpec> specs) : plan(make_plan(std::move(specs), kBucket).value()) {}
  ~SharedRig() {
    receiver.reset();
    writers.clear();
  }

  Status build(BucketFeeders feeders, PartOptions second = {}) {
    ASSIGN_OR_RETURN(transport, make_transport("shm"));
    PoolOptions pool;
    pool.slots = 2;
    pool.slot_bytes = kBucket;
    pool.owner = "engine rank 0";
    ASSIGN_OR_RETURN(auto target, transport->create_target(pool));
    ReceiverOptions ro;
    ro.name = "engine rank 0";
    ASSIGN_OR_RETURN(receiver, Receiver::Create(&plan, 0, std::move(target), ro));
    ASSIGN_OR_RETURN(auto listener, Listener::Listen("127.0.0.1", 0));
    std::vector<std::pair<std::unique_ptr<Link>, std::unique_ptr<RemoteTarget>>> sides;
    for (std::size_t k = 0; k < 2; ++k) {
      ASSIGN_OR_RETURN(auto trainer_link, Link::Connect(listener->address(), "engine rank 0", Deadline::After(5s)));
      ASSIGN_OR_RETURN(auto engine_link, listener->accept(Deadline::After(5s)));
      engine_link->set_peer("trainer-" + std::to_string(k));
      receiver->attach_link(std::move(engine_link));
      ASSIGN_OR_RETURN(auto remote, transport->open_target(receiver->pool().descriptor(), trainer_link.get()));
      sides.emplace_back(std::move(trainer_link), std::move(remote));
    }
    feeders_ = feeders;
    RETURN_IF_ERROR(receiver->set_feeders(std::move(feeders)));
    for (std::size_t k = 0; k < 2; ++k) {
      writers.push_back(std::make_unique<PartWriter>(&plan, &feeders_, k, std::move(sides[k].first),
                                                     std::move(sides[k].second), k == 1 ? second : PartOptions{}));
    }
    return Status::Ok();
  }

  // Reads refit `version` to its end; checks every tensor byte for byte.
  Status read_all(std::uint64_t version) {
    RETURN_IF_ERROR(receiver->start(version, Deadline::After(5s)));
    for (;;) {
      ASSIGN_OR_RETURN(std::optional<Batch> batch, receiver->next(Deadline::After(5s)));
      if (!batch) return Status::Ok();
      for (const TensorView& t : batch->tensors) {
        std::uint32_t index = 0;
        while (plan.specs[index].name != t.spec->name) ++index;
        for (std::uint64_t b = 0; b < t.spec->nbytes(); ++b) {
          if (t.data[b] != ByteAt(version, index, b)) {
            return DataLoss("tensor " + t.spec->name + " byte " + std::to_string(b) + " is wrong");
          }
        }
      }
    }
  }

  Plan plan;
  BucketFeeders feeders_;  // what the writers follow
  std::unique_ptr<Transport> transport;
  std::vector<std::unique_ptr<PartWriter>> writers;
  std::unique_ptr<Receiver> receiver;
};

std::vector<TensorSpec> Stream() {
  return {TensorSpec{"a", DType::kBFloat16, {8, 100}}, TensorSpec{"b", DType::kFloat32, {300}},
          TensorSpec{"c", DType::kUInt8, {5000}}, TensorSpec{"d", DType::kBFloat16, {3}}};
}

// Catches (both tried): a bucket counted as landed when its first part
// lands (LandingLedger::landed true once any part landed: the consumer
// reads the slow writer's half before it is written, "tensor c byte 2048
// is wrong"), and credits sent to only the first of a bucket's writers (the
// other never writes: the refit times out waiting for bucket 0).
TEST(SharedBuckets, ABucketIsReadOnlyOnceEveryPartLandedAndEveryByteIsRight) {
  SharedRig rig(Stream());
  PartOptions slow;
  slow.delay = 100ms;
  ASSERT_OK(rig.build(Halves(rig.plan), slow));
  ASSERT_GE(rig.plan.buckets.size(), 3u);
  for (std::uint64_t v = 1; v <= 3; ++v) {
    SCOPED_TRACE("refit " + std::to_string(v));
    ASSERT_OK(rig.read_all(v));
  }
}

// Catches: a part's byte count not checked against its own share (the
// plan's whole bucket, or nothing, compared instead).
TEST(SharedBuckets, APartAnnouncedWithTheWrongByteCountIsDataLossNamingThePart) {
  SharedRig rig(Stream());
  PartOptions liar;
  liar.extra_bytes = 1;
  ASSERT_OK(rig.build(Halves(rig.plan), liar));
  Status s = rig.read_all(1);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_HAS(s.message(), "trainer link 1 (trainer-1) sent kLanded for bucket 0 with");
  EXPECT_HAS(s.message(), "its part of the bucket holds");
}

// Catches: a kLanded accepted from a link that writes no part of the bucket.
TEST(SharedBuckets, ALandingFromALinkThatWritesNoPartIsRefusedNamingTheWriter) {
  SharedRig rig(Stream());
  BucketFeeders feeders = Halves(rig.plan);
  // Bucket 0 whole from link 0; link 1 announces it anyway.
  feeders[0] = {{0, feeders[0][0].bytes + feeders[0][1].bytes}};
  PartOptions stray;
  stray.stray_landing = true;
  ASSERT_OK(rig.build(feeders, stray));
  Status s = rig.read_all(1);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_HAS(s.message(), "trainer link 1 (trainer-1) sent kLanded for bucket 0, which is fed by trainer link 0");
}

// Catches: a bucket yielded while one part never landed; the wait names both writers.
TEST(SharedBuckets, APartThatNeverLandsTimesOutNamingEveryWriterOfTheBucket) {
  SharedRig rig(Stream());
  PartOptions mute;
  mute.only_buckets = {1, 2, 3, 4, 5, 6, 7, 8};  // never announces bucket 0
  ASSERT_OK(rig.build(Halves(rig.plan), mute));
  ASSERT_OK(rig.receiver->start(1, Deadline::After(5s)));
  auto batch = rig.receiver->next(Deadline::After(300ms));
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_HAS(batch.status().message(), "bucket 0 of");
  EXPECT_HAS(batch.status().message(), "from trainer link 0 (trainer-0) and trainer link 1 (trainer-1)");
}

// Catches: set_feeders accepting feeders that cannot fill the plan.
TEST(SharedBuckets, FeedersThatDoNotFitThePlanAreRefusedNamingTheBucket) {
  SharedRig rig(Stream());
  BucketFeeders short_one = Halves(rig.plan);
  short_one[1][1].bytes -= 1;
  Status s = rig.build(short_one);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "bucket 1's feeders write");
  SharedRig rig2(Stream());
  BucketFeeders unknown = Halves(rig2.plan);
  unknown[0][1].link = 5;
  s = rig2.build(unknown);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(s.message(), "link 5 of 2");
  SharedRig rig3(Stream());
  BucketFeeders fewer = Halves(rig3.plan);
  fewer.pop_back();
  s = rig3.build(fewer);
  EXPECT_HAS(s.message(), "the plan has");
}

}  // namespace
}  // namespace refit
