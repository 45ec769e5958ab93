// A trainer rank's delta bases: see bucket_bases.h.
#include "delta/bucket_bases.h"

#include <string>
#include <utility>

#include "delta/word_delta.h"

namespace refit {

BucketBases::BucketBases(std::vector<std::uint64_t> bucket_bytes)
    : bucket_bytes_(std::move(bucket_bytes)),
      bases_(bucket_bytes_.size()),
      pending_(bucket_bytes_.size()),
      has_pending_(bucket_bytes_.size(), false),
      pending_raw_(bucket_bytes_.size(), false) {}

std::span<const std::byte> BucketBases::base(std::size_t j) const {
  if (j >= bases_.size()) return {};
  return bases_[j];
}

Status BucketBases::check_bucket(std::size_t j) const {
  if (j >= pending_.size()) {
    return InvalidArgument("delta bases: bucket " + std::to_string(j) + " of a plan of " +
                           std::to_string(pending_.size()));
  }
  if (bucket_bytes_[j] == 0) {
    return InvalidArgument("delta bases: bucket " + std::to_string(j) + " is not one this rank sends");
  }
  return Status::Ok();
}

Status BucketBases::set_pending(std::size_t j, std::vector<std::byte> encoded) {
  RETURN_IF_ERROR(check_bucket(j));
  pending_[j] = std::move(encoded);
  has_pending_[j] = true;
  pending_raw_[j] = false;
  return Status::Ok();
}

Status BucketBases::set_pending_raw(std::size_t j, std::span<const std::byte> bytes) {
  RETURN_IF_ERROR(check_bucket(j));
  if (bytes.size() != bucket_bytes_[j]) {
    return InvalidArgument("delta bases: " + std::to_string(bytes.size()) + " raw bytes for bucket " +
                           std::to_string(j) + " of " + std::to_string(bucket_bytes_[j]));
  }
  pending_[j].assign(bytes.begin(), bytes.end());
  has_pending_[j] = true;
  pending_raw_[j] = true;
  return Status::Ok();
}

Status BucketBases::commit(std::uint64_t version) {
  Status first = Status::Ok();
  for (std::size_t j = 0; j < bases_.size(); ++j) {
    if (!has_pending_[j]) {
      bases_[j].clear();  // not sent at `version`: whatever it held is older
      continue;
    }
    std::vector<std::byte>& base = bases_[j];
    if (pending_raw_[j]) {
      base.swap(pending_[j]);
      continue;
    }
    const bool had = base.size() == bucket_bytes_[j];
    if (!had) base.assign(bucket_bytes_[j], std::byte{0});
    // In place: a words encoding over the old base, a full one over anything.
    Status decoded = decode_delta(pending_[j], base, had ? base_version_ : 0, base);
    if (!decoded.ok() && first.ok()) {
      first = decoded.WithContext("delta bases: bucket " + std::to_string(j) + " at the commit of refit " +
                                  std::to_string(version));
    }
  }
  drop_pending();
  if (!first.ok()) {
    clear_bases();
    return first;
  }
  base_version_ = version;
  return Status::Ok();
}

void BucketBases::commit_partial(std::uint64_t version, const std::vector<bool>& touched) {
  drop_pending();
  for (std::size_t j = 0; j < bases_.size(); ++j) {
    if (j >= touched.size() || touched[j]) std::vector<std::byte>().swap(bases_[j]);
  }
  base_version_ = version;
}

void BucketBases::drop_pending() {
  for (std::size_t j = 0; j < pending_.size(); ++j) {
    // A bucket's size in memory is kept for its next raw copy (after a raw
    // commit: the old base); anything else is freed.
    if (pending_[j].capacity() == bucket_bytes_[j]) {
      pending_[j].clear();
    } else {
      std::vector<std::byte>().swap(pending_[j]);
    }
    has_pending_[j] = false;
    pending_raw_[j] = false;
  }
}

void BucketBases::clear_bases() {
  for (auto& base : bases_) std::vector<std::byte>().swap(base);
  base_version_ = 0;
}

std::uint64_t BucketBases::bytes_held() const {
  std::uint64_t bytes = 0;
  for (std::size_t j = 0; j < bases_.size(); ++j) bytes += bases_[j].size() + pending_[j].capacity();
  return bytes;
}

}  // namespace refit
