// WriteInFlight: the one bucket a remote-write sender (kRemoteWrite,
// kRemoteDelta) has submitted and not yet announced: the transport's
// tickets of its writes, and what its kLanded will say. The senders land
// bucket j-1 (wait for its writes, then announce it) before they wait for
// the credit of bucket j.
#pragma once

#include <cstdint>
#include <vector>

#include "refit/deadline.h"
#include "refit/status.h"
#include "runtime/bucket_sender.h"

namespace refit {

class WriteInFlight {
 public:
  // Bucket `bucket` of refit `version` is about to be written into `slot`;
  // `encoded`: the writes carry its delta encoding of that many bytes (0:
  // its bytes).
  void start(std::uint64_t version, std::uint64_t bucket, std::uint64_t slot, std::uint64_t encoded = 0);
  void add(Ticket ticket) { tickets_.push_back(ticket); }
  std::uint64_t version() const { return version_; }
  std::uint64_t slot() const { return slot_; }

  // Waits until every write is in the engine's memory, then announces the
  // bucket (as encoded when it is). No-op when none is in flight.
  Status land(const SenderContext& c, Deadline deadline);
  // After a failed refit: cancels the writes (the transport makes the next
  // write wait for them) and forgets the bucket.
  void cancel(const SenderContext& c);

 private:
  bool active_ = false;
  std::uint64_t version_ = 0, bucket_ = 0, slot_ = 0, encoded_ = 0;
  std::vector<Ticket> tickets_;
};

}  // namespace refit
