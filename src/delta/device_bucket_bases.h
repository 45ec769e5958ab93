// DeviceBucketBases: what a trainer rank whose weights are on a GPU diffs
// its buckets against (issue 22, delta refits on the GPU: runtime/senders/
// device_delta_sender.cc). For each bucket it sends, two buffers on its
// device: the base (the bytes of the bucket the engines committed, at
// base_version()) and this refit's bytes, which the pack writes and the
// encoder reads. The commit swaps them for every bucket sent in the
// committed refit; a bucket not sent loses its base (it would be stale). A
// failed refit changes nothing: the next one writes its bytes again. A
// committed partial refit keeps the bases of the buckets it did not touch.
//
// The buffers are allocated on first use and zero-filled once: the pack
// writes only the entries, so the gaps between them stay zero in both and
// never count as changed.
//
// Memory: twice the rank's share of the stream, on its device (the bytes
// of the buckets it sends, each twice); bytes_held() says how much. They
// outlive the sender (a release between refits keeps them).
//
// Thread safety: one thread (the trainer rank's refit thread).
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/device.h"
#include "refit/status.h"

namespace refit {

class DeviceBucketBases {
 public:
  // One entry per bucket of the plan: its bytes (0 for a bucket this rank
  // does not send); the buffers live on `device`.
  DeviceBucketBases(int device, std::vector<std::uint64_t> bucket_bytes);

  std::uint64_t base_version() const { return base_version_; }
  // Bucket j's base on the device, or null when it has none.
  const std::byte* base(std::size_t j) const;
  // Where refit `version` packs bucket j (zero-filled on first use); marks
  // it sent in that refit.
  StatusOr<std::byte*> next(std::size_t j, std::uint64_t version);
  // Refit `version` committed: what each bucket sent in it is its base.
  void commit(std::uint64_t version);
  // A partial refit committed as `version` (sent by another plan, through
  // none of these buffers): each bucket `touched` holds a tensor it moved
  // and loses its base; the others keep theirs, now as part of `version`.
  void commit_partial(std::uint64_t version, const std::vector<bool>& touched);
  std::uint64_t bytes_held() const;

 private:
  int device_;
  std::vector<std::uint64_t> bucket_bytes_;
  std::vector<DeviceBuffer> bases_, next_;
  std::vector<std::uint64_t> sent_in_;  // the refit that last wrote next_[j] (0: none)
  std::vector<bool> has_base_;
  std::uint64_t base_version_ = 0;
};

}  // namespace refit
