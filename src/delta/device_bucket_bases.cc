// A GPU trainer rank's delta bases: see device_bucket_bases.h.
#include "delta/device_bucket_bases.h"

#include <string>
#include <utility>

#include "refit/device_memory.h"

namespace refit {

namespace {

// A zero-filled buffer of `bytes` on `device`.
StatusOr<DeviceBuffer> zeroed(int device, std::uint64_t bytes) {
  ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(device, bytes));
  RETURN_IF_ERROR(device_memset(buffer.data(), 0, bytes));
  return buffer;
}

}  // namespace

DeviceBucketBases::DeviceBucketBases(int device, std::vector<std::uint64_t> bucket_bytes)
    : device_(device),
      bucket_bytes_(std::move(bucket_bytes)),
      bases_(bucket_bytes_.size()),
      next_(bucket_bytes_.size()),
      sent_in_(bucket_bytes_.size(), 0),
      has_base_(bucket_bytes_.size(), false) {}

const std::byte* DeviceBucketBases::base(std::size_t j) const {
  if (j >= bases_.size() || !has_base_[j]) return nullptr;
  return bases_[j].data();
}

StatusOr<std::byte*> DeviceBucketBases::next(std::size_t j, std::uint64_t version) {
  if (j >= next_.size() || bucket_bytes_[j] == 0) {
    return InvalidArgument("device delta bases: bucket " + std::to_string(j) + " is not one this rank sends");
  }
  if (next_[j].data() == nullptr) {
    ASSIGN_OR_RETURN(next_[j], zeroed(device_, bucket_bytes_[j]));
    if (bases_[j].data() == nullptr) {
      ASSIGN_OR_RETURN(bases_[j], zeroed(device_, bucket_bytes_[j]));
    }
  }
  sent_in_[j] = version;
  return next_[j].data();
}

void DeviceBucketBases::commit(std::uint64_t version) {
  for (std::size_t j = 0; j < next_.size(); ++j) {
    has_base_[j] = sent_in_[j] == version;
    if (has_base_[j]) std::swap(bases_[j], next_[j]);
  }
  base_version_ = version;
}

void DeviceBucketBases::commit_partial(std::uint64_t version, const std::vector<bool>& touched) {
  for (std::size_t j = 0; j < has_base_.size(); ++j) {
    if (j >= touched.size() || touched[j]) has_base_[j] = false;
  }
  base_version_ = version;
}

std::uint64_t DeviceBucketBases::bytes_held() const {
  std::uint64_t bytes = 0;
  for (std::size_t j = 0; j < next_.size(); ++j) bytes += bases_[j].size() + next_[j].size();
  return bytes;
}

}  // namespace refit
