// Receiver: one per engine rank. It owns the rotating receive pool (a
// TargetMemory), grants slots to the trainer ranks that feed this engine rank,
// and turns landed buckets into batches of complete tensors.
//
// Lifetime contract (DESIGN.md rule 3): the views of a batch stay valid until
// the receiver is asked for the batch after next. When next() is called for
// batch n, every slot and reassembly buffer referenced by batch n-2 is
// recycled (and, with ReceiverOptions::poison_recycled, overwritten with
// kPoisonByte) and granted to the trainer that sends the next bucket.
// A bucket that completes no tensor (middle chunks) is copied into a
// reassembly buffer and its slot recycled at once.
//
// Flow control: a slot is granted to bucket j (a kCredit frame to the trainer
// that sends j) only when it is free; trainers never write into a slot they
// were not granted.
//
// Feeding: the plan's buckets are dealt round-robin over the attached links:
// bucket j comes from link (j % links), unless set_feeders() says which
// links write each bucket (sharded trainers: several write parts of one
// bucket; each gets the bucket's credit and announces its part). Buckets
// may land out of order across links; batches are yielded in bucket order.
//
// Thread safety: next(), start() and attach_link() are called by one consumer
// thread. cancel() may be called from any thread. Internally one I/O thread
// reads all links.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "batch/batch_source.h"
#include "refit/deadline.h"
#include "net/link.h"
#include "receiver/landing_ledger.h"
#include "refit/committed_read.h"
#include "refit/plan.h"
#include "refit/status.h"
#include "transport/transport.h"

namespace refit {

inline constexpr unsigned char kPoisonByte = 0xA5;

struct ReceiverOptions {
  // Debug: overwrite every recycled slot and reassembly buffer with
  // kPoisonByte, so a consumer that keeps a view too long reads poison.
  // Default: false.
  bool poison_recycled = false;
  // Name used in errors, e.g. "engine rank 1".
  std::string name = "receiver";
};

struct ReceiverStats {
  std::uint64_t buckets = 0;  // buckets landed in the current/last refit
  std::uint64_t batches = 0;  // batches yielded
  std::uint64_t tensors = 0;  // tensors yielded
  std::uint64_t bytes = 0;    // bucket bytes landed
  std::uint64_t wire_bytes = 0;     // bytes the kLanded frames announced (delta: encoded buckets' encodings)
  std::uint64_t words_buckets = 0;  // buckets that landed delta-encoded
};

// Relays (many engines, issue 18): told of each bucket of a staged refit
// once its bytes are in their slot as the plan lays them out (an encoded
// bucket decoded), in bucket order, on the consumer's thread. The receiver
// recycles that slot (and grants it on) only after wait_forwarded(bucket)
// returned OK: the tap may read the slot's bytes until then.
// A bucket as the tap gets it.
struct TappedBucket {
  std::uint64_t version = 0, bucket = 0;
  const std::byte* bytes = nullptr;  // its n bytes in its slot (the pool's memory), as the plan lays them out
  std::uint64_t n = 0;
  // Delta refits: the encoding it arrived as, against version `base`
  // (valid during landed() only); empty: it arrived as its bytes.
  std::span<const std::byte> encoding;
  std::uint64_t base = 0;
};

class BucketTap {
 public:
  virtual ~BucketTap() = default;
  virtual Status landed(const TappedBucket& bucket) = 0;
  // Returns once `bucket` was forwarded; an error fails the refit.
  virtual Status wait_forwarded(std::uint64_t bucket, Deadline deadline) = 0;
};

// Delta refits: copies into each read's `out` the bytes the engine rank
// holds committed (refit/committed_read.h; `tensor` an index into the
// plan's specs).
using CommittedBytes = ReadCommitted;

class Receiver : public BatchSource {
 public:
  // `plan` must outlive the receiver. `pool` is the registered receive pool;
  // it must have at least 2 slots of pool_slot_bytes(plan) bytes
  // (the plan's largest bucket).
  static StatusOr<std::unique_ptr<Receiver>> Create(const Plan* plan, int rank,
                                                    std::unique_ptr<TargetMemory> pool,
                                                    ReceiverOptions options);
  // Direct mode: `weights` is the engine's weight arena exposed as one slot
  // (Transport::expose_memory). Trainers write into it themselves and
  // announce every bucket with kLanded in slot 0, in any order, each on the
  // link that feeds it; no credits are granted and no batches are yielded:
  // the consumer calls wait_all_landed() instead of next(). The same
  // validator checks every frame as in staged mode (same codes, same text).
  static StatusOr<std::unique_ptr<Receiver>> CreateDirect(const Plan* plan, int rank,
                                                          std::unique_ptr<TargetMemory> weights,
                                                          ReceiverOptions options);
  ~Receiver() override;

  // Adds the link of the next feeding trainer (its index = the number of
  // links attached before it). All links are attached before the first start().
  void attach_link(std::unique_ptr<Link> link);

  // Sharded trainers: which attached links write into each bucket and how
  // many bytes each (landing_ledger.h); a bucket lands once every part was
  // announced. Without it, bucket j comes whole from link j % links. Errors
  // (kInvalidArgument, naming the bucket): another bucket count, a link not
  // attached, links not ascending, a part of 0 bytes, parts that do not add
  // up to the bucket's entries (padding excluded; a whole bucket from one
  // link, as without set_feeders, announces the bucket's bytes). REQUIRES: after every attach_link, before start().
  Status set_feeders(BucketFeeders feeders);

  // Delta refits (issue 22), before start(): the refits that follow offer
  // `base` in every credit (the version the engine rank holds committed
  // and whole; 0: none), and accept buckets delta-encoded against it
  // (delta/word_delta.h). next() decodes such a bucket in its slot over the
  // base's bytes of its entries, read with `committed`, before anything
  // reads the slot; an encoding that does not decode fails the refit
  // (kDataLoss, naming the bucket); in a device pool on the device
  // (cuda/word_delta_device.h), the committed bytes read into device memory.
  // Staged pools only (kFailedPrecondition otherwise).
  Status set_delta_base(std::uint64_t base, CommittedBytes committed);

  // Relays: every bucket of the refits that follow goes to `tap` (not
  // owned; null: none) before its slot is recycled. Staged receivers only
  // (kFailedPrecondition otherwise). Before the first start() or between
  // refits (the last one's stream read to its end; many engines: a rank
  // that gains its first relay child); on the consumer's thread, which
  // alone reads the tap. REQUIRES: the tap forwarded every bucket of a
  // refit before the next start().
  Status set_tap(BucketTap* tap);

  // Partial refits (refit/partial.h): `change` changes the plan this
  // receiver was created with in place (core/plan_swap.h: to a subset plan
  // of the same specs whose buckets fit the pool's slots, or back to the
  // setup's). It runs under the receiver's lock, after the refit's stream
  // was ended (a late frame of it is then out of protocol, never checked
  // against the other plan); then the buckets are dealt over the links
  // again and the views built for the old buckets forgotten. Between
  // refits (or after a failed one), on the consumer's thread.
  // kFailedPrecondition with sharded trainers' feeders (set_feeders), whose
  // parts follow the setup's plan: `change` does not run.
  Status replan(const std::function<void()>& change);

  // Begins refit `version`: resets the stream, grants the first slots.
  // Fails, naming the link, when a link closed or sent a frame since the
  // last refit ended (a frame of an older version is never silently taken).
  // REQUIRES: the previous refit's stream was read to its end or failed.
  Status start(std::uint64_t version, Deadline deadline);

  // The next batch of refit `version`, std::nullopt once every tensor of the
  // plan was yielded. Waits for its bucket(s) until `deadline`; a lost link, a
  // frame out of protocol, or cancel() fail the call with a message naming
  // the peer and the bucket.
  StatusOr<std::optional<Batch>> next(Deadline deadline) override;
  // Direct mode: returns once every bucket of refit `version` (start())
  // landed; a lost link, a frame out of protocol or cancel() fail it as
  // they fail next(); the deadline fails it naming the first missing bucket.
  Status wait_all_landed(Deadline deadline);
  int rank() const override { return rank_; }
  const Plan& plan() const override { return *plan_; }

  // Makes every current and future wait fail with `why`. Thread-safe.
  void cancel(Status why);

  ReceiverStats stats() const;
  TargetMemory& pool() { return *pool_; }

  // Stops the I/O thread, closes the links and hands the registered pool
  // back, so that recovery after a failed refit can build a new Receiver
  // over the same pool (registered once). Only destruction may follow.
  std::unique_ptr<TargetMemory> release_pool();

 private:
  Receiver(const Plan* plan, int rank, std::unique_ptr<TargetMemory> pool, ReceiverOptions options, bool direct);
  const Plan* plan_;
  int rank_;
  std::unique_ptr<TargetMemory> pool_;
  // The links, the I/O thread and all bookkeeping (receiver.cc). Declared
  // last so it is destroyed before the pool it writes into.
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace refit
