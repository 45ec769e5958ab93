// EngineLinkProtocol: the BucketProtocol of a full-weight trainer rank's one
// data link to the engine rank it feeds (bucket_sender.h): credits and
// kLanded on that link, the time this refit waited for credits, and what
// crossed the link (delta refits, issue 22: an encoded bucket counts its
// encoded bytes, and the buckets of each encoding are counted).
//
// Thread safety: one thread (the trainer rank's refit thread); the link is
// the caller's and outlives every call.
#pragma once

#include <cstdint>
#include <string>

#include "control/control_message.h"
#include "net/link.h"
#include "refit/plan.h"
#include "runtime/bucket_sender.h"

namespace refit {

// What crossed one link in one refit.
struct LinkTally {
  double credit_wait_s = 0;         // waits for credits
  std::uint64_t wire_bytes = 0;     // buckets' bytes, encoded ones' encoded bytes
  std::uint64_t full_buckets = 0;   // buckets sent as they are
  std::uint64_t words_buckets = 0;  // buckets sent delta-encoded
  // The bases the engine rank's credits named (--delta): the first one,
  // and whether any other differed; `credits` counts them.
  std::uint64_t credits = 0, credit_base = 0;
  bool credit_bases_differ = false;
  // True when this refit had credits and every one named `base`.
  bool every_credit_named(std::uint64_t base) const {
    return credits > 0 && !credit_bases_differ && credit_base == base;
  }
};

// --delta: a trainer rank's done stats gain `wire_bytes` (what crossed its
// link), `encodings` {`full`, `words`} (its buckets sent each way) and
// `delta_base_bytes` (what it holds to encode against: bucket_bases.h).
void add_delta_fields(Json& stats, const LinkTally& tally, std::uint64_t base_bytes);

class EngineLinkProtocol final : public BucketProtocol {
 public:
  // `name` ("trainer rank 2") in errors; `plan` outlives the protocol.
  EngineLinkProtocol(std::string name, const Plan* plan, double bucket_timeout_s)
      : name_(std::move(name)), plan_(plan), bucket_timeout_s_(bucket_timeout_s) {}

  // The link the calls use (null: none, between a release and an acquire).
  void attach(Link* link) { link_ = link; }
  // A refit begins: the tally starts from zero.
  void begin_refit() { tally_ = LinkTally{}; }
  const LinkTally& tally() const { return tally_; }

  // The credit of bucket j; one that does not come within the bucket
  // deadline means a stalled or dead engine rank: fail instead of waiting
  // for the whole refit's.
  StatusOr<std::uint64_t> wait_credit(std::uint64_t version, std::uint64_t bucket, Deadline deadline) override;
  StatusOr<GrantedSlot> wait_credit_base(std::uint64_t version, std::uint64_t bucket, Deadline deadline) override;
  Status send_landed(std::uint64_t version, std::uint64_t bucket, std::uint64_t slot, Deadline deadline) override;
  Status send_landed_encoded(std::uint64_t version, std::uint64_t bucket, std::uint64_t slot,
                             std::uint64_t encoded_bytes, Deadline deadline) override;
  std::string peer() const override { return link_ != nullptr ? link_->peer() : "no engine link"; }

 private:
  std::string name_;
  const Plan* plan_;
  double bucket_timeout_s_;
  Link* link_ = nullptr;
  LinkTally tally_;
};

}  // namespace refit
