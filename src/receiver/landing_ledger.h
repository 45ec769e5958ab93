// LandingLedger: the receiver's record of one refit's buckets (which slot
// each was granted, which landed) and the one validator of every frame a
// trainer sends on the data plane, staged or direct.
//
// Every violation is kDataLoss: a frame out of protocol (a wrong version,
// bucket, slot, link or byte count) means the bytes it announces are not
// where the plan says, so the refit's data cannot be trusted (status.h:
// "bytes arrived wrong"). It is not kInvalidArgument: the frame is a peer's,
// not the caller's input. Messages start with the receiver's name and the
// link ("engine rank 0: trainer link 1 (<peer>) sent kLanded for bucket 3
// ...") in both modes.
//
// Direct mode has no credits: begin() grants every bucket slot 0 (the
// engine's weights, exposed as one slot) and trainers announce buckets in
// any order, each on the link that feeds it.
//
// Thread safety: none; the receiver calls it under its mutex.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "net/frames.h"
#include "refit/plan.h"
#include "refit/status.h"

namespace refit {

// One link's part of one bucket: the link writes `bytes` of it and announces
// them with one kLanded.
struct BucketContributor {
  std::size_t link = 0;
  std::uint64_t bytes = 0;
  friend bool operator==(const BucketContributor&, const BucketContributor&) = default;
};
// Per bucket, the links that write into it, ascending link. A bucket with
// no contributor (it holds no bytes) counts as landed at once.
using BucketFeeders = std::vector<std::vector<BucketContributor>>;

// Full-weight trainers: bucket j comes whole from link j % links (links > 0).
BucketFeeders round_robin_feeders(const Plan& plan, std::size_t links);

class LandingLedger {
 public:
  // `plan` must outlive the ledger; `owner` names the receiver in errors.
  LandingLedger(const Plan* plan, std::string owner);

  // The names of the attached links ("trainer link 0 (<peer>)"), and which
  // of them write into each bucket (sharded trainers: several, each a part;
  // round_robin_feeders otherwise). REQUIRES: one entry per bucket of the
  // plan as it is now, links inside `names`. Called again when the plan
  // changed between refits (a partial refit's plan, Receiver::replan).
  void set_links(std::vector<std::string> names, BucketFeeders feeders);
  std::size_t links() const { return links_.size(); }
  const std::string& link_name(std::size_t i) const { return links_[i]; }
  const std::vector<BucketContributor>& contributors(std::uint64_t bucket) const { return feeders_[bucket]; }
  // "trainer link 0 (<peer>)", or "trainer links 0 (<peer>) and 1 (<peer>)":
  // who writes bucket j, for errors about it.
  std::string feeders_of(std::uint64_t bucket) const;

  // Refit `version` begins: nothing granted (staged) or every bucket granted
  // slot 0 (direct), nothing landed but the buckets no link writes.
  // `delta_base` (delta refits): the base version this refit's credits
  // offer; 0: none, and an encoded kLanded is out of protocol.
  void begin(std::uint64_t version, bool direct, std::uint64_t delta_base = 0);
  // The refit's stream ended: every later frame is out of protocol.
  void end() { active_ = false; }
  bool active() const { return active_; }
  std::uint64_t version() const { return version_; }

  void grant(std::uint64_t bucket, int slot) { slot_[bucket] = slot; }
  int slot_of(std::uint64_t bucket) const { return slot_[bucket]; }
  // Every contributor of `bucket` announced its part.
  bool landed(std::uint64_t bucket) const { return owed_[bucket] == 0; }
  // Delta refits: the bytes of `bucket`'s encoding at its slot's start when
  // its kLanded said encoded; 0: the slot holds its bytes.
  std::uint64_t encoded_bytes(std::uint64_t bucket) const { return encoded_[bucket]; }
  std::uint64_t landed_count() const { return landed_count_; }
  // The first bucket link `i` still owes this refit, or buckets() when none.
  std::uint64_t owed_by(std::size_t i) const;
  std::uint64_t buckets() const { return plan_->buckets.size(); }

  // Validates a frame of type `type` and version `version` from link `i`
  // against the refit in progress.
  Status check_version(std::size_t i, FrameType type, std::uint64_t version) const;
  // Validates kLanded `h` (any type is refused) from link `i` and, when it
  // is in protocol, records link i's part of the bucket as landed and
  // returns the bucket and whether it is now complete (every part landed).
  // An encoded kLanded (delta refits) is accepted only when this refit
  // offered a base, for a bucket one link writes whole, with at least an
  // encoding's header and fewer bytes than the bucket.
  struct Landing {
    std::uint64_t bucket = 0;
    bool complete = false;
    std::uint64_t announced = 0;  // the bytes this kLanded says crossed the link
    bool encoded = false;
  };
  StatusOr<Landing> land(std::size_t i, const FrameHeader& h);
  // Validates kData `h` from link `i`: it may only write into a slot granted
  // to a bucket this link writes whose part has not landed yet, within the
  // slot's `slot_bytes`.
  Status check_data(std::size_t i, const FrameHeader& h, std::uint64_t slot_bytes) const;

 private:
  // Index of link i among bucket j's contributors, or -1.
  int part_of(std::uint64_t j, std::size_t i) const;
  // The bytes kLanded `f` of link i's part k may announce, or why not.
  Status check_bytes(const LandedFrame& f, std::size_t part, const std::string& who) const;

  const Plan* plan_;
  std::string owner_;
  std::vector<std::string> links_;
  BucketFeeders feeders_;
  bool active_ = false;
  std::uint64_t version_ = 0;
  std::uint64_t delta_base_ = 0;           // the base this refit's credits offer (0: none)
  std::vector<std::uint64_t> encoded_;     // bucket j's encoded bytes (0: raw)
  std::vector<int> slot_;                  // slot granted to bucket j, -1 before
  std::vector<std::vector<char>> part_landed_;  // [j][k]: contributor k's kLanded arrived (validated)
  std::vector<std::size_t> owed_;          // parts of bucket j still to land
  std::uint64_t landed_count_ = 0;         // buckets complete
};

}  // namespace refit
