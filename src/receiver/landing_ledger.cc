// LandingLedger: see landing_ledger.h.
#include "receiver/landing_ledger.h"

#include <algorithm>

namespace refit {

LandingLedger::LandingLedger(const Plan* plan, std::string owner)
    : plan_(plan), owner_(std::move(owner)), slot_(plan->buckets.size(), -1), landed_(plan->buckets.size(), 0) {}

void LandingLedger::begin(std::uint64_t version, bool direct) {
  version_ = version;
  active_ = true;
  std::fill(slot_.begin(), slot_.end(), direct ? 0 : -1);
  std::fill(landed_.begin(), landed_.end(), 0);
  landed_count_ = 0;
}

std::uint64_t LandingLedger::owed_by(std::size_t i) const {
  for (std::uint64_t j = i; j < buckets(); j += links_.size()) {
    if (!landed_[j]) return j;
  }
  return buckets();
}

Status LandingLedger::check_version(std::size_t i, FrameType type, std::uint64_t version) const {
  if (!active_) {
    return DataLoss(owner_ + ": " + links_[i] + " sent " + frame_type_name(type) + " of version " +
                    std::to_string(version) + " outside a refit (after refit " + std::to_string(version_) + " ended)");
  }
  if (version != version_) {
    return DataLoss(owner_ + ": " + links_[i] + " sent " + frame_type_name(type) + " of version " +
                    std::to_string(version) + " during refit " + std::to_string(version_) +
                    (version < version_ ? " (a stale frame of an older refit)" : " (a frame of a newer refit)"));
  }
  return Status::Ok();
}

StatusOr<std::uint64_t> LandingLedger::land(std::size_t i, const FrameHeader& h) {
  if (h.type != FrameType::kLanded) {
    return DataLoss(owner_ + ": unexpected " + frame_type_name(h.type) + " from " + links_[i] + " on the data plane");
  }
  auto decoded = decode_landed(h, links_[i]);
  if (!decoded.ok()) return DataLoss(owner_ + ": " + decoded.status().message());
  const LandedFrame& f = *decoded;
  RETURN_IF_ERROR(check_version(i, h.type, f.version));
  const std::string who = owner_ + ": " + links_[i] + " sent kLanded for bucket " + std::to_string(f.bucket);
  if (f.bucket >= buckets()) return DataLoss(who + ", but the plan has " + std::to_string(buckets()) + " buckets");
  if (feeder(f.bucket) != i) return DataLoss(who + ", which is fed by " + links_[feeder(f.bucket)]);
  const int granted = slot_[f.bucket];
  if (granted < 0) return DataLoss(who + " (slot " + std::to_string(f.slot) + ") before any slot was granted to it");
  if (f.slot != static_cast<std::uint64_t>(granted)) {
    return DataLoss(who + " in slot " + std::to_string(f.slot) + ", but slot " + std::to_string(granted) +
                    " was granted to it");
  }
  if (landed_[f.bucket]) return DataLoss(who + " twice");
  if (f.bytes != plan_->buckets[f.bucket].bytes) {
    return DataLoss(who + " with " + std::to_string(f.bytes) + " bytes; the plan's bucket holds " +
                    std::to_string(plan_->buckets[f.bucket].bytes));
  }
  landed_[f.bucket] = 1;
  ++landed_count_;
  return f.bucket;
}

Status LandingLedger::check_data(std::size_t i, const FrameHeader& h, std::uint64_t slot_bytes) const {
  auto data = decode_data(h, links_[i]);
  if (!data.ok()) return DataLoss(owner_ + ": " + data.status().message());
  RETURN_IF_ERROR(check_version(i, h.type, data->version));
  for (std::uint64_t j = i; j < buckets(); j += links_.size()) {
    if (!landed_[j] && slot_[j] >= 0 && static_cast<std::uint64_t>(slot_[j]) == data->slot) {
      if (data->offset > slot_bytes || data->payload_bytes > slot_bytes - data->offset) {
        return DataLoss(owner_ + ": " + links_[i] + " sent kData of " + std::to_string(data->payload_bytes) +
                        " bytes at offset " + std::to_string(data->offset) + " into slot " +
                        std::to_string(data->slot) + " of " + std::to_string(slot_bytes) + " bytes");
      }
      return Status::Ok();
    }
  }
  return DataLoss(owner_ + ": " + links_[i] + " sent kData for slot " + std::to_string(data->slot) +
                  ", which is not granted to any pending bucket it feeds");
}

}  // namespace refit
