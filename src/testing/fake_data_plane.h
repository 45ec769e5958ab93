// Fakes of a trainer rank's data plane for the bucket-sender tests: an
// in-memory RemoteTarget (one-sided: mapped slots; or two-sided: writes
// complete only after a few polls) and a BucketProtocol that grants credits
// the way an engine's receiver with `slots` slots does, checks every kLanded
// against the bytes in the target at that moment, and fails (instead of
// hanging) where a real engine would never grant the credit asked for.
#pragma once

#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "transport/transport.h"
#include "runtime/bucket_sender.h"

namespace refit::testing {

class FakeRemoteTarget : public RemoteTarget {
 public:
  // `slots` slots of `slot_bytes` bytes of host memory.
  FakeRemoteTarget(int slots, std::uint64_t slot_bytes, bool one_sided, int polls_until_done = 3)
      : memory_(static_cast<std::size_t>(slots), std::vector<std::byte>(slot_bytes)),
        one_sided_(one_sided),
        polls_until_done_(polls_until_done) {}

  std::byte* mapped_slot(int slot) override {
    if (!one_sided_ || slot < 0 || slot >= static_cast<int>(memory_.size())) return nullptr;
    return memory_[static_cast<std::size_t>(slot)].data();
  }
  // Copies the bytes aside; they reach the slot when poll says done.
  StatusOr<Ticket> submit(int slot, std::uint64_t offset, std::span<const std::byte> bytes, std::uint64_t,
                          Deadline) override {
    if (slot < 0 || slot >= static_cast<int>(memory_.size()) ||
        offset + bytes.size() > memory_[static_cast<std::size_t>(slot)].size()) {
      return InvalidArgument("fake target: write of " + std::to_string(bytes.size()) + " bytes at " +
                             std::to_string(offset) + " into slot " + std::to_string(slot) + " is out of range");
    }
    const Ticket t = next_++;
    writes_[t] = Write{slot, offset, std::vector<std::byte>(bytes.begin(), bytes.end()), 0};
    return t;
  }
  StatusOr<bool> poll(Ticket t) override {
    auto it = writes_.find(t);
    if (it == writes_.end()) return true;
    if (++it->second.polls < polls_until_done_) return false;
    Write& w = it->second;
    std::memcpy(memory_[static_cast<std::size_t>(w.slot)].data() + w.offset, w.bytes.data(), w.bytes.size());
    writes_.erase(it);
    return true;
  }
  void cancel(Ticket t) override {
    ++cancelled_;
    writes_.erase(t);
  }

  const std::byte* slot(int i) const { return memory_[static_cast<std::size_t>(i)].data(); }
  std::size_t writes_in_flight() const { return writes_.size(); }
  int cancelled() const { return cancelled_; }

 private:
  struct Write {
    int slot;
    std::uint64_t offset;
    std::vector<std::byte> bytes;
    int polls;
  };
  std::vector<std::vector<std::byte>> memory_;
  bool one_sided_;
  int polls_until_done_;
  std::map<Ticket, Write> writes_;
  Ticket next_ = 1;
  int cancelled_ = 0;
};

// A kLanded as the fake engine saw it.
struct FakeLanded {
  std::uint64_t version, bucket, slot;
  bool bytes_in_place;  // the checker found the bucket's bytes in the target
};

class FakeProtocol : public BucketProtocol {
 public:
  // `slots`: the engine's pool (the credit of bucket j needs the kLanded of
  // bucket j - slots + 1 when each bucket is one batch, as the receiver
  // grants it). `check(version, bucket, slot)` says whether the bucket's
  // bytes are where kLanded says.
  FakeProtocol(int slots, std::function<bool(std::uint64_t, std::uint64_t, std::uint64_t)> check)
      : slots_(slots), check_(std::move(check)) {}

  StatusOr<std::uint64_t> wait_credit(std::uint64_t version, std::uint64_t bucket, Deadline) override {
    const std::int64_t needs = static_cast<std::int64_t>(bucket) - slots_ + 1;
    if (needs > 0 && !has_landed(static_cast<std::uint64_t>(needs))) {
      return DeadlineExceeded("fake engine: the credit of bucket " + std::to_string(bucket) +
                              " waits for the kLanded of bucket " + std::to_string(needs) +
                              ", which was not sent (a real engine waits forever)");
    }
    (void)version;
    credits_[bucket] = bucket % static_cast<std::uint64_t>(slots_);
    return credits_[bucket];
  }
  Status send_landed(std::uint64_t version, std::uint64_t bucket, std::uint64_t slot, Deadline) override {
    landed_.push_back(FakeLanded{version, bucket, slot, check_(version, bucket, slot)});
    return Status::Ok();
  }
  std::string peer() const override { return "fake engine"; }

  const std::vector<FakeLanded>& landed() const { return landed_; }
  // The slot the credit of `bucket` granted (the test checks kLanded's).
  std::uint64_t credit(std::uint64_t bucket) const { return credits_.at(bucket); }

 private:
  bool has_landed(std::uint64_t bucket) const {
    for (const FakeLanded& l : landed_) {
      if (l.bucket == bucket) return true;
    }
    return false;
  }
  int slots_;
  std::function<bool(std::uint64_t, std::uint64_t, std::uint64_t)> check_;
  std::map<std::uint64_t, std::uint64_t> credits_;
  std::vector<FakeLanded> landed_;
};

}  // namespace refit::testing
