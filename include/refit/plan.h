// The bucket plan: one engine rank's stream cut into transport buckets.
//
// A Plan is a pure function of (specs in stream order, bucket_size)
// (DESIGN.md rule 1). Sender and receiver compute it independently and compare
// digests at setup; a different digest is a setup error, never a transfer
// error mid-refit.
//
// Layout rules, in order:
//   * Tensors are taken in stream order. A tensor that fits in what is left of
//     the open bucket joins it; one that does not closes the bucket.
//   * A tensor larger than bucket_size is cut into chunks of bucket_size
//     bytes; each chunk but the last fills a bucket of its own, the last one
//     opens a bucket that later tensors may join. The receiver reassembles
//     chunks before it yields the tensor.
//   * Inside a bucket, entries are grouped by dtype (groups in order of first
//     appearance, stream order inside a group) and every entry starts at a
//     multiple of kPlanAlignment bytes.
//
// Thread safety: a Plan is immutable after make_plan; share it freely.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "refit/status.h"
#include "refit/tensor.h"

namespace refit {

inline constexpr std::uint64_t kPlanAlignment = 256;
// Smallest bucket_size accepted; bucket_size must also be a multiple of
// kPlanAlignment.
inline constexpr std::uint64_t kMinBucketSize = 4096;

// One piece of one tensor inside one bucket: bytes
// [tensor_offset, tensor_offset + bytes) of tensor `tensor` land at
// [bucket_offset, bucket_offset + bytes) of the bucket.
struct PlanEntry {
  std::uint32_t tensor = 0;          // index into Plan::specs
  std::uint64_t tensor_offset = 0;   // 0 unless this is a later chunk
  std::uint64_t bytes = 0;
  std::uint64_t bucket_offset = 0;   // multiple of kPlanAlignment

  bool is_chunk(const TensorSpec& spec) const { return bytes != spec.nbytes(); }
  friend bool operator==(const PlanEntry&, const PlanEntry&) = default;
};

struct Bucket {
  std::uint64_t bytes = 0;            // bytes used: end of the last entry that holds bytes (0-byte entries add none)
  std::vector<PlanEntry> entries;     // in layout order (grouped by dtype)
  // Indices (into Plan::specs) of the tensors this bucket completes, in stream
  // order: whole tensors it holds, and chunked tensors whose last chunk it
  // holds. Empty for a bucket of middle chunks.
  std::vector<std::uint32_t> completes;
};

struct Plan {
  std::vector<TensorSpec> specs;  // the stream, in order
  std::uint64_t bucket_size = 0;
  std::vector<Bucket> buckets;
  std::uint64_t digest = 0;       // xxh64 of a canonical encoding of all of the above
  std::uint64_t total_bytes = 0;  // sum of specs' nbytes
  std::uint64_t largest_chunked_tensor = 0;  // bytes of the largest tensor cut into chunks; 0 if none

  // Hex form of the digest, 16 digits.
  std::string digest_hex() const;
};

// Builds the plan. Errors (kInvalidArgument, each naming the offending value):
// an empty stream (DESIGN.md rule 11), a bucket_size below kMinBucketSize or
// not a multiple of kPlanAlignment, an invalid spec, a duplicate name.
StatusOr<Plan> make_plan(std::vector<TensorSpec> specs, std::uint64_t bucket_size);

// Parses a byte size such as "4MiB", "1GiB", "512KiB", "4096", "64MB"
// (binary suffixes KiB/MiB/GiB/TiB, decimal KB/MB/GB/TB, plain bytes).
StatusOr<std::uint64_t> parse_byte_size(std::string_view text);
// "1.50 GiB", "256 MiB", "4 KiB", "100 B": an exact multiple of the unit
// prints as an integer, anything else with two decimals.
std::string format_bytes(std::uint64_t bytes);

}  // namespace refit
