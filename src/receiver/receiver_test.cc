// Receiver tests against a real trainer side: one thread per trainer link,
// connected over loopback TCP, writing through a real transport ("shm" and
// "tcp", every test runs over both) into the receiver's pool.
//
// Each test that guards a rule names the receiver mutation it catches.
#include "receiver/receiver.h"
#include "testing/blocked_thread.h"
#include "testing/expect_has.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "testing/receiver_rig.h"

namespace refit {
namespace {

using namespace std::chrono_literals;
using namespace receiver_testing;

class ReceiverTest : public ::testing::TestWithParam<std::string> {};

// Rule 2 and the batch contract over random streams. Catches: yielding a
// tensor twice or out of order, wrong reassembly offsets, a view at the wrong
// bucket offset, a bucket of middle chunks that leaks its slot (the stream
// stalls and next() times out).
TEST_P(ReceiverTest, RandomStreamsArriveExactlyOnceInOrderBitExact) {
  for (unsigned seed = 1; seed <= 4; ++seed) {
    for (int slots : {2, 3}) {
      for (int links : {1, 2}) {
        SCOPED_TRACE("seed " + std::to_string(seed) + " slots " + std::to_string(slots) + " links " +
                     std::to_string(links));
        RigOptions o;
        o.slots = slots;
        o.links = links;
        o.poison = seed % 2 == 0;
        Rig rig(GetParam(), RandomStream(seed), o);
        ASSERT_TRUE(rig.setup.ok()) << rig.setup.ToString();
        ASSERT_GT(rig.plan().largest_chunked_tensor, 0u);
        for (std::uint64_t version : {1u, 2u, 3u}) ConsumeRefit(rig, version);
        for (const std::string& f : rig.finish()) ADD_FAILURE() << f;
      }
    }
  }
}

// Rule 3 with poison. Every tensor gets a bucket of its own, 3 slots, and the
// trainers are held back so no slot is rewritten before the check:
//   after next() for n+1, batch n is intact;
//   after next() for n+2, batch n's slot holds poison (it was recycled).
// Catches: recycling at n-1 instead of n-2 (batch n reads poison after the
// n+1 call, and the trainer side sees a credit for a held slot), and a
// receiver that never recycles or never poisons (no poison after n+2).
TEST_P(ReceiverTest, BatchStaysValidUntilTheCallAfterNextThenIsPoisoned) {
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 8; ++i) specs.push_back(Spec("w" + std::to_string(i), DType::kFloat32, 3000));
  RigOptions o;
  o.slots = 3;
  Rig rig(GetParam(), specs, o);
  ASSERT_TRUE(rig.setup.ok()) << rig.setup.ToString();
  ASSERT_EQ(rig.plan().buckets.size(), 8u);
  Receiver& r = *rig.receiver;
  rig.gate.allow(-1);
  ASSERT_TRUE(r.start(1, Deadline::After(5s)).ok());
  std::vector<Batch> batches;
  for (std::uint64_t n = 0; n < 8; ++n) {
    rig.gate.allow(static_cast<std::int64_t>(n));  // bucket n may land, n+1 may not
    rig.watch.asking(n);
    auto got = r.next(Deadline::After(5s));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(got->has_value());
    batches.push_back(**got);
    ASSERT_EQ(batches[n].tensors.size(), 1u);
    rig.watch.held(n, batches[n], r.pool());
    const TensorView& now = batches[n].tensors[0];
    EXPECT_EQ(Mismatch(1, static_cast<std::uint32_t>(n), now.data, 3000), -1) << "batch " << n;
    if (n >= 1) {
      const TensorView& v = batches[n - 1].tensors[0];
      EXPECT_EQ(Mismatch(1, static_cast<std::uint32_t>(n - 1), v.data, 3000), -1)
          << "batch " << n - 1 << " was recycled by next() for batch " << n;
    }
    if (n >= 2) {
      const TensorView& v = batches[n - 2].tensors[0];
      EXPECT_TRUE(AllPoison(v.data, 3000)) << "batch " << n - 2 << " was not recycled by next() for batch " << n;
    }
  }
  rig.gate.allow(INT64_MAX);
  auto end = r.next(Deadline::After(5s));
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());
  for (const std::string& f : rig.finish()) ADD_FAILURE() << f;
}

// Rule 3 for reassembly buffers: a chunked tensor's view stays valid through
// the next call and is poisoned once recycled. Every tensor is cut into
// three chunks, so every batch holds one reassembled tensor and the two
// buffers alternate. Catches: one reassembly buffer instead of two, or
// buffers released at n-1.
TEST_P(ReceiverTest, ReassembledTensorsFollowTheSameLifetime) {
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 6; ++i) specs.push_back(Spec("big" + std::to_string(i), DType::kBFloat16, 2 * kBucket + 512));
  Rig rig(GetParam(), specs, RigOptions{});
  ASSERT_TRUE(rig.setup.ok()) << rig.setup.ToString();
  Receiver& r = *rig.receiver;
  ASSERT_TRUE(r.start(7, Deadline::After(5s)).ok());
  std::vector<Batch> batches;
  for (std::uint64_t n = 0; n < 6; ++n) {
    rig.watch.asking(n);
    auto got = r.next(Deadline::After(5s));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(got->has_value());
    batches.push_back(**got);
    ASSERT_EQ(batches[n].tensors.size(), 1u);
    rig.watch.held(n, batches[n], r.pool());
    const std::uint64_t bytes = specs[0].nbytes();
    EXPECT_EQ(Mismatch(7, static_cast<std::uint32_t>(n), batches[n].tensors[0].data, bytes), -1);
    if (n >= 1) {
      EXPECT_EQ(Mismatch(7, static_cast<std::uint32_t>(n - 1), batches[n - 1].tensors[0].data, bytes), -1)
          << "batch " << n - 1 << " was recycled by next() for batch " << n;
      EXPECT_NE(batches[n - 1].tensors[0].data, batches[n].tensors[0].data);
    }
    if (n >= 2) {
      // Batch n-2's buffer is batch n's buffer again: reused, so not intact.
      EXPECT_EQ(batches[n - 2].tensors[0].data, batches[n].tensors[0].data);
    }
  }
  auto end = r.next(Deadline::After(5s));
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());
  // The end-of-stream call recycled batch 4: poisoned; batch 5 is still valid.
  EXPECT_TRUE(AllPoison(batches[4].tensors[0].data, specs[0].nbytes()));
  EXPECT_EQ(Mismatch(7, 5, batches[5].tensors[0].data, specs[0].nbytes()), -1);
  for (const std::string& f : rig.finish()) ADD_FAILURE() << f;
}

std::vector<TensorSpec> EightBuckets() {
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 8; ++i) specs.push_back(Spec("t" + std::to_string(i), DType::kFloat32, 3000));
  return specs;
}

// Reads batches until next() fails; returns that status (or OK if the
// stream ended).
Status DrainUntilError(Receiver& r, std::uint64_t version, Deadline deadline) {
  RETURN_IF_ERROR(r.start(version, Deadline::After(5s)));
  for (;;) {
    auto got = r.next(deadline);
    if (!got.ok()) return got.status();
    if (!got->has_value()) return Status::Ok();
  }
}

// Catches: EOF treated as the end of the stream, or an error without the
// peer's name or the bucket.
TEST_P(ReceiverTest, LinkClosedMidStreamNamesThePeerAndBucket) {
  RigOptions o;
  o.trainer = [](std::size_t) {
    TrainerOptions t;
    t.close_after = 3;
    return t;
  };
  Rig rig(GetParam(), EightBuckets(), o);
  ASSERT_TRUE(rig.setup.ok()) << rig.setup.ToString();
  Status s = DrainUntilError(*rig.receiver, 1, Deadline::After(5s));
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
  EXPECT_HAS(s.message(), "trainer link 0 (" + PeerName(0) + ") closed while engine rank 0 waited for bucket 3");
  // The next refit refuses to start on a dead link, naming it.
  Status again = rig.receiver->start(2, Deadline::After(1s));
  EXPECT_FALSE(again.ok());
  EXPECT_HAS(again.message(), PeerName(0));
  for (const std::string& f : rig.finish()) ADD_FAILURE() << f;
}

// With two links, the one that closes is named (link 1, not link 0).
TEST_P(ReceiverTest, SecondLinkClosingIsNamed) {
  RigOptions o;
  o.links = 2;
  o.trainer = [](std::size_t i) {
    TrainerOptions t;
    if (i == 1) t.close_after = 1;
    return t;
  };
  Rig rig(GetParam(), EightBuckets(), o);
  ASSERT_TRUE(rig.setup.ok()) << rig.setup.ToString();
  Status s = DrainUntilError(*rig.receiver, 1, Deadline::After(5s));
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
  EXPECT_HAS(s.message(), "trainer link 1 (" + PeerName(1) + ") closed");
  EXPECT_HAS(s.message(), "bucket 3");
  for (const std::string& f : rig.finish()) ADD_FAILURE() << f;
}

// Catches: a wait without a deadline (the test would hang), or a deadline
// error that does not say which bucket and which peer.
TEST_P(ReceiverTest, NoBucketWithinTheDeadlineNamesBucketAndPeer) {
  RigOptions o;
  o.trainer = [](std::size_t) {
    TrainerOptions t;
    t.silent = true;
    return t;
  };
  Rig rig(GetParam(), EightBuckets(), o);
  ASSERT_TRUE(rig.setup.ok()) << rig.setup.ToString();
  ASSERT_TRUE(rig.receiver->start(4, Deadline::After(5s)).ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto got = rig.receiver->next(Deadline::After(150ms));
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_HAS(got.status().message(), "engine rank 0 timed out after");
  EXPECT_HAS(got.status().message(), "waiting for bucket 0 of 8 from trainer link 0 (" + PeerName(0) + ")");
  EXPECT_GE(waited, 150ms);
  EXPECT_LT(waited, 3s);
  for (const std::string& f : rig.finish()) ADD_FAILURE() << f;
}

struct BadLanded {
  const char* what;
  std::function<void(FrameHeader&)> tamper;
  const char* expect;
};

// Every kLanded is validated. Catches: trusting the trainer's byte count,
// slot or version (a wrong one would yield views into the wrong slot or a
// stale refit's bytes).
TEST_P(ReceiverTest, LandedFramesOutOfProtocolFailTheRefit) {
  const std::vector<BadLanded> cases = {
      {"bytes", [](FrameHeader& h) { h.d += 4; }, "with 3004 bytes; the plan's bucket holds 3000"},
      {"slot", [](FrameHeader& h) { h.c = (h.c + 1) % 2; }, "but slot 0 was granted to it"},
      {"stale version", [](FrameHeader& h) { h.a -= 1; }, "of version 4 during refit 5 (a stale frame of an older refit)"},
      {"newer version", [](FrameHeader& h) { h.a += 1; }, "of version 6 during refit 5"},
      {"bucket", [](FrameHeader& h) { h.b += 100; }, "kLanded for bucket 100, but the plan has 8 buckets"},
  };
  for (const BadLanded& c : cases) {
    SCOPED_TRACE(c.what);
    RigOptions o;
    o.trainer = [&](std::size_t) {
      TrainerOptions t;
      t.tamper = c.tamper;
      return t;
    };
    Rig rig(GetParam(), EightBuckets(), o);
    ASSERT_TRUE(rig.setup.ok()) << rig.setup.ToString();
    Status s = DrainUntilError(*rig.receiver, 5, Deadline::After(5s));
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_HAS(s.message(), c.expect);
    EXPECT_HAS(s.message(), "trainer link 0 (" + PeerName(0) + ")");
    // The failure is sticky for this refit.
    auto again = rig.receiver->next(Deadline::After(100ms));
    EXPECT_EQ(again.status().code(), StatusCode::kDataLoss);
    for (const std::string& f : rig.finish()) ADD_FAILURE() << f;
  }
}

// A kLanded for a bucket the other link feeds is rejected. Catches: a
// receiver that ignores which link a frame came on.
TEST_P(ReceiverTest, LandedOnTheWrongLinkFails) {
  RigOptions o;
  o.links = 2;
  o.trainer = [](std::size_t i) {
    TrainerOptions t;
    if (i == 0) t.tamper = [](FrameHeader& h) { h.b += 1; };  // claims link 1's bucket
    return t;
  };
  Rig rig(GetParam(), EightBuckets(), o);
  ASSERT_TRUE(rig.setup.ok()) << rig.setup.ToString();
  Status s = DrainUntilError(*rig.receiver, 1, Deadline::After(5s));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_HAS(s.message(), "which is fed by trainer link 1 (" + PeerName(1) + ")");
  for (const std::string& f : rig.finish()) ADD_FAILURE() << f;
}

// Catches: cancel() that does not wake a waiting next(), or that is
// forgotten by later calls.
TEST_P(ReceiverTest, CancelFromAnotherThreadWakesNext) {
  RigOptions o;
  o.trainer = [](std::size_t) {
    TrainerOptions t;
    t.silent = true;
    return t;
  };
  Rig rig(GetParam(), EightBuckets(), o);
  ASSERT_TRUE(rig.setup.ok()) << rig.setup.ToString();
  Receiver& r = *rig.receiver;
  ASSERT_TRUE(r.start(1, Deadline::After(5s)).ok());
  // The cancel comes once the waiting thread is blocked in next() (a futex
  // wait, seen in /proc), not after a fixed sleep.
  const pid_t waiter = testing::ThisThreadId();
  std::thread canceller([&] {
    EXPECT_TRUE(testing::WaitUntilBlockedIn(waiter, testing::FutexSyscalls()));
    r.cancel(Aborted("operator stopped the job"));
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto got = r.next(Deadline::After(3s));  // bounded, so a missed wake-up fails instead of hanging
  canceller.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kAborted);
  EXPECT_HAS(got.status().message(), "operator stopped the job");
  EXPECT_HAS(r.next(Deadline::Never()).status().message(), "operator stopped the job");
  EXPECT_HAS(r.start(2, Deadline::After(1s)).message(), "operator stopped the job");
  for (const std::string& f : rig.finish()) ADD_FAILURE() << f;
}

// DESIGN.md rule 11: destroying a receiver mid-stream (trainers still
// writing, the I/O thread mid-frame) is clean; run under ASan/TSan too.
TEST_P(ReceiverTest, DestroyMidStreamIsClean) {
  for (int round = 0; round < 5; ++round) {
    RigOptions o;
    o.links = 1 + round % 2;
    Rig rig(GetParam(), RandomStream(100 + round), o);
    ASSERT_TRUE(rig.setup.ok()) << rig.setup.ToString();
    ASSERT_TRUE(rig.receiver->start(1, Deadline::After(5s)).ok());
    for (int k = 0; k < round; ++k) {
      auto got = rig.receiver->next(Deadline::After(5s));
      ASSERT_TRUE(got.ok()) << got.status().ToString();
    }
    rig.receiver.reset();  // mid-stream
    for (auto& t : rig.trainers) t->join();  // they see EOF and leave
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, ReceiverTest, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

// ------------------------------------------------------------ setup errors

// A pool in this process, for setup checks that need no trainer.
class FakePool : public TargetMemory {
 public:
  FakePool(int slots, std::uint64_t slot_bytes) : slots_(slots), bytes_(slot_bytes), mem_(slots * slot_bytes) {}
  std::string descriptor() const override { return "fake"; }
  int slots() const override { return slots_; }
  std::uint64_t slot_bytes() const override { return bytes_; }
  std::byte* slot(int i) override { return mem_.data() + i * bytes_; }
  Status receive_data(Link&, const FrameHeader&, Deadline) override { return Internal("fake pool"); }
  Status seal() override { return Status::Ok(); }
  MemoryKind memory() const override { return MemoryKind::kHost; }
  int device() const override { return -1; }

 private:
  int slots_;
  std::uint64_t bytes_;
  std::vector<std::byte> mem_;
};

TEST(ReceiverSetup, RequiresTwoSlotsOfABucketEach) {
  auto plan = make_plan(EightBuckets(), kBucket);
  ASSERT_TRUE(plan.ok());
  auto one = Receiver::Create(&*plan, 0, std::make_unique<FakePool>(1, kBucket), ReceiverOptions{false, "engine rank 3"});
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_HAS(one.status().message(), "engine rank 3");
  EXPECT_HAS(one.status().message(), "slots must be at least 2");

  // Each bucket holds one 3000-byte tensor: a slot needs 3072 bytes (the
  // largest bucket, aligned), not the 4096 of bucket_size. Catches: slots
  // checked against bucket_size again (the 3072-byte pool refused) or not
  // at all (the 2816-byte pool accepted).
  auto small = Receiver::Create(&*plan, 0, std::make_unique<FakePool>(2, 2816), ReceiverOptions{});
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_HAS(small.status().message(), "slot_bytes 2816 is smaller than the plan's largest bucket 3072");
  auto fitted = Receiver::Create(&*plan, 0, std::make_unique<FakePool>(2, 3072), ReceiverOptions{});
  EXPECT_TRUE(fitted.ok()) << fitted.status().ToString();

  auto ok = Receiver::Create(&*plan, 2, std::make_unique<FakePool>(2, kBucket), ReceiverOptions{});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)->rank(), 2);
  EXPECT_EQ(&(*ok)->plan(), &*plan);
}

TEST(ReceiverSetup, StartWithoutLinksAndNextBeforeStartFail) {
  auto plan = make_plan(EightBuckets(), kBucket);
  ASSERT_TRUE(plan.ok());
  auto r = Receiver::Create(&*plan, 0, std::make_unique<FakePool>(2, kBucket), ReceiverOptions{false, "engine rank 1"});
  ASSERT_TRUE(r.ok());
  auto early = (*r)->next(Deadline::After(100ms));
  EXPECT_EQ(early.status().code(), StatusCode::kFailedPrecondition);
  Status s = (*r)->start(1, Deadline::After(1s));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_HAS(s.message(), "engine rank 1: start(1) with no trainer links attached");
}

}  // namespace
}  // namespace refit
