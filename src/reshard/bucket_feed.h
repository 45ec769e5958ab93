// BucketFeed: who fills which bytes of each bucket of one engine rank's
// stream, and from where.
//
// An engine rank receives one stream (its local shards in model order, cut
// into buckets by make_plan, plan.h), whoever its trainers are. The transfer
// plan (transfer_plan.h) says which trainer rank sends each byte of that
// stream; the feed crosses it with the bucket plan: for every bucket, the
// trainer ranks that write into it (its contributors), how many bytes each
// writes, and each one's copies, as runs from its own local shards into the
// bucket (staged mode: a pool slot) and into the engine's tensors (direct
// mode: the weight arena). The transfer plan may be mapped
// (mapped_transfer_plan.h): a run then reads a trainer tensor (src_tensor)
// other than the engine tensor it fills (tensor).
//
// Rules it keeps (bucket_feed_test.cc checks each):
//   * Every byte of every bucket entry is written by exactly one contributor;
//     the contributors' bytes add up to the bucket's bytes (its entries,
//     padding excluded).
//   * A contributor reads only bytes inside its local shard of the run's
//     source tensor.
//   * A bucket's contributors are listed by ascending trainer rank, each
//     once, and only with bytes > 0 (a 0-byte bucket has none).
//   * Deterministic: a pure function of (transfer plan, engine rank, plan).
//
// Thread safety: values; the functions are pure.
#pragma once

#include <cstdint>
#include <vector>

#include "refit/plan.h"
#include "refit/status.h"
#include "refit/transfer_plan.h"

namespace refit {

// A strided run of one contributor's copy: for i in 0..count-1, bytes
// [src_offset + i * src_stride, + bytes) of the contributor's local shard of
// trainer tensor `src_tensor` land at [tensor_offset + i * dst_stride,
// + bytes) of the engine rank's local shard of engine tensor `tensor`, which
// the bucket holds at [bucket_offset + i * dst_stride, + bytes). count == 1:
// one contiguous run (strides 0).
struct FeedRun {
  std::uint32_t tensor = 0;  // index into the plan's specs == the transfer plan's engine_tensors
  std::uint64_t src_offset = 0;
  std::uint64_t tensor_offset = 0;  // in the engine rank's local shard
  std::uint64_t bucket_offset = 0;  // in the bucket (a pool slot)
  std::uint64_t bytes = 0;          // of one contiguous piece, > 0
  std::uint64_t count = 1;
  std::uint64_t src_stride = 0;
  std::uint64_t dst_stride = 0;
  // Index into the transfer plan's trainer_tensors: the source's data(i)
  // (weight_source.h). Equal to `tensor` when the plan is not mapped. Last:
  // an initializer of the fields above reads as before, and leaves it 0.
  std::uint32_t src_tensor = 0;

  std::uint64_t total_bytes() const { return bytes * count; }
  friend bool operator==(const FeedRun&, const FeedRun&) = default;
};

// One trainer rank's part of one bucket.
struct BucketShare {
  int trainer_rank = 0;
  std::uint64_t bytes = 0;    // sum of runs' total_bytes(), > 0
  std::vector<FeedRun> runs;  // in the order of the bucket's entries, then of dst offset
  friend bool operator==(const BucketShare&, const BucketShare&) = default;
};

struct BucketFeed {
  int engine_rank = 0;
  // shares[j]: bucket j's contributors, ascending trainer rank.
  std::vector<std::vector<BucketShare>> shares;

  // The trainer ranks that write into any bucket, ascending.
  std::vector<int> trainer_ranks() const;
  // Bucket j's share of `trainer_rank`, or null when it writes nothing there.
  const BucketShare* share(std::uint64_t j, int trainer_rank) const;
};

// Crosses `transfer` with `plan`, the bucket plan of engine rank
// `engine_rank`'s stream. REQUIRES nothing of the caller; errors
// (kInvalidArgument, naming the tensor): engine_rank outside the transfer
// plan's engine ranks; a plan whose specs are not, in order, that engine
// rank's local specs of the transfer plan's engine tensors (name, dtype,
// shape).
StatusOr<BucketFeed> make_bucket_feed(const TransferPlan& transfer, int engine_rank, const Plan& plan);

// Full weights on every trainer rank (no sharded layout): `feed` was made
// from a transfer plan with one trainer rank holding everything (its src
// offsets index the full tensors); deals its buckets round-robin to
// `feeders` (trainer ranks, in feeding order): bucket j is written whole by
// feeders[j % feeders.size()]. REQUIRES: feeders not empty, and every
// bucket of `feed` has at most one share.
BucketFeed deal_whole_buckets(BucketFeed feed, const std::vector<int>& feeders);

}  // namespace refit
