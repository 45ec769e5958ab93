// One validator for every data-plane frame: the receiver checks a kLanded
// the same way whether it feeds batches (staged) or waits for a direct-mode
// refit (CreateDirect, the engine's exposed weights as one slot), so a bad
// frame fails both with the same code and the same text.
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "net/frames.h"
#include "refit/plan.h"
#include "receiver/receiver.h"
#include "testing/status_matchers.h"

namespace refit {
namespace {

constexpr std::uint64_t kBucket = 4096;

std::vector<TensorSpec> FourBuckets() {
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 4; ++i) specs.push_back({"w" + std::to_string(i), DType::kFloat32, {750}});  // 3000 bytes each
  return specs;
}

class HostPool : public TargetMemory {
 public:
  HostPool(int slots, std::uint64_t slot_bytes) : slots_(slots), bytes_(slot_bytes), mem_(slots * slot_bytes) {}
  std::string descriptor() const override { return "host pool"; }
  int slots() const override { return slots_; }
  std::uint64_t slot_bytes() const override { return bytes_; }
  std::byte* slot(int i) override { return mem_.data() + static_cast<std::uint64_t>(i) * bytes_; }
  Status receive_data(Link&, const FrameHeader&, Deadline) override { return Internal("one-sided pool"); }
  Status seal() override { return Status::Ok(); }
  MemoryKind memory() const override { return MemoryKind::kHost; }
  int device() const override { return -1; }

 private:
  int slots_;
  std::uint64_t bytes_;
  std::vector<std::byte> mem_;
};

// Runs refit 5 on a receiver fed by one in-process trainer that announces
// bucket 0 after `tamper` edited its kLanded (staged: once its credit came);
// returns how the receiver failed.
Status FirstFailure(bool direct, const std::function<void(LandedFrame&)>& tamper) {
  auto plan = make_plan(FourBuckets(), kBucket);
  if (!plan.ok()) return plan.status();
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return Internal("socketpair");
  auto trainer = std::make_unique<Link>(sv[0], "engine rank 0 at test");
  ReceiverOptions options{false, "engine rank 0"};
  auto receiver = direct ? Receiver::CreateDirect(&*plan, 0, std::make_unique<HostPool>(1, 4 * kBucket), options)
                         : Receiver::Create(&*plan, 0, std::make_unique<HostPool>(2, kBucket), options);
  if (!receiver.ok()) return receiver.status();
  (*receiver)->attach_link(std::make_unique<Link>(sv[1], "trainer rank 0 at test"));
  std::thread feeder([&] {
    LandedFrame landed{5, 0, 0, plan->buckets[0].bytes};
    if (!direct) {
      auto credit = trainer->recv_header(Deadline::AfterSeconds(5), 0);
      if (!credit.ok()) return;
      auto c = decode_credit(*credit, trainer->peer());
      if (!c.ok()) return;
      landed.slot = c->slot;
    }
    tamper(landed);
    (void)trainer->send(encode(landed), {}, Deadline::AfterSeconds(5));
  });
  Status result = (*receiver)->start(5, Deadline::AfterSeconds(5));
  if (result.ok()) {
    if (direct) {
      result = (*receiver)->wait_all_landed(Deadline::AfterSeconds(5));
    } else {
      auto batch = (*receiver)->next(Deadline::AfterSeconds(5));
      result = batch.ok() ? Internal("a batch was yielded") : batch.status();
    }
  }
  feeder.join();
  return result;
}

struct BadLanded {
  const char* what;
  std::function<void(LandedFrame&)> tamper;
  const char* expect;
};

// Catches: a direct-mode check of its own (the engine rank had one, with
// kInvalidArgument where the receiver says kDataLoss, and other text), or a
// direct mode that trusts a kLanded's byte count, version or bucket.
TEST(DirectLanding, BadLandedFailsStagedAndDirectWithTheSameCodeAndText) {
  const BadLanded cases[] = {
      {"bytes", [](LandedFrame& f) { f.bytes += 4; },
       "engine rank 0: trainer link 0 (trainer rank 0 at test) sent kLanded for bucket 0 with 3004 bytes; the "
       "plan's bucket holds 3000"},
      {"stale version", [](LandedFrame& f) { f.version = 4; },
       "sent kLanded of version 4 during refit 5 (a stale frame of an older refit)"},
      {"bucket", [](LandedFrame& f) { f.bucket = 9; }, "sent kLanded for bucket 9, but the plan has 4 buckets"},
  };
  for (const BadLanded& c : cases) {
    SCOPED_TRACE(c.what);
    const Status staged = FirstFailure(false, c.tamper);
    const Status direct = FirstFailure(true, c.tamper);
    EXPECT_EQ(staged.code(), StatusCode::kDataLoss) << staged.ToString();
    EXPECT_EQ(direct.code(), StatusCode::kDataLoss) << direct.ToString();
    EXPECT_EQ(staged.message(), direct.message());
    EXPECT_NE(direct.message().find(c.expect), std::string::npos) << direct.ToString();
  }
}

// Catches: a direct receiver that waits for the wrong set of buckets, or
// grants credits (a direct trainer never reads them).
TEST(DirectLanding, EveryBucketLandedEndsTheWait) {
  auto plan = make_plan(FourBuckets(), kBucket);
  ASSERT_OK(plan);
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  Link trainer(sv[0], "engine rank 0 at test");
  ASSERT_OK_AND_ASSIGN(auto receiver,
                       Receiver::CreateDirect(&*plan, 0, std::make_unique<HostPool>(1, 4 * kBucket), ReceiverOptions{}));
  receiver->attach_link(std::make_unique<Link>(sv[1], "trainer rank 0 at test"));
  ASSERT_OK(receiver->start(2, Deadline::AfterSeconds(5)));
  for (std::uint64_t j : {2, 0, 3, 1}) {  // any order
    ASSERT_OK(trainer.send(encode(LandedFrame{2, j, 0, plan->buckets[j].bytes}), {}, Deadline::AfterSeconds(5)));
  }
  ASSERT_OK(receiver->wait_all_landed(Deadline::AfterSeconds(5)));
  EXPECT_EQ(receiver->stats().buckets, 4u);
  EXPECT_EQ(receiver->stats().bytes, 4u * 3000u);
  ::shutdown(sv[1], SHUT_WR);  // the receiver sent nothing: the trainer's side reads EOF at once
  auto none = trainer.recv_header(Deadline::AfterSeconds(5), 0);
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable) << none.status().ToString();
}

}  // namespace
}  // namespace refit
