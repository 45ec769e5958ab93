// Receiver::Impl: the receiver's state and the helpers both of its threads
// use (receiver.h is the contract; this header is private to src/receiver/).
//
// Two threads touch a receiver:
//   * the consumer (start, next, attach_link) owns the pool bookkeeping: which
//     slot holds which batch, the reassembly buffers, and it sends every
//     kCredit (receiver.cc, receiver_batches.cc);
//   * one I/O thread reads every link with poll(2), lands kData payloads
//     through the pool, validates kLanded frames and records them
//     (receiver_io.cc).
// They share only the fields marked "shared", under one mutex; a condition
// variable wakes the consumer when a bucket lands, an error arrives or
// cancel() is called.
#pragma once

#include "cuda/device.h"
#include "cuda/word_delta_device.h"
#include "net/frames.h"
#include "receiver/landing_ledger.h"
#include "receiver/receiver.h"
#include "refit/log.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace refit {
namespace receiver_detail {

using Clock = std::chrono::steady_clock;

// A credit to send: consumer-side, sent outside the lock.
struct Grant {
  std::size_t link = 0;
  std::uint64_t bucket = 0;
  int slot = 0;
};

}  // namespace receiver_detail

struct Receiver::Impl {
  using Clock = receiver_detail::Clock;
  using Grant = receiver_detail::Grant;

  Impl(const Plan* p, int r, TargetMemory* pl, ReceiverOptions o, bool d)
      : plan(p), rank(r), pool(pl), options(std::move(o)), direct(d), ledger(p, options.name) {}

  const Plan* plan;
  int rank;
  TargetMemory* pool;
  ReceiverOptions options;
  // Direct mode (CreateDirect): `pool` is the engine's exposed weights, one
  // slot; no credits, no batches: the consumer waits for every bucket.
  const bool direct;

  // Fixed once the I/O thread runs (attach_link is refused after start()).
  std::vector<std::unique_ptr<Link>> links;
  // Which links write into each bucket (set_feeders); empty: round-robin.
  BucketFeeders feeders;
  int wake_fd = -1;
  std::thread io;

  // ------------------------------------------------ shared, under `mu`
  mutable std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  bool io_started = false;
  Status fatal;             // cancel() or misuse: every later call fails with it
  Status error;             // the current refit failed (first error wins)
  Status stray;             // a frame arrived between refits; reported by start()
  // The refit in progress (active between start() and the end of the
  // stream): grants, landings, and the validator of every frame.
  LandingLedger ledger;
  std::vector<std::string> closed;  // non-empty: why link i is gone
  ReceiverStats stats;

  // ------------------------------------------------ consumer thread only
  bool started = false;
  bool ended = false;
  std::deque<int> free_slots;
  std::uint64_t next_grant = 0;   // first bucket without a slot
  std::uint64_t next_bucket = 0;  // next bucket to turn into a batch
  std::uint64_t sequence = 0;     // next batch's sequence
  // Reassembly: two buffers of plan->largest_chunked_tensor bytes, used
  // alternately per chunked tensor.
  // Host memory for host pools, device memory (on the pool's device) for
  // device pools; buffer(b) gives the address either way.
  std::unique_ptr<std::byte[]> buffers[2];
  DeviceBuffer device_buffers[2];
  std::byte* buffer(int b) { return device_buffers[b].data() != nullptr ? device_buffers[b].data() : buffers[b].get(); }
  bool on_device() const { return pool->memory() == MemoryKind::kCuda; }
  // Copies within the pool's memory (host memcpy, or a synchronous device copy).
  Status copy_bytes(std::byte* dst, const std::byte* src, std::uint64_t n) {
    if (n == 0) return Status::Ok();
    if (on_device()) return copy_device_to_device(dst, src, n);
    std::memcpy(dst, src, n);
    return Status::Ok();
  }
  bool buffer_busy[2] = {false, false};
  std::uint64_t buffer_used[2] = {0, 0};
  int next_buffer = 0;
  std::int64_t chunk_tensor = -1;  // the tensor being reassembled
  int chunk_buffer = -1;
  // What each yielded batch still references (DESIGN.md rule 3).
  struct Held {
    std::uint64_t sequence = 0;
    int slot = -1;
    std::vector<int> buffers;
  };
  std::deque<Held> held;
  // Delta refits (set_delta_base): the base this refit's credits offer (0:
  // none), the engine's committed bytes, and where an encoding is moved
  // out of its slot before the slot is filled with the base.
  std::uint64_t delta_base = 0;
  CommittedBytes committed;
  std::vector<CommittedRead> committed_reads;  // gather_committed's, kept for their capacity
  std::vector<std::byte> delta_scratch;
  // ... into a device pool: the encoding set aside on the device, and the
  // codec that decodes it there (both made at the first encoded bucket).
  DeviceBuffer device_delta_scratch;
  std::unique_ptr<DeviceDeltaCodec> device_codec;
  // Relays (set_tap): the tap, and the bucket each slot holds until the tap
  // forwarded it (-1: none).
  BucketTap* tap = nullptr;
  std::vector<std::int64_t> slot_bucket;
  // Views of buckets of whole tensors, by bucket * slots + slot; empty until
  // built (the pool does not change while this receiver lives; the plan
  // only in replan(), which clears them).
  std::vector<std::vector<TensorView>> whole_views;

  // Numbers `batch`, records what it holds (a slot, or -1; reassembly
  // buffers), grants what is free and hands it to the consumer.
  StatusOr<std::optional<Batch>> yield(Batch batch, int slot, std::vector<int> buffers, std::uint64_t v,
                                       Deadline deadline) {
    batch.sequence = sequence++;
    held.push_back(Held{batch.sequence, slot, std::move(buffers)});
    {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.batches;
      stats.tensors += batch.tensors.size();
    }
    RETURN_IF_ERROR(grant_and_send(v, deadline));
    return std::optional<Batch>(std::move(batch));
  }

  // ------------------------------------------------ helpers
  std::string link_name(std::size_t i) const {
    return "trainer link " + std::to_string(i) + " (" + links[i]->peer() + ")";
  }
  // Who writes bucket j (set_feeders, or round-robin), for errors. REQUIRES: mu held or the links fixed.
  std::string feeders_of(std::uint64_t bucket) const { return ledger.feeders_of(bucket); }
  // The largest payload a frame may carry: a bucket's bytes (staged), an
  // in-band announcement (direct: transport.h).
  std::uint64_t max_payload() const { return direct ? kMaxAnnouncementBytes : pool->slot_bytes(); }

  // REQUIRES: mu held.
  void fail_locked(Status s) {
    if (error.ok()) error = std::move(s);
    cv.notify_all();
  }
  void wake() {
    if (wake_fd < 0) return;
    std::uint64_t one = 1;
    ssize_t rc = ::write(wake_fd, &one, sizeof one);
    (void)rc;  // eventfd counter overflow is impossible at this rate
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    wake();
    for (auto& l : links) l->shutdown();  // wakes a read blocked mid-frame
    if (io.joinable()) io.join();
    if (wake_fd >= 0) ::close(wake_fd);
    wake_fd = -1;
  }

  // ------------------------------------------------ I/O thread
  void io_loop();
  void handle_frame(std::size_t i);
  void link_lost(std::size_t i, const Status& why);
  void out_of_protocol(std::size_t i, const FrameHeader& h, Status bad);

  // ------------------------------------------------ consumer
  void poison(std::byte* p, std::uint64_t n) const {
    if (!options.poison_recycled || n == 0) return;
    if (on_device()) {
      // Poisoning is a debug aid: a failure to poison must not pass silently.
      Status st = device_memset(p, kPoisonByte, n);
      if (!st.ok()) log(LogLevel::kError, options.name, "poisoning a recycled device buffer failed: " + st.ToString());
      return;
    }
    std::memset(p, kPoisonByte, n);
  }
  // Recycles `slot` once the tap forwarded the bucket it holds.
  Status release_slot(int slot, Deadline deadline) {
    if (tap != nullptr && slot_bucket[static_cast<std::size_t>(slot)] >= 0) {
      const auto bucket = static_cast<std::uint64_t>(slot_bucket[static_cast<std::size_t>(slot)]);
      RETURN_IF_ERROR(tap->wait_forwarded(bucket, deadline));
      slot_bucket[static_cast<std::size_t>(slot)] = -1;
    }
    poison(pool->slot(slot), pool->slot_bytes());
    free_slots.push_back(slot);
    return Status::Ok();
  }
  void release_buffer(int b) {
    poison(buffer(b), buffer_used[b]);
    buffer_busy[b] = false;
    buffer_used[b] = 0;
  }
  // Releases what batches older than `sequence - 1` hold.
  Status release_before(std::uint64_t seq, Deadline deadline) {
    while (!held.empty() && held.front().sequence + 2 <= seq) {
      if (held.front().slot >= 0) RETURN_IF_ERROR(release_slot(held.front().slot, deadline));
      for (int b : held.front().buffers) release_buffer(b);
      held.pop_front();
    }
    return Status::Ok();
  }
  // Grants free slots to the next buckets in order. REQUIRES: mu held.
  std::vector<Grant> grant_locked() {
    std::vector<Grant> out;
    while (!free_slots.empty() && next_grant < plan->buckets.size()) {
      const int s = free_slots.front();
      free_slots.pop_front();
      ledger.grant(next_grant, s);
      for (const BucketContributor& c : ledger.contributors(next_grant)) out.push_back(Grant{c.link, next_grant, s});
      ++next_grant;
    }
    return out;
  }
  Status grant_and_send(std::uint64_t v, Deadline deadline) {
    std::vector<Grant> credits;
    {
      std::lock_guard<std::mutex> lock(mu);
      credits = grant_locked();
    }
    for (const Grant& c : credits) {
      const CreditFrame credit{v, c.bucket, static_cast<std::uint64_t>(c.slot), delta_base};
      Status s = links[c.link]->send(encode(credit), {}, deadline);
      if (!s.ok()) {
        s = s.WithContext(options.name + ": granting slot " + std::to_string(c.slot) + " for bucket " +
                          std::to_string(c.bucket) + " to " + link_name(c.link));
        std::lock_guard<std::mutex> lock(mu);
        fail_locked(s);
        return s;
      }
    }
    return Status::Ok();
  }
  StatusOr<std::optional<Batch>> next(Deadline deadline);
  Status start(std::uint64_t v, Deadline deadline);
  Status wait_all_landed(Deadline deadline);

  // ------------------------------------------------ next()'s steps (receiver_batches.cc)
  // A bucket the ledger reports landed, while next() turns it into a batch.
  struct LandedBucket {
    std::uint64_t index = 0;
    int slot = -1;
    std::uint64_t version = 0;
    Deadline deadline;
    bool in_place = false;  // its bytes are known to be in the slot
  };
  // What the walk over a landed bucket's entries found.
  struct BucketParts {
    std::vector<std::pair<std::uint32_t, std::byte*>> done;  // tensor -> bytes
    bool slot_referenced = false;  // a whole tensor is read from the slot itself
    std::vector<int> buffers_used;  // reassembly buffers of tensors completed here
  };
  StatusOr<LandedBucket> await_bucket(std::uint64_t j, std::uint64_t v, Clock::time_point entered,
                                      Deadline deadline);
  Status wait_in_place(LandedBucket& b);
  Status decode_in_slot(LandedBucket& b, std::uint64_t encoded_bytes);
  // The committed bytes of bucket b's entries, read into its slot.
  Status gather_committed(const Bucket& bucket, std::byte* slot, const std::string& where);
  // decode_in_slot for a device pool, with the GPU codec.
  Status decode_on_device(const Bucket& bucket, std::byte* slot, std::uint64_t encoded_bytes,
                          const std::string& where);
  StatusOr<std::optional<Batch>> take_bucket(LandedBucket& b);
  Status gather(LandedBucket& b, BucketParts& parts);
  Status reassemble(LandedBucket& b, const PlanEntry& e, std::byte* base, BucketParts& parts);
  Status views_of_completed(std::uint64_t j, BucketParts& parts, std::vector<TensorView>& out) const;
};

}  // namespace refit
