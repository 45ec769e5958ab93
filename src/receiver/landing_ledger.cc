// LandingLedger: see landing_ledger.h.
#include "receiver/landing_ledger.h"

#include <algorithm>

#include "delta/word_delta.h"

namespace refit {

BucketFeeders round_robin_feeders(const Plan& plan, std::size_t links) {
  BucketFeeders feeders(plan.buckets.size());
  for (std::size_t j = 0; j < feeders.size(); ++j) feeders[j].push_back({j % links, plan.buckets[j].bytes});
  return feeders;
}

LandingLedger::LandingLedger(const Plan* plan, std::string owner)
    : plan_(plan),
      owner_(std::move(owner)),
      encoded_(plan->buckets.size(), 0),
      slot_(plan->buckets.size(), -1),
      owed_(plan->buckets.size(), 0) {}

void LandingLedger::set_links(std::vector<std::string> names, BucketFeeders feeders) {
  links_ = std::move(names);
  feeders_ = std::move(feeders);
  encoded_.assign(feeders_.size(), 0);  // the plan may have changed (a partial refit's, Receiver::replan)
  slot_.assign(feeders_.size(), -1);
  owed_.assign(feeders_.size(), 0);
  part_landed_.assign(feeders_.size(), {});
  for (std::size_t j = 0; j < feeders_.size(); ++j) part_landed_[j].assign(feeders_[j].size(), 0);
}

std::string LandingLedger::feeders_of(std::uint64_t bucket) const {
  const std::vector<BucketContributor>& parts = feeders_[bucket];
  if (parts.empty()) return "no trainer link";
  std::string out = links_[parts[0].link];
  for (std::size_t k = 1; k < parts.size(); ++k) out += (k + 1 == parts.size() ? " and " : ", ") + links_[parts[k].link];
  return out;
}

void LandingLedger::begin(std::uint64_t version, bool direct, std::uint64_t delta_base) {
  version_ = version;
  active_ = true;
  delta_base_ = delta_base;
  std::fill(encoded_.begin(), encoded_.end(), 0);
  std::fill(slot_.begin(), slot_.end(), direct ? 0 : -1);
  landed_count_ = 0;
  for (std::size_t j = 0; j < feeders_.size(); ++j) {
    std::fill(part_landed_[j].begin(), part_landed_[j].end(), 0);
    owed_[j] = feeders_[j].size();
    if (owed_[j] == 0) ++landed_count_;  // nothing to write
  }
}

int LandingLedger::part_of(std::uint64_t j, std::size_t i) const {
  const std::vector<BucketContributor>& parts = feeders_[j];
  for (std::size_t k = 0; k < parts.size(); ++k) {
    if (parts[k].link == i) return static_cast<int>(k);
  }
  return -1;
}

std::uint64_t LandingLedger::owed_by(std::size_t i) const {
  for (std::uint64_t j = 0; j < buckets(); ++j) {
    const int k = part_of(j, i);
    if (k >= 0 && !part_landed_[j][static_cast<std::size_t>(k)]) return j;
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

StatusOr<LandingLedger::Landing> LandingLedger::land(std::size_t i, const FrameHeader& h) {
  if (h.type != FrameType::kLanded) {
    return DataLoss(owner_ + ": unexpected " + frame_type_name(h.type) + " from " + links_[i] + " on the data plane");
  }
  auto decoded = decode_landed(h, links_[i]);
  if (!decoded.ok()) return DataLoss(owner_ + ": " + decoded.status().message());
  const LandedFrame& f = *decoded;
  RETURN_IF_ERROR(check_version(i, h.type, f.version));
  const std::string who = owner_ + ": " + links_[i] + " sent kLanded for bucket " + std::to_string(f.bucket);
  if (f.bucket >= buckets()) return DataLoss(who + ", but the plan has " + std::to_string(buckets()) + " buckets");
  const int k = part_of(f.bucket, i);
  if (k < 0) return DataLoss(who + ", which is fed by " + feeders_of(f.bucket));
  const int granted = slot_[f.bucket];
  if (granted < 0) return DataLoss(who + " (slot " + std::to_string(f.slot) + ") before any slot was granted to it");
  if (f.slot != static_cast<std::uint64_t>(granted)) {
    return DataLoss(who + " in slot " + std::to_string(f.slot) + ", but slot " + std::to_string(granted) +
                    " was granted to it");
  }
  const auto part = static_cast<std::size_t>(k);
  if (part_landed_[f.bucket][part]) return DataLoss(who + " twice");
  RETURN_IF_ERROR(check_bytes(f, part, who));
  part_landed_[f.bucket][part] = 1;
  if (f.encoded) encoded_[f.bucket] = f.bytes;
  const bool complete = --owed_[f.bucket] == 0;
  if (complete) ++landed_count_;
  return Landing{f.bucket, complete, f.bytes, f.encoded};
}

Status LandingLedger::check_bytes(const LandedFrame& f, std::size_t part, const std::string& who) const {
  const std::uint64_t expected = feeders_[f.bucket][part].bytes;
  const bool whole = feeders_[f.bucket].size() == 1;
  if (f.encoded) {
    if (delta_base_ == 0) {
      return DataLoss(who + " delta-encoded, but no base was offered in refit " + std::to_string(version_));
    }
    if (!whole) return DataLoss(who + " delta-encoded, but the bucket is written in parts");
    if (f.bytes < kDeltaHeaderBytes || f.bytes >= expected) {
      return DataLoss(who + " delta-encoded in " + std::to_string(f.bytes) + " bytes; an encoding takes " +
                      std::to_string(kDeltaHeaderBytes) + " to " + std::to_string(expected) +
                      " bytes (fewer than the bucket's)");
    }
    return Status::Ok();
  }
  if (f.bytes != expected) {
    return DataLoss(who + " with " + std::to_string(f.bytes) + " bytes; " +
                    (whole ? "the plan's bucket holds " : "its part of the bucket holds ") + std::to_string(expected));
  }
  return Status::Ok();
}

Status LandingLedger::check_data(std::size_t i, const FrameHeader& h, std::uint64_t slot_bytes) const {
  auto data = decode_data(h, links_[i]);
  if (!data.ok()) return DataLoss(owner_ + ": " + data.status().message());
  RETURN_IF_ERROR(check_version(i, h.type, data->version));
  for (std::uint64_t j = 0; j < buckets(); ++j) {
    const int k = part_of(j, i);
    if (k < 0 || part_landed_[j][static_cast<std::size_t>(k)]) continue;
    if (slot_[j] >= 0 && static_cast<std::uint64_t>(slot_[j]) == data->slot) {
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
