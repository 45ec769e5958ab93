// The receiver's test rig (receiver_test.cc, receiver_tap_test.cc): one
// engine rank's receiver fed by trainer threads over loopback TCP, writing
// through a real transport into its pool, with content that differs per
// version, tensor and offset, so a stale, recycled or misplaced byte shows.
#pragma once

#include "receiver/receiver.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace refit::receiver_testing {

using namespace std::chrono_literals;

inline constexpr std::uint64_t kBucket = 4096;

// ------------------------------------------------------------ content
// Byte `offset` of tensor `tensor` at weight version `version`: differs per
// version, tensor and offset, so a stale, recycled or misplaced byte shows.

inline std::uint64_t Mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline std::byte ContentByte(std::uint64_t version, std::uint32_t tensor, std::uint64_t offset) {
  const std::uint64_t w = Mix((version << 40) ^ (static_cast<std::uint64_t>(tensor) << 48) ^ (offset >> 3));
  return static_cast<std::byte>(w >> (8 * (offset & 7)));
}

inline void Fill(std::uint64_t version, std::uint32_t tensor, std::uint64_t offset, std::byte* out, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) out[i] = ContentByte(version, tensor, offset + i);
}

// Offset of the first wrong byte of a whole tensor, or -1.
inline std::int64_t Mismatch(std::uint64_t version, std::uint32_t tensor, const std::byte* p, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    if (p[i] != ContentByte(version, tensor, i)) return static_cast<std::int64_t>(i);
  }
  return -1;
}

inline bool AllPoison(const std::byte* p, std::uint64_t n) {
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

inline std::string PeerName(std::size_t i) { return "trainer-" + std::to_string(i) + "@test"; }

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

inline TensorSpec Spec(const std::string& name, DType dtype, std::uint64_t bytes) {
  const std::int64_t elems = static_cast<std::int64_t>(bytes / dtype_size(dtype));
  if (elems > 0 && elems % 4 == 0) return TensorSpec{name, dtype, {4, elems / 4}};
  return TensorSpec{name, dtype, {elems}};
}

// Mixed dtypes, 0-byte tensors, scalars, small tensors and tensors cut into
// 2 to 4 chunks.
inline std::vector<TensorSpec> RandomStream(unsigned seed) {
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
inline void ConsumeRefit(Rig& rig, std::uint64_t version) {
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

}  // namespace refit::receiver_testing
