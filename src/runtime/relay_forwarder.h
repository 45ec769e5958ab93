// RelayForwarder: an engine rank's relay (many engines, issue 18;
// control/relay_topology.h) to the same rank of each engine it feeds. It is
// the receiver's BucketTap: each bucket that lands in this rank's receive
// pool is handed to one worker thread per child, which writes the slot's
// bytes into the child's pool exactly as a full-weight trainer rank writes
// a bucket (the child's credit, the bytes, kLanded; bucket_sender.h's
// ordering rule: bucket j-1 is announced before j's credit is awaited), and
// the receiver recycles the slot only once every child has it. So a child
// receives bucket j while this rank receives j + 1, and each byte crosses
// each link once. Delta refits: a bucket that arrived encoded goes on
// encoded to a child whose credit offers the same base, as its bytes to
// any other (relay_payload).
//
// The link to a child is a data link like a trainer's: authenticated with
// the job's secret, its hello carrying this engine's relay feeder id
// (control/protocol.h relay_feeder) and the plan's digest, the child's pool
// opened through the transport (host pools: shm maps it, tcp writes frames).
//
// A child linked after setup (its parent was dropped, or it joins the job)
// may have been fed by another engine before: its target is told so
// (RemoteTarget::relinked, as after a failed refit), and transports that
// pair an initiator with a target (nccl's 2-rank communicator) make a new
// pair with this rank.
//
// Failures: a child that stops granting credits within --bucket-timeout, or
// whose link breaks, fails this rank's refit naming the child; cancel()
// (the coordinator's abort) ends every wait at once.
//
// An engine joining the running job gets the committed version from its
// parent the same way: the parent's engine rank packs each bucket from the
// weights it serves and hands it to landed() after begin_for(), which
// feeds that one child (engine_rank_catch_up.cc).
//
// Thread safety: landed, wait_forwarded, begin, finish and relink are
// called by the engine rank's thread; cancel from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "control/protocol.h"
#include "net/link.h"
#include "receiver/receiver.h"
#include "refit/deadline.h"
#include "refit/plan.h"
#include "refit/status.h"
#include "runtime/engine_link_protocol.h"
#include "transport/transport.h"

namespace refit {

struct RelaySettings {
  std::string name;  // this rank's, "engine 0 rank 1", in errors
  int rank = 0;
  std::uint64_t engine = 0;
  std::string secret;  // the job's; "" without one
  std::string transport;
  double bucket_timeout_s = 30;
  // Asked while connecting: a reason ends the wait (the coordinator ended the job).
  std::function<std::optional<Status>()> stopped;
  // The receive pool's device (its slots are device memory; the children's
  // pools, cuda_ipc, are mapped here and written by device copies); -1: host.
  int device = -1;
};

// What a relay writes into a child's slot for a bucket (delta refits, issue
// 22): its encoding when the bucket arrived encoded against the very base
// the child's credit offers, else its bytes. An encoding goes only to a
// child holding the version it was encoded against.
struct RelayPayload {
  std::span<const std::byte> bytes;
  bool encoded = false;
};
RelayPayload relay_payload(std::span<const std::byte> raw, std::span<const std::byte> encoding, std::uint64_t base,
                           std::uint64_t child_base);

class RelayForwarder final : public BucketTap {
 public:
  // Connects to every child (`children`: the setup's relay targets) and
  // starts one worker per child. `plan` outlives the forwarder.
  static StatusOr<std::unique_ptr<RelayForwarder>> Connect(RelaySettings settings, const Plan* plan,
                                                          const std::vector<EngineTarget>& children,
                                                          Deadline deadline);
  ~RelayForwarder() override;

  // After a failed refit (the coordinator's relink): fresh links to the same
  // children, the targets kept (as a trainer rank relinks).
  Status relink(Deadline deadline);
  // The relay tree changed (an engine was dropped): links to children not
  // in `children` close, new ones are linked; those kept are linked again
  // when `relink_kept` (after a failed refit, when every rank relinks).
  // REQUIRES: no refit in flight.
  Status set_children(const std::vector<EngineTarget>& children, bool relink_kept, Deadline deadline);
  // Refit `version` begins: nothing is queued, nothing forwarded.
  void begin(std::uint64_t version, Deadline deadline);
  // An engine joins (catch-up): version `version` goes to child engine
  // `engine` only, the others having it (kNotFound when it is no child).
  Status begin_for(std::uint64_t version, std::uint64_t engine, Deadline deadline);
  // BucketTap (receiver.h).
  // A bucket that arrived delta-encoded is kept encoded beside its bytes:
  // a child whose credit offers the same base gets the encoding, any other
  // the bytes (relay_payload).
  Status landed(const TappedBucket& bucket) override;
  Status wait_forwarded(std::uint64_t bucket, Deadline deadline) override;
  // Returns once every bucket of the refit reached every child.
  Status finish(Deadline deadline);
  // Fails every wait with `why` and shuts the links (the workers stop).
  void cancel(const Status& why);
  // After cancel(): returns once no worker is inside a bucket of the failed
  // refit (it read the plan and the slot until then).
  Status wait_idle(Deadline deadline);
  // Bytes written to the children in this refit, over all of them (an
  // encoded bucket counts its encoding).
  std::uint64_t forwarded_bytes() const;

 private:
  struct Child;
  struct Item {
    std::uint64_t bucket = 0;
    const std::byte* bytes = nullptr;
    std::uint64_t n = 0;
    std::vector<std::byte> encoding;  // delta refits: as it arrived, against `base`; empty: raw
    std::uint64_t base = 0;
  };
  RelayForwarder(RelaySettings settings, const Plan* plan);
  Status link(Child& child, Deadline deadline);
  void start_worker(Child& child);
  void work(Child* child);
  StatusOr<std::uint64_t> forward(Child& child, const Item& item, std::uint64_t version, Deadline deadline);
  // The fewest buckets any child has. REQUIRES: mu_ held.
  std::uint64_t forwarded_by_all() const;

  RelaySettings settings_;
  const Plan* plan_;
  std::unique_ptr<Transport> transport_;
  std::vector<std::unique_ptr<Child>> children_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t version_ = 0;
  Deadline deadline_ = Deadline::Never();
  std::vector<Item> items_;  // this refit's landed buckets, in bucket order
  Status error_;             // the first failure of this refit (or a cancel)
  bool stopping_ = false;
  bool set_up_ = false;  // Connect linked the setup's children; later ones may have had another feeder
};

}  // namespace refit
