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

namespace refit {
namespace {

using namespace std::chrono_literals;

constexpr std::uint64_t kBucket = 4096;

// ------------------------------------------------------------ content
// Byte `offset` of tensor `tensor` at weight version `version`: differs per
// version, tensor and offset, so a stale, recycled or misplaced byte shows.

std::uint64_t Mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::byte ContentByte(std::uint64_t version, std::uint32_t tensor, std::uint64_t offset) {
  const std::uint64_t w = Mix((version << 40) ^ (static_cast<std::uint64_t>(tensor) << 48) ^ (offset >> 3));
  return static_cast<std::byte>(w >> (8 * (offset & 7)));
}

void Fill(std::uint64_t version, std::uint32_t tensor, std::uint64_t offset, std::byte* out, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) out[i] = ContentByte(version, tensor, offset + i);
}

// Offset of the first wrong byte of a whole tensor, or -1.
std::int64_t Mismatch(std::uint64_t version, std::uint32_t tensor, const std::byte* p, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    if (p[i] != ContentByte(version, tensor, i)) return static_cast<std::int64_t>(i);
  }
  return -1;
}

bool AllPoison(const std::byte* p, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    if (p[i] != std::byte{kPoisonByte}) return false;
  }
  return true;
}

// ------------------------------------------------------------ shared checks

// Rule 3 from the trainer's side: a credit must never name a slot that holds
// a batch the consumer may still read (one fewer than two calls old).
class CreditWatch {
 public:
  void reset() {
    std::lock_guard<std::mutex> l(mu_);
    holder_.clear();
    asking_ = 0;
  }
  void asking(std::uint64_t n) {
    std::lock_guard<std::mutex> l(mu_);
    asking_ = n;
  }
  // Records which slots batch `batch` points into.
  void held(std::uint64_t batch, const Batch& b, TargetMemory& pool) {
    std::lock_guard<std::mutex> l(mu_);
    for (const TensorView& v : b.tensors) {
      for (int s = 0; s < pool.slots(); ++s) {
        const auto p = reinterpret_cast<std::uintptr_t>(v.data);
        const auto base = reinterpret_cast<std::uintptr_t>(pool.slot(s));
        if (p >= base && p < base + pool.slot_bytes()) holder_[s] = batch;
      }
    }
  }
  void credit(std::uint64_t bucket, int slot) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = holder_.find(slot);
    if (it != holder_.end() && it->second + 2 > asking_) {
      violations_.push_back("credit for bucket " + std::to_string(bucket) + " names slot " + std::to_string(slot) +
                            ", which holds batch " + std::to_string(it->second) + " while the consumer asks for batch " +
                            std::to_string(asking_));
    }
  }
  std::vector<std::string> violations() {
    std::lock_guard<std::mutex> l(mu_);
    return violations_;
  }

 private:
  std::mutex mu_;
  std::map<int, std::uint64_t> holder_;
  std::uint64_t asking_ = 0;
  std::vector<std::string> violations_;
};

// Lets a test hold the trainers back: bucket j is written only once
// allowed >= j.
class Gate {
 public:
  void allow(std::int64_t j) {
    std::lock_guard<std::mutex> l(mu_);
    allowed_ = j;
    cv_.notify_all();
  }
  bool wait(std::int64_t j) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, 5s, [&] { return allowed_ >= j; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::int64_t allowed_ = INT64_MAX;
};

// ------------------------------------------------------------ trainer side

struct TrainerOptions {
  int close_after = -1;  // close the link after serving this many buckets
  bool silent = false;   // read credits, never answer them
  std::function<void(FrameHeader&)> tamper;  // edits each kLanded before it is sent
};

class Trainer {
 public:
  Trainer(const Plan* plan, std::size_t index, std::size_t links, std::unique_ptr<Link> link,
          std::unique_ptr<RemoteTarget> target, TrainerOptions options, CreditWatch* watch, Gate* gate)
      : plan_(plan), index_(index), links_(links), link_(std::move(link)), target_(std::move(target)),
        options_(std::move(options)), watch_(watch), gate_(gate) {
    thread_ = std::thread([this] { run(); });
  }
  ~Trainer() { join(); }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  // Read after join().
  const std::vector<std::string>& failures() const { return failures_; }

 private:
  void run() {
    for (;;) {
      StatusOr<FrameHeader> h = link_->recv_header(Deadline::After(20s));
      if (!h.ok()) return;  // the receiver went away
      if (h->type != FrameType::kCredit) {
        failures_.push_back("trainer " + std::to_string(index_) + " got frame type " +
                            std::to_string(static_cast<int>(h->type)));
        return;
      }
      const std::uint64_t version = h->a, j = h->b;
      const int slot = static_cast<int>(h->c);
      if (j >= plan_->buckets.size() || j % links_ != index_) {
        failures_.push_back("trainer " + std::to_string(index_) + " got a credit for bucket " + std::to_string(j));
        return;
      }
      watch_->credit(j, slot);
      if (options_.silent) continue;
      if (!gate_->wait(static_cast<std::int64_t>(j))) return;
      // An I/O error here means the receiver went away (tests end a rig
      // mid-stream); the receiver's side reports anything else.
      if (!serve(version, j, slot).ok()) return;
      if (++served_ == options_.close_after) {  // EOF at the receiver
        target_.reset();
        link_.reset();
        return;
      }
    }
  }

  Status serve(std::uint64_t version, std::uint64_t j, int slot) {
    const Bucket& bucket = plan_->buckets[j];
    std::byte* mapped = target_->mapped_slot(slot);
    if (mapped != nullptr) {  // one-sided: pack in place
      for (const PlanEntry& e : bucket.entries) Fill(version, e.tensor, e.tensor_offset, mapped + e.bucket_offset, e.bytes);
    } else {
      std::vector<std::byte> staging(bucket.bytes);
      for (const PlanEntry& e : bucket.entries) {
        Fill(version, e.tensor, e.tensor_offset, staging.data() + e.bucket_offset, e.bytes);
      }
      ASSIGN_OR_RETURN(Ticket t, target_->submit(slot, 0, staging, version, Deadline::After(5s)));
      for (;;) {
        ASSIGN_OR_RETURN(bool done, target_->poll(t));
        if (done) break;
      }
    }
    FrameHeader landed;
    landed.type = FrameType::kLanded;
    landed.a = version;
    landed.b = j;
    landed.c = static_cast<std::uint64_t>(slot);
    landed.d = bucket.bytes;
    if (options_.tamper) options_.tamper(landed);
    return link_->send(landed, {}, Deadline::After(5s));
  }

  const Plan* plan_;
  std::size_t index_, links_;
  std::unique_ptr<Link> link_;
  std::unique_ptr<RemoteTarget> target_;  // declared after link_: destroyed first
  TrainerOptions options_;
  CreditWatch* watch_;
  Gate* gate_;
  int served_ = 0;
  std::vector<std::string> failures_;
  std::thread thread_;
};

// ------------------------------------------------------------ a rig

std::string PeerName(std::size_t i) { return "trainer-" + std::to_string(i) + "@test"; }

struct RigOptions {
  int slots = 2;
  int links = 1;
  bool poison = true;
  std::function<TrainerOptions(std::size_t)> trainer = [](std::size_t) { return TrainerOptions{}; };
};

// One engine rank (the receiver, in this thread) fed by `links` trainer
// threads. Members are torn down receiver first, so the trainers see EOF.
class Rig {
 public:
  Rig(const std::string& transport, std::vector<TensorSpec> specs, RigOptions options) {
    auto plan = make_plan(std::move(specs), kBucket);
    if (!plan.ok()) {
      setup = plan.status();
      return;
    }
    plan_ = std::move(plan).value();
    setup = build(transport, options);
  }
  ~Rig() {
    gate.allow(INT64_MAX);
    receiver.reset();
    for (auto& t : trainers) t->join();
  }

  // Ends the rig early and returns the trainers' failures and the watch's
  // violations.
  std::vector<std::string> finish() {
    gate.allow(INT64_MAX);
    receiver.reset();
    std::vector<std::string> out = watch.violations();
    for (auto& t : trainers) {
      t->join();
      out.insert(out.end(), t->failures().begin(), t->failures().end());
    }
    return out;
  }

  const Plan& plan() const { return plan_; }

 private:
  Plan plan_;  // first: outlives everything below

 public:
  Status setup;
  std::unique_ptr<Transport> transport;
  std::unique_ptr<Receiver> receiver;
  std::vector<std::unique_ptr<Trainer>> trainers;
  CreditWatch watch;
  Gate gate;

 private:
  Status build(const std::string& name, const RigOptions& o) {
    ASSIGN_OR_RETURN(transport, make_transport(name));
    PoolOptions pool;
    pool.slots = o.slots;
    pool.slot_bytes = kBucket;
    pool.owner = "engine rank 0";
    ASSIGN_OR_RETURN(auto target, transport->create_target(pool));
    ReceiverOptions ro;
    ro.poison_recycled = o.poison;
    ro.name = "engine rank 0";
    ASSIGN_OR_RETURN(receiver, Receiver::Create(&plan_, 0, std::move(target), ro));
    ASSIGN_OR_RETURN(auto listener, Listener::Listen("127.0.0.1", 0));
    for (int i = 0; i < o.links; ++i) {
      ASSIGN_OR_RETURN(auto trainer_link, Link::Connect(listener->address(), "engine rank 0", Deadline::After(5s)));
      ASSIGN_OR_RETURN(auto engine_link, listener->accept(Deadline::After(5s)));
      engine_link->set_peer(PeerName(i));
      receiver->attach_link(std::move(engine_link));
      ASSIGN_OR_RETURN(auto remote, transport->open_target(receiver->pool().descriptor(), trainer_link.get()));
      trainers.push_back(std::make_unique<Trainer>(&plan_, i, o.links, std::move(trainer_link), std::move(remote),
                                                   o.trainer(i), &watch, &gate));
    }
    return Status::Ok();
  }
};

// ------------------------------------------------------------ streams

TensorSpec Spec(const std::string& name, DType dtype, std::uint64_t bytes) {
  const std::int64_t elems = static_cast<std::int64_t>(bytes / dtype_size(dtype));
  if (elems > 0 && elems % 4 == 0) return TensorSpec{name, dtype, {4, elems / 4}};
  return TensorSpec{name, dtype, {elems}};
}

// Mixed dtypes, 0-byte tensors, scalars, small tensors and tensors cut into
// 2 to 4 chunks.
std::vector<TensorSpec> RandomStream(unsigned seed) {
  std::mt19937 rng(seed);
  const DType dtypes[] = {DType::kBFloat16, DType::kFloat32, DType::kInt8, DType::kFloat64, DType::kFloat16};
  const int n = 15 + static_cast<int>(rng() % 20);
  std::vector<TensorSpec> out;
  for (int i = 0; i < n; ++i) {
    const DType d = dtypes[rng() % 5];
    const std::string name = "layer." + std::to_string(i) + ".w";
    switch (rng() % 10) {
      case 0: out.push_back(TensorSpec{name, d, {0, 7}}); break;  // 0 bytes
      case 1: out.push_back(TensorSpec{name, d, {}}); break;      // a scalar
      case 2:
      case 3: out.push_back(Spec(name, d, kBucket + 8 + rng() % (3 * kBucket))); break;  // chunked
      default: out.push_back(Spec(name, d, 8 + rng() % (kBucket / 2))); break;
    }
  }
  return out;
}

// Reads one whole refit and checks it: every tensor exactly once, in stream
// order, bit-exact; the previous batch still intact after each call (rule 3).
void ConsumeRefit(Rig& rig, std::uint64_t version) {
  Receiver& r = *rig.receiver;
  const Plan& plan = rig.plan();
  rig.watch.reset();
  Status s = r.start(version, Deadline::After(5s));
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::size_t next_tensor = 0;
  std::optional<Batch> prev;
  for (std::uint64_t n = 0;; ++n) {
    rig.watch.asking(n);
    auto got = r.next(Deadline::After(5s));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    if (!got->has_value()) break;
    const Batch& b = **got;
    EXPECT_EQ(b.sequence, n);
    ASSERT_LT(b.bucket, plan.buckets.size());
    const Bucket& bucket = plan.buckets[b.bucket];
    ASSERT_EQ(b.tensors.size(), bucket.completes.size());
    for (std::size_t k = 0; k < b.tensors.size(); ++k) {
      const TensorView& v = b.tensors[k];
      ASSERT_LT(next_tensor, plan.specs.size());
      ASSERT_EQ(v.spec, &plan.specs[next_tensor]) << "tensor " << next_tensor << " out of order";
      EXPECT_EQ(bucket.completes[k], next_tensor);
      ASSERT_NE(v.data, nullptr);
      EXPECT_EQ(Mismatch(version, static_cast<std::uint32_t>(next_tensor), v.data, v.spec->nbytes()), -1)
          << v.spec->ToString() << " in batch " << n;
      ++next_tensor;
    }
    if (prev) {
      for (const TensorView& v : prev->tensors) {
        const auto t = static_cast<std::uint32_t>(v.spec - plan.specs.data());
        EXPECT_EQ(Mismatch(version, t, v.data, v.spec->nbytes()), -1)
            << "batch " << n - 1 << "'s " << v.spec->name << " changed while it was still valid";
      }
    }
    rig.watch.held(n, b, r.pool());
    prev = b;
  }
  EXPECT_EQ(next_tensor, plan.specs.size());
  auto again = r.next(Deadline::After(1s));  // still the end
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());
  EXPECT_EQ(r.stats().buckets, plan.buckets.size());
}

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
