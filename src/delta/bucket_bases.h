// BucketBases: what a trainer rank diffs its buckets against (issue 22,
// delta refits: runtime/senders/host_delta_sender.cc). For each bucket it
// sends, the bytes the engines committed (the base, at base_version()), and
// what it sent of the refit in flight: its encoding (delta/word_delta.h,
// header included), or its bytes as they are. The commit turns every
// pending one into its bucket's new base (a words encoding decoded over
// the old base in place, raw bytes swapped in); a failed refit drops them,
// keeping the bases. A committed partial refit keeps the bases of the
// buckets it did not touch, at its version.
//
// Memory: the bases are this rank's share of the stream (the bytes of the
// buckets it sends); the pending ones at most as much again (about 0.1x at
// 1% of bf16 elements changed, 1x when every bucket goes raw): at most
// twice the share. bytes_held() says how much.
//
// Thread safety: one thread (the trainer rank's refit thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "refit/status.h"

namespace refit {

class BucketBases {
 public:
  // One entry per bucket of the plan: its bytes (0 for a bucket this rank
  // does not send).
  explicit BucketBases(std::vector<std::uint64_t> bucket_bytes);

  // The version every base holds (0: none yet).
  std::uint64_t base_version() const { return base_version_; }
  // Bucket j's base, or empty when there is none (never sent, or lost).
  std::span<const std::byte> base(std::size_t j) const;

  // What was sent of bucket j in the refit in flight, as encode_delta wrote
  // it (against base(j) at base_version(), or full). Replaces an earlier one.
  Status set_pending(std::size_t j, std::vector<std::byte> encoded);
  // Bucket j was sent as it is: a copy of `bytes` (its whole size) becomes
  // its base at the commit. Replaces an earlier pending one. The copy goes
  // into the memory of the base the last raw commit replaced, kept for it
  // (no page faults at F = 1, where every bucket goes raw).
  Status set_pending_raw(std::size_t j, std::span<const std::byte> bytes);
  // The refit in flight was committed as `version`: each pending encoding
  // becomes its bucket's base; a bucket sent nothing this refit loses its
  // base (it would be stale). A pending encoding that does not decode
  // clears every base (the next refit sends full bytes) and is returned.
  Status commit(std::uint64_t version);
  // A partial refit was committed as `version` (refit/partial.h: its
  // buckets went as they are, by another plan, through none of these
  // bases): each bucket `touched` holds a tensor it moved and loses its
  // base; every other base holds bytes the engines still serve, now as
  // part of `version`. REQUIRES: touched.size() == the plan's buckets.
  void commit_partial(std::uint64_t version, const std::vector<bool>& touched);
  // The refit in flight failed (or a new one begins): its pending
  // encodings go, the bases stay.
  void drop_pending();
  // Bytes held: bases, pending encodings, and the memory kept for raw ones.
  std::uint64_t bytes_held() const;

 private:
  void clear_bases();
  Status check_bucket(std::size_t j) const;

  std::vector<std::uint64_t> bucket_bytes_;
  std::vector<std::vector<std::byte>> bases_, pending_;
  std::vector<bool> has_pending_, pending_raw_;
  std::uint64_t base_version_ = 0;
};

}  // namespace refit
