// Shared pieces of the bucket senders: see pack.h.
#include "runtime/senders/pack.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "model/shard_copy.h"

namespace refit {
namespace {

// At most this many host threads pack one bucket.
constexpr unsigned kPackThreads = 14;

}  // namespace

std::byte* landing_arena(const SenderContext& c) {
  std::byte* region = c.target->mapped_slot(0);
  return region == nullptr ? nullptr : region + landing_offset(c);
}

std::string bucket_where(const SenderContext& c, std::uint64_t bucket) {
  return c.name + ", bucket " + std::to_string(bucket);
}

namespace {

// A feed run as a copy: rows of `bytes`, src and dst pitched by the strides.
CopyRun feed_copy(const FeedRun& r, const std::byte* src, std::byte* dst) {
  if (r.count == 1) return copy_run_1d(src, dst, r.bytes);
  return CopyRun{src, dst, r.bytes, r.count, r.src_stride, r.dst_stride};
}

}  // namespace

void append_slot_runs(const SenderContext& c, std::uint64_t bucket, std::byte* slot, std::vector<CopyRun>* runs) {
  if (c.feed != nullptr) {
    const BucketShare* share = c.feed->share(bucket, c.feed_rank);
    if (share == nullptr) return;
    for (const FeedRun& r : share->runs) {
      runs->push_back(feed_copy(r, c.source->data(r.src_tensor) + r.src_offset, slot + r.bucket_offset));
    }
    return;
  }
  for (const PlanEntry& e : c.plan->buckets[bucket].entries) {
    append_shard_copy_runs(c.source->model().weights[e.tensor], c.pack_rank, c.engine_ranks, c.source->data(e.tensor),
                           e.tensor_offset, e.bytes, slot + e.bucket_offset, runs);
  }
}

void append_arena_runs(const SenderContext& c, std::uint64_t bucket, std::byte* arena, std::vector<CopyRun>* runs) {
  if (c.feed != nullptr) {
    const BucketShare* share = c.feed->share(bucket, c.feed_rank);
    if (share == nullptr) return;
    for (const FeedRun& r : share->runs) {
      runs->push_back(feed_copy(r, c.source->data(r.src_tensor) + r.src_offset,
                                arena + c.arena_offsets[r.tensor] + r.tensor_offset));
    }
    return;
  }
  for (const PlanEntry& e : c.plan->buckets[bucket].entries) {
    append_shard_copy_runs(c.source->model().weights[e.tensor], c.pack_rank, c.engine_ranks, c.source->data(e.tensor),
                           e.tensor_offset, e.bytes, arena + c.arena_offsets[e.tensor] + e.tensor_offset, runs);
  }
}

StatusOr<HostPacked> pack_on_host(const SenderContext& c, std::uint64_t bucket, int slot,
                                  std::vector<std::byte>& staging, std::vector<CopyRun>& runs) {
  HostPacked packed{c.target->mapped_slot(slot), true};
  if (packed.bytes == nullptr) {
    if (staging.empty()) return Internal(bucket_where(c, bucket) + ": the target maps no slot " + std::to_string(slot));
    packed = HostPacked{staging.data(), false};
  }
  runs.clear();
  append_slot_runs(c, bucket, packed.bytes, &runs);
  copy_runs_on_host(runs);
  return packed;
}

void copy_runs_on_host_parallel(std::span<const CopyRun> runs) {
  std::uint64_t total = 0;
  for (const CopyRun& r : runs) total += r.row_bytes * r.rows;
  // Up to one thread per core but two (the engine's and this rank's own
  // threads), at most kPackThreads, at least 4 MiB each.
  const unsigned cores = std::max(std::thread::hardware_concurrency(), 3u) - 2;
  const unsigned threads = std::min({kPackThreads, cores, static_cast<unsigned>(total / (4u << 20) + 1)});
  if (threads <= 1) {
    copy_runs_on_host(runs);
    return;
  }
  // Split into 1-D pieces of about total / threads bytes each.
  std::vector<std::vector<CopyRun>> parts(threads);
  const std::uint64_t share = total / threads + 1;
  std::uint64_t filled = 0;
  std::size_t part = 0;
  for (const CopyRun& r : runs) {
    for (std::uint64_t row = 0; row < r.rows; ++row) {
      const std::byte* src = r.src + row * r.src_pitch;
      std::byte* dst = r.dst + row * r.dst_pitch;
      std::uint64_t left = r.row_bytes;
      while (left > 0) {
        const std::uint64_t take = std::min(left, share - filled);
        parts[part].push_back(copy_run_1d(src, dst, take));
        src += take;
        dst += take;
        left -= take;
        filled += take;
        if (filled >= share && part + 1 < parts.size()) {
          ++part;
          filled = 0;
        }
      }
    }
  }
  std::vector<std::thread> workers;
  for (unsigned t = 1; t < threads; ++t) workers.emplace_back([&parts, t] { copy_runs_on_host(parts[t]); });
  copy_runs_on_host(parts[0]);
  for (auto& w : workers) w.join();
}

Status wait_written(const SenderContext& c, std::span<const Ticket> tickets, std::uint64_t bucket,
                    Deadline deadline) {
  for (std::size_t i = 0; i < tickets.size(); ++i) {
    for (;;) {
      ASSIGN_OR_RETURN(bool done, c.target->poll(tickets[i]));
      if (done) break;
      if (deadline.expired()) {
        return DeadlineExceeded(c.name + " timed out writing bucket " + std::to_string(bucket) + " to " +
                                c.protocol->peer());
      }
    }
  }
  return Status::Ok();
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> slot_ranges(const SenderContext& c, std::uint64_t bucket) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  if (c.feed == nullptr) {
    out.emplace_back(0, c.plan->buckets[bucket].bytes);
    return out;
  }
  const BucketShare* share = c.feed->share(bucket, c.feed_rank);
  if (share == nullptr) return out;
  for (const FeedRun& r : share->runs) {
    for (std::uint64_t k = 0; k < r.count; ++k) {
      const std::uint64_t begin = r.bucket_offset + k * r.dst_stride;
      if (!out.empty() && out.back().second == begin) {
        out.back().second = begin + r.bytes;
      } else {
        out.emplace_back(begin, begin + r.bytes);
      }
    }
  }
  return out;
}

StatusOr<bool> announce_after_stream(const SenderContext& c, CudaStream& stream, std::uint64_t version,
                                     std::uint64_t bucket, std::uint64_t slot, Deadline deadline,
                                     std::uint64_t encoded_bytes) {
  const std::string where = bucket_where(c, bucket);
  // A bucket several trainer ranks write (a feed: sharded trainers) has one
  // landing event per slot but several writers, and a writer's record would
  // replace another's: each writer waits for its own part instead.
  bool ordered = false;
  if (c.feed == nullptr) {
    ASSIGN_OR_RETURN(ordered, c.target->record_landed(static_cast<int>(slot), stream.handle()));
  }
  if (!ordered) RETURN_IF_ERROR(stream.synchronize().WithContext(where));
  if (encoded_bytes != 0) {
    RETURN_IF_ERROR(c.protocol->send_landed_encoded(version, bucket, slot, encoded_bytes, deadline));
  } else {
    RETURN_IF_ERROR(c.protocol->send_landed(version, bucket, slot, deadline));
  }
  return ordered;
}

void zero_bucket_gaps(const Bucket& bucket, std::byte* slot) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> covered;
  covered.reserve(bucket.entries.size());
  for (const PlanEntry& e : bucket.entries) covered.emplace_back(e.bucket_offset, e.bucket_offset + e.bytes);
  std::sort(covered.begin(), covered.end());
  std::uint64_t at = 0;
  for (const auto& [begin, end] : covered) {
    if (begin > at) std::memset(slot + at, 0, begin - at);
    at = std::max(at, end);
  }
  if (bucket.bytes > at) std::memset(slot + at, 0, bucket.bytes - at);
}

}  // namespace refit
