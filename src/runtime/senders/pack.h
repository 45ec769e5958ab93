// What the bucket senders share: describing a bucket's copies, packing on
// the host with several threads, waiting for a transport's writes, and
// announcing a bucket whose copies are queued on a CUDA stream.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cuda/batched_copy.h"
#include "cuda/device.h"
#include "runtime/bucket_sender.h"

namespace refit {

// "trainer rank 2, bucket 7": the context of a bucket's errors.
std::string bucket_where(const SenderContext& c, std::uint64_t bucket);

// Appends the runs that copy bucket `bucket`'s entries (the fed rank's
// shards, cut from the full weights) to `runs`, laid out as in a slot: each
// entry at `slot + entry.bucket_offset`.
void append_slot_runs(const SenderContext& c, std::uint64_t bucket, std::byte* slot, std::vector<CopyRun>* runs);

// The slot ranges [begin, end) this rank writes of `bucket`: the whole
// bucket, or with a feed (a bucket other trainer ranks write parts of too)
// only the ranges its runs fill, merged where they touch. Two-sided and
// remote-write transports submit these ranges only, so that no writer
// overwrites another's part with its staging buffer's bytes.
std::vector<std::pair<std::uint64_t, std::uint64_t>> slot_ranges(const SenderContext& c, std::uint64_t bucket);

// Direct mode: this refit's arena in the engine's mapped region (its start
// plus *c.landing), or null when the region is not mapped.
std::byte* landing_arena(const SenderContext& c);
// The same offset, for senders that address the region remotely.
inline std::uint64_t landing_offset(const SenderContext& c) { return c.landing != nullptr ? *c.landing : 0; }

// The same entries laid out as in the engine's weight arena (direct mode):
// each at `arena + arena_offsets[tensor] + tensor_offset`.
void append_arena_runs(const SenderContext& c, std::uint64_t bucket, std::byte* arena, std::vector<CopyRun>* runs);

// The host senders' pack (host pack, host delta): bucket j's entries
// copied on the host into the target's mapping of `slot` (one-sided
// transports: straight into the engine's pool) or, where it maps none, into
// `staging` (two-sided: the caller has the transport write it). Internal
// error, naming the bucket, when neither exists. `runs` is scratch.
struct HostPacked {
  std::byte* bytes = nullptr;  // the packed bucket
  bool in_slot = false;        // bytes is the mapped slot itself
};
StatusOr<HostPacked> pack_on_host(const SenderContext& c, std::uint64_t bucket, int slot,
                                  std::vector<std::byte>& staging, std::vector<CopyRun>& runs);

// Executes host runs split over a few threads (one thread's memcpy from the
// page cache is several times slower than the host-to-device link).
void copy_runs_on_host_parallel(std::span<const CopyRun> runs);

// Zeroes the bytes of `slot` [0, bucket.bytes) that no entry covers (delta
// refits: the base holds zeros there too, so padding never counts as
// changed, however a reused staging buffer was filled before).
void zero_bucket_gaps(const Bucket& bucket, std::byte* slot);

// Polls `tickets` until every write completed (the transport's completion
// contract: the bytes are in the engine's memory). Past the deadline: fails
// naming `bucket` and the peer; the caller cancels what is left.
Status wait_written(const SenderContext& c, std::span<const Ticket> tickets, std::uint64_t bucket,
                    Deadline deadline);

// After the copies of bucket `bucket` into `slot` were queued on `stream`:
// when the transport orders their end with the engine (cuda_ipc's landing
// event: RemoteTarget::record_landed) announces the bucket at once and
// returns true (the stream must be waited for before the refit's "sent");
// otherwise waits for the stream, announces, and returns false.
// `encoded_bytes` (delta refits): the slot holds the bucket's encoding of
// that many bytes (kLanded says so); 0: its bytes.
StatusOr<bool> announce_after_stream(const SenderContext& c, CudaStream& stream, std::uint64_t version,
                                     std::uint64_t bucket, std::uint64_t slot, Deadline deadline,
                                     std::uint64_t encoded_bytes = 0);

}  // namespace refit
