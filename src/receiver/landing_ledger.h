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

class LandingLedger {
 public:
  // `plan` must outlive the ledger; `owner` names the receiver in errors.
  LandingLedger(const Plan* plan, std::string owner);

  // The names of the attached links ("trainer link 0 (<peer>)"), in
  // feeding order: bucket j comes from link j % links.
  void set_links(std::vector<std::string> names) { links_ = std::move(names); }
  std::size_t links() const { return links_.size(); }
  const std::string& link_name(std::size_t i) const { return links_[i]; }
  std::size_t feeder(std::uint64_t bucket) const { return static_cast<std::size_t>(bucket % links_.size()); }

  // Refit `version` begins: nothing granted (staged) or every bucket granted
  // slot 0 (direct), nothing landed.
  void begin(std::uint64_t version, bool direct);
  // The refit's stream ended: every later frame is out of protocol.
  void end() { active_ = false; }
  bool active() const { return active_; }
  std::uint64_t version() const { return version_; }

  void grant(std::uint64_t bucket, int slot) { slot_[bucket] = slot; }
  int slot_of(std::uint64_t bucket) const { return slot_[bucket]; }
  bool landed(std::uint64_t bucket) const { return landed_[bucket] != 0; }
  std::uint64_t landed_count() const { return landed_count_; }
  // The first bucket link `i` still owes this refit, or buckets() when none.
  std::uint64_t owed_by(std::size_t i) const;
  std::uint64_t buckets() const { return plan_->buckets.size(); }

  // Validates a frame of type `type` and version `version` from link `i`
  // against the refit in progress.
  Status check_version(std::size_t i, FrameType type, std::uint64_t version) const;
  // Validates kLanded `h` (any type is refused) from link `i` and, when it
  // is in protocol, records the bucket as landed and returns it.
  StatusOr<std::uint64_t> land(std::size_t i, const FrameHeader& h);
  // Validates kData `h` from link `i`: it may only write into a slot granted
  // to a bucket this link feeds that has not landed yet, within the slot's
  // `slot_bytes`.
  Status check_data(std::size_t i, const FrameHeader& h, std::uint64_t slot_bytes) const;

 private:
  const Plan* plan_;
  std::string owner_;
  std::vector<std::string> links_;
  bool active_ = false;
  std::uint64_t version_ = 0;
  std::vector<int> slot_;      // slot granted to bucket j, -1 before
  std::vector<char> landed_;   // bucket j's kLanded arrived (validated)
  std::uint64_t landed_count_ = 0;
};

}  // namespace refit
