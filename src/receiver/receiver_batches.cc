// The receiver's consumer side of a staged refit (receiver_impl.h): next()
// waits for the next bucket in stream order, reassembles the chunks of
// tensors that span buckets, and yields the tensors the bucket completes as
// one batch. Hot path: a MoE bucket completes thousands of tensors, so
// nothing here allocates or searches per tensor.
#include "receiver/receiver_impl.h"

#include "delta/word_delta.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace refit {

StatusOr<std::optional<Batch>> Receiver::Impl::next(Deadline deadline) {
  const Clock::time_point entered = Clock::now();
  std::uint64_t v = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!fatal.ok()) return fatal;
    if (!started) return FailedPrecondition(options.name + ": next() called before start()");
    if (direct) return FailedPrecondition(options.name + ": next() on a direct-mode receiver (no batches: wait_all_landed)");
    if (!error.ok()) return error;
    v = ledger.version();
  }
  if (ended) return std::optional<Batch>();
  const std::uint64_t n = sequence;  // the batch asked for
  RETURN_IF_ERROR(release_before(n, deadline));
  RETURN_IF_ERROR(grant_and_send(v, deadline));

  while (next_bucket < plan->buckets.size()) {
    ASSIGN_OR_RETURN(LandedBucket landed, await_bucket(next_bucket, v, entered, deadline));
    ASSIGN_OR_RETURN(std::optional<Batch> batch, take_bucket(landed));
    if (batch.has_value()) return batch;  // else the bucket completed no tensor: on to the next
  }

  ended = true;
  {
    std::lock_guard<std::mutex> lock(mu);
    ledger.end();
  }
  return std::optional<Batch>();
}

// Waits until the ledger records bucket j landed; returns it with its slot.
StatusOr<Receiver::Impl::LandedBucket> Receiver::Impl::await_bucket(std::uint64_t j, std::uint64_t v,
                                                                    Clock::time_point entered, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu);
  auto ready = [&] { return ledger.landed(j) || !error.ok() || !fatal.ok(); };
  if (deadline.is_never()) {
    cv.wait(lock, ready);
  } else if (!cv.wait_until(lock, deadline.at(), ready)) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - entered).count();
    return DeadlineExceeded(options.name + " timed out after " + std::to_string(waited) + " ms waiting for bucket " +
                            std::to_string(j) + " of " + std::to_string(plan->buckets.size()) + " from " +
                            feeders_of(j) + " (refit " + std::to_string(v) + ")");
  }
  if (!fatal.ok()) return fatal;
  if (!error.ok()) return error;
  return LandedBucket{j, ledger.slot_of(j), v, deadline};
}

// Bucket b landed in its slot; it is the consumer's until released. Its
// bytes may still be on their way (cuda_ipc announces a bucket before its
// pack finished): this waits for them before the slot is read or handed out;
// what needs only the plan is done meanwhile. Waits once per bucket.
Status Receiver::Impl::wait_in_place(LandedBucket& b) {
  if (b.in_place) return Status::Ok();
  auto interrupted = [this]() -> Status {
    std::lock_guard<std::mutex> lock(mu);
    return !fatal.ok() ? fatal : error;
  };
  RETURN_IF_ERROR(pool->wait_landed(b.slot, b.deadline, interrupted)
                      .WithContext(options.name + ": bucket " + std::to_string(b.index) + " from " +
                                   feeders_of(b.index) + " (refit " + std::to_string(b.version) + ")"));
  b.in_place = true;
  return Status::Ok();
}

// Delta refits: bucket b's slot holds its encoding at [0, encoded_bytes).
// The encoding goes aside, the engine's committed bytes of every entry go
// where the entry lies in the slot (every stream byte is in one bucket, so
// no apply of this refit has touched them yet), and the encoding is decoded
// over them in place: the slot then holds the bucket as a raw one would.
Status Receiver::Impl::decode_in_slot(LandedBucket& b, std::uint64_t encoded_bytes) {
  const Bucket& bucket = plan->buckets[b.index];
  std::byte* slot = pool->slot(b.slot);
  const std::string where = options.name + ": delta-encoded bucket " + std::to_string(b.index) + " from " +
                            feeders_of(b.index) + " (refit " + std::to_string(b.version) + ", base " +
                            std::to_string(delta_base) + ")";
  if (on_device()) return decode_on_device(bucket, slot, encoded_bytes, where);
  delta_scratch.assign(slot, slot + encoded_bytes);
  RETURN_IF_ERROR(gather_committed(bucket, slot, where));
  const std::span<std::byte> bytes(slot, bucket.bytes);
  Status decoded = decode_delta(delta_scratch, bytes, delta_base, bytes);
  if (!decoded.ok()) return DataLoss(where + ": " + decoded.message());
  return Status::Ok();
}

// Every entry's committed bytes where the entry lies in the slot, in one
// call (device weights: one batched copy, not one wait per entry).
Status Receiver::Impl::gather_committed(const Bucket& bucket, std::byte* slot, const std::string& where) {
  committed_reads.clear();
  for (const PlanEntry& e : bucket.entries) {
    if (e.bytes == 0) continue;
    committed_reads.push_back({e.tensor, e.tensor_offset, std::span<std::byte>(slot + e.bucket_offset, e.bytes)});
  }
  return committed(committed_reads).WithContext(where + ", reading the committed bytes of its " +
                                                std::to_string(committed_reads.size()) + " entries");
}

// The encoding is copied aside on the device, the committed bytes (device
// weights: device copies) gathered into the slot, and the codec decodes over
// them in place on the default stream, waited for before the slot is read.
Status Receiver::Impl::decode_on_device(const Bucket& bucket, std::byte* slot, std::uint64_t encoded_bytes,
                                        const std::string& where) {
  if (!device_codec) {
    ASSIGN_OR_RETURN(DeviceDeltaCodec codec, DeviceDeltaCodec::Create(pool->device(), pool->slot_bytes()));
    device_codec = std::make_unique<DeviceDeltaCodec>(std::move(codec));
    ASSIGN_OR_RETURN(device_delta_scratch, DeviceBuffer::Allocate(pool->device(), pool->slot_bytes()));
  }
  RETURN_IF_ERROR(copy_device_to_device(device_delta_scratch.data(), slot, encoded_bytes).WithContext(where));
  RETURN_IF_ERROR(gather_committed(bucket, slot, where));
  Status decoded = device_codec->decode(device_delta_scratch.data(), encoded_bytes, slot, delta_base, slot,
                                        bucket.bytes, nullptr);
  if (!decoded.ok()) return DataLoss(where + ": " + decoded.message());
  return synchronize_device(pool->device()).WithContext(where);
}

// Turns landed bucket b into the next batch (yielded: credits sent, what it
// holds recorded), or into nothing when it completes no tensor (its slot is
// released and granted on).
StatusOr<std::optional<Batch>> Receiver::Impl::take_bucket(LandedBucket& b) {
  const std::uint64_t j = b.index;
  const int slot = b.slot;
  const Bucket& bucket = plan->buckets[j];
  std::uint64_t encoded = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    encoded = ledger.encoded_bytes(j);
  }
  if (encoded != 0) {
    RETURN_IF_ERROR(wait_in_place(b));
    RETURN_IF_ERROR(decode_in_slot(b, encoded));
  }
  if (tap != nullptr) {  // relays: forwarded while this rank applies it, the slot held until then
    RETURN_IF_ERROR(wait_in_place(b));
    TappedBucket tapped{b.version, j, pool->slot(slot), bucket.bytes, {}, 0};
    if (encoded != 0 && !on_device()) {  // decode_in_slot kept the encoding aside (a device pool's relays raw)
      tapped.encoding = std::span<const std::byte>(delta_scratch.data(), encoded);
      tapped.base = delta_base;
    }
    RETURN_IF_ERROR(tap->landed(tapped));
    slot_bucket[static_cast<std::size_t>(slot)] = static_cast<std::int64_t>(j);
  }
  // A bucket of whole tensors yields the same views each time it lands in
  // the same slot: they are built once, then copied (a MoE bucket has
  // thousands; building them touches every tensor's spec).
  const std::size_t cached_at = j * static_cast<std::size_t>(pool->slots()) + static_cast<std::size_t>(slot);
  if (cached_at < whole_views.size() && !whole_views[cached_at].empty()) {
    ++next_bucket;
    Batch batch;
    batch.bucket = j;
    batch.tensors = whole_views[cached_at];
    RETURN_IF_ERROR(wait_in_place(b));
    return yield(std::move(batch), slot, {}, b.version, b.deadline);
  }
  BucketParts parts;
  RETURN_IF_ERROR(gather(b, parts));
  ++next_bucket;

  if (bucket.completes.empty() || !parts.slot_referenced) {  // copied out
    RETURN_IF_ERROR(wait_in_place(b));  // (waited already, unless the bucket holds no bytes)
    RETURN_IF_ERROR(release_slot(slot, b.deadline));
  }
  if (bucket.completes.empty()) {
    RETURN_IF_ERROR(grant_and_send(b.version, b.deadline));
    return std::optional<Batch>();
  }

  Batch batch;
  batch.bucket = j;
  RETURN_IF_ERROR(views_of_completed(j, parts, batch.tensors));
  if (parts.slot_referenced && parts.buffers_used.empty() && batch.tensors.size() == bucket.entries.size()) {
    if (whole_views.size() <= cached_at) whole_views.resize(cached_at + 1);
    whole_views[cached_at] = batch.tensors;
  }
  RETURN_IF_ERROR(wait_in_place(b));
  return yield(std::move(batch), parts.slot_referenced ? slot : -1, std::move(parts.buffers_used), b.version,
               b.deadline);
}

// Walks bucket b's entries: a whole tensor is read in the slot, a chunk is
// copied into its tensor's reassembly buffer.
Status Receiver::Impl::gather(LandedBucket& b, BucketParts& parts) {
  const Bucket& bucket = plan->buckets[b.index];
  std::byte* base = pool->slot(b.slot);
  parts.done.reserve(bucket.entries.size());
  for (const PlanEntry& e : bucket.entries) {
    if (!e.is_chunk(plan->specs[e.tensor])) {
      parts.done.emplace_back(e.tensor, base + e.bucket_offset);
      parts.slot_referenced = true;
      continue;
    }
    RETURN_IF_ERROR(reassemble(b, e, base, parts));
  }
  return Status::Ok();
}

// Copies chunk `e` of bucket b (its slot at `base`) into its tensor's
// reassembly buffer: the first chunk takes the next buffer (two, used
// alternately), the last one completes the tensor.
Status Receiver::Impl::reassemble(LandedBucket& b, const PlanEntry& e, std::byte* base, BucketParts& parts) {
  const std::uint64_t j = b.index;
  const TensorSpec& spec = plan->specs[e.tensor];
  if (e.tensor_offset == 0) {
    const int buf = next_buffer;
    if (buffer_busy[buf]) {
      return Internal(options.name + ": reassembly buffer " + std::to_string(buf) + " is still held when tensor '" +
                      spec.name + "' starts in bucket " + std::to_string(j));
    }
    buffer_busy[buf] = true;
    buffer_used[buf] = spec.nbytes();
    next_buffer = 1 - buf;
    chunk_tensor = e.tensor;
    chunk_buffer = buf;
  } else if (chunk_tensor != static_cast<std::int64_t>(e.tensor)) {
    return Internal(options.name + ": bucket " + std::to_string(j) + " continues tensor '" + spec.name +
                    "' that was never started");
  }
  RETURN_IF_ERROR(wait_in_place(b));
  RETURN_IF_ERROR(copy_bytes(buffer(chunk_buffer) + e.tensor_offset, base + e.bucket_offset, e.bytes)
                      .WithContext(options.name + ": reassembling '" + spec.name + "' from bucket " +
                                   std::to_string(j)));
  if (e.tensor_offset + e.bytes == spec.nbytes()) {
    parts.done.emplace_back(e.tensor, buffer(chunk_buffer));
    parts.buffers_used.push_back(chunk_buffer);
    chunk_tensor = -1;
    chunk_buffer = -1;
  }
  return Status::Ok();
}

// The views of the tensors bucket j completes, in `completes` order, read
// from what the walk found (parts.done may be sorted here).
Status Receiver::Impl::views_of_completed(std::uint64_t j, BucketParts& parts, std::vector<TensorView>& out) const {
  const Bucket& bucket = plan->buckets[j];
  auto& done = parts.done;
  out.reserve(bucket.completes.size());
  // One walk over both lists, both in tensor order (a MoE bucket completes
  // thousands of tensors: a search per tensor made this quadratic, then
  // n log n). `completes` is in stream order, which is tensor order;
  // entries come in layout order, which is usually tensor order too.
  const auto by_tensor = [](const auto& a, const auto& b) { return a.first < b.first; };
  if (!std::is_sorted(done.begin(), done.end(), by_tensor)) std::sort(done.begin(), done.end(), by_tensor);
  auto it = done.begin();
  for (std::uint32_t t : bucket.completes) {
    if (it != done.end() && it->first > t) {  // `completes` out of order: search from the start
      it = std::lower_bound(done.begin(), done.end(), std::pair<std::uint32_t, std::byte*>{t, nullptr}, by_tensor);
    }
    while (it != done.end() && it->first < t) ++it;
    if (it == done.end() || it->first != t) {
      return Internal(options.name + ": bucket " + std::to_string(j) + " lists tensor '" + plan->specs[t].name +
                      "' as completed but holds none of its last bytes");
    }
    out.push_back(TensorView{&plan->specs[t], it->second, pool->memory(), pool->device()});
  }
  return Status::Ok();
}

}  // namespace refit
