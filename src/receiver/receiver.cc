// Receiver: the engine rank's end of the data plane (receiver.h).
//
// Two threads touch a receiver:
//   * the consumer (start, next, attach_link) owns the pool bookkeeping: which
//     slot holds which batch, the reassembly buffers, and it sends every
//     kCredit;
//   * one I/O thread reads every link with poll(2), lands kData payloads
//     through the pool, validates kLanded frames and records them.
// They share only `Impl::Shared`, under one mutex; a condition variable wakes
// the consumer when a bucket lands, an error arrives or cancel() is called.
#include "receiver/receiver.h"

#include "cuda/device.h"
#include "net/poll_wait.h"
#include "refit/log.h"
#include "net/frames.h"
#include "receiver/landing_ledger.h"
#include "cuda/device.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

namespace refit {
namespace {

using Clock = std::chrono::steady_clock;

// A credit to send: consumer-side, sent outside the lock.
struct Grant {
  std::size_t link = 0;
  std::uint64_t bucket = 0;
  int slot = 0;
};

}  // namespace

struct Receiver::Impl {
  Impl(const Plan* p, int r, TargetMemory* pl, ReceiverOptions o, bool d)
      : plan(p), rank(r), pool(pl), options(std::move(o)), direct(d), ledger(p, options.name) {}

  const Plan* plan;
  int rank;
  TargetMemory* pool;
  ReceiverOptions options;
  // Direct mode (CreateDirect): `pool` is the engine's exposed weights, one
  // slot; no credits, no batches: the consumer waits for every bucket.
  const bool direct;

  // Fixed once the I/O thread runs (attach_link is refused after start()).
  std::vector<std::unique_ptr<Link>> links;
  int wake_fd = -1;
  std::thread io;

  // ------------------------------------------------ shared, under `mu`
  mutable std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  bool io_started = false;
  Status fatal;             // cancel() or misuse: every later call fails with it
  Status error;             // the current refit failed (first error wins)
  Status stray;             // a frame arrived between refits; reported by start()
  // The refit in progress (active between start() and the end of the
  // stream): grants, landings, and the validator of every frame.
  LandingLedger ledger;
  std::vector<std::string> closed;  // non-empty: why link i is gone
  ReceiverStats stats;

  // ------------------------------------------------ consumer thread only
  bool started = false;
  bool ended = false;
  std::deque<int> free_slots;
  std::uint64_t next_grant = 0;   // first bucket without a slot
  std::uint64_t next_bucket = 0;  // next bucket to turn into a batch
  std::uint64_t sequence = 0;     // next batch's sequence
  // Reassembly: two buffers of plan->largest_chunked_tensor bytes, used
  // alternately per chunked tensor.
  // Host memory for host pools, device memory (on the pool's device) for
  // device pools; buffer(b) gives the address either way.
  std::unique_ptr<std::byte[]> buffers[2];
  DeviceBuffer device_buffers[2];
  std::byte* buffer(int b) { return device_buffers[b].data() != nullptr ? device_buffers[b].data() : buffers[b].get(); }
  bool on_device() const { return pool->memory() == MemoryKind::kCuda; }
  // Copies within the pool's memory (host memcpy, or a synchronous device copy).
  Status copy_bytes(std::byte* dst, const std::byte* src, std::uint64_t n) {
    if (n == 0) return Status::Ok();
    if (on_device()) return copy_device_to_device(dst, src, n);
    std::memcpy(dst, src, n);
    return Status::Ok();
  }
  bool buffer_busy[2] = {false, false};
  std::uint64_t buffer_used[2] = {0, 0};
  int next_buffer = 0;
  std::int64_t chunk_tensor = -1;  // the tensor being reassembled
  int chunk_buffer = -1;
  // What each yielded batch still references (DESIGN.md rule 3).
  struct Held {
    std::uint64_t sequence = 0;
    int slot = -1;
    std::vector<int> buffers;
  };
  std::deque<Held> held;
  // Views of buckets of whole tensors, by bucket * slots + slot; empty until
  // built (the plan and the pool do not change while this receiver lives).
  std::vector<std::vector<TensorView>> whole_views;

  // Numbers `batch`, records what it holds (a slot, or -1; reassembly
  // buffers), grants what is free and hands it to the consumer.
  StatusOr<std::optional<Batch>> yield(Batch batch, int slot, std::vector<int> buffers, std::uint64_t v,
                                       Deadline deadline) {
    batch.sequence = sequence++;
    held.push_back(Held{batch.sequence, slot, std::move(buffers)});
    {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.batches;
      stats.tensors += batch.tensors.size();
    }
    RETURN_IF_ERROR(grant_and_send(v, deadline));
    return std::optional<Batch>(std::move(batch));
  }

  // ------------------------------------------------ helpers
  std::string link_name(std::size_t i) const {
    return "trainer link " + std::to_string(i) + " (" + links[i]->peer() + ")";
  }
  std::size_t feeder(std::uint64_t bucket) const { return static_cast<std::size_t>(bucket % links.size()); }
  // The largest payload a frame may carry: a bucket's bytes (staged), an
  // in-band announcement (direct: transport.h).
  std::uint64_t max_payload() const { return direct ? kMaxAnnouncementBytes : pool->slot_bytes(); }

  // REQUIRES: mu held.
  void fail_locked(Status s) {
    if (error.ok()) error = std::move(s);
    cv.notify_all();
  }
  void wake() {
    if (wake_fd < 0) return;
    std::uint64_t one = 1;
    ssize_t rc = ::write(wake_fd, &one, sizeof one);
    (void)rc;  // eventfd counter overflow is impossible at this rate
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    wake();
    for (auto& l : links) l->shutdown();  // wakes a read blocked mid-frame
    if (io.joinable()) io.join();
    if (wake_fd >= 0) ::close(wake_fd);
    wake_fd = -1;
  }

  // ------------------------------------------------ I/O thread
  void io_loop();
  void handle_frame(std::size_t i);
  void link_lost(std::size_t i, const Status& why);
  void out_of_protocol(std::size_t i, const FrameHeader& h, Status bad);

  // ------------------------------------------------ consumer
  void poison(std::byte* p, std::uint64_t n) const {
    if (!options.poison_recycled || n == 0) return;
    if (on_device()) {
      // Poisoning is a debug aid: a failure to poison must not pass silently.
      Status st = device_memset(p, kPoisonByte, n);
      if (!st.ok()) log(LogLevel::kError, options.name, "poisoning a recycled device buffer failed: " + st.ToString());
      return;
    }
    std::memset(p, kPoisonByte, n);
  }
  void release_slot(int slot) {
    poison(pool->slot(slot), pool->slot_bytes());
    free_slots.push_back(slot);
  }
  void release_buffer(int b) {
    poison(buffer(b), buffer_used[b]);
    buffer_busy[b] = false;
    buffer_used[b] = 0;
  }
  // Releases what batches older than `sequence - 1` hold.
  void release_before(std::uint64_t seq) {
    while (!held.empty() && held.front().sequence + 2 <= seq) {
      if (held.front().slot >= 0) release_slot(held.front().slot);
      for (int b : held.front().buffers) release_buffer(b);
      held.pop_front();
    }
  }
  // Grants free slots to the next buckets in order. REQUIRES: mu held.
  std::vector<Grant> grant_locked() {
    std::vector<Grant> out;
    while (!free_slots.empty() && next_grant < plan->buckets.size()) {
      const int s = free_slots.front();
      free_slots.pop_front();
      ledger.grant(next_grant, s);
      out.push_back(Grant{feeder(next_grant), next_grant, s});
      ++next_grant;
    }
    return out;
  }
  Status grant_and_send(std::uint64_t v, Deadline deadline) {
    std::vector<Grant> credits;
    {
      std::lock_guard<std::mutex> lock(mu);
      credits = grant_locked();
    }
    for (const Grant& c : credits) {
      const CreditFrame credit{v, c.bucket, static_cast<std::uint64_t>(c.slot)};
      Status s = links[c.link]->send(encode(credit), {}, deadline);
      if (!s.ok()) {
        s = s.WithContext(options.name + ": granting slot " + std::to_string(c.slot) + " for bucket " +
                          std::to_string(c.bucket) + " to " + link_name(c.link));
        std::lock_guard<std::mutex> lock(mu);
        fail_locked(s);
        return s;
      }
    }
    return Status::Ok();
  }
  StatusOr<std::optional<Batch>> next(Deadline deadline);
  Status start(std::uint64_t v, Deadline deadline);
  Status wait_all_landed(Deadline deadline);
};

// ---------------------------------------------------------------- I/O thread

void Receiver::Impl::io_loop() {
  std::vector<pollfd> fds;
  std::vector<std::size_t> which;
  for (;;) {
    fds.clear();
    which.clear();
    fds.push_back(pollfd{wake_fd, POLLIN, 0});
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping) return;
      for (std::size_t i = 0; i < links.size(); ++i) {
        if (!closed[i].empty()) continue;
        fds.push_back(pollfd{links[i]->fd(), POLLIN, 0});
        which.push_back(i);
      }
    }
    StatusOr<int> ready = poll_wait(fds, Deadline::Never(), "the trainer links");
    if (!ready.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (fatal.ok()) fatal = ready.status().WithContext(options.name);
      cv.notify_all();
      return;
    }
    if (fds[0].revents != 0) {
      std::uint64_t n = 0;
      ssize_t r = ::read(wake_fd, &n, sizeof n);
      (void)r;
      std::lock_guard<std::mutex> lock(mu);
      if (stopping) return;
    }
    for (std::size_t k = 1; k < fds.size(); ++k) {
      if (fds[k].revents != 0) handle_frame(which[k - 1]);
    }
  }
}

void Receiver::Impl::link_lost(std::size_t i, const Status& why) {
  std::lock_guard<std::mutex> lock(mu);
  if (stopping) return;
  closed[i] = why.ToString();
  if (!ledger.active()) return;  // reported by the next start()
  const std::uint64_t owed = ledger.owed_by(i);
  if (owed == plan->buckets.size()) return;  // nothing more expected from it
  fail_locked(Aborted(link_name(i) + " closed while " + options.name + " waited for bucket " +
                      std::to_string(owed) + " of " + std::to_string(plan->buckets.size()) + " of refit " +
                      std::to_string(ledger.version()) + ": " + why.message()));
}

// Every frame a trainer sends is checked by the ledger (landing_ledger.h),
// staged or direct: one validator, one error code.
void Receiver::Impl::handle_frame(std::size_t i) {
  Link& link = *links[i];
  StatusOr<FrameHeader> got = link.recv_header(Deadline::Never(), max_payload());
  if (!got.ok()) {
    link_lost(i, got.status());
    return;
  }
  const FrameHeader& h = *got;
  Status bad;
  switch (h.type) {
    case FrameType::kLanded: {
      std::lock_guard<std::mutex> lock(mu);
      StatusOr<std::uint64_t> bucket = ledger.land(i, h);
      if (bucket.ok()) {
        ++stats.buckets;
        stats.bytes += plan->buckets[*bucket].bytes;
        cv.notify_all();
        return;
      }
      bad = bucket.status();
      break;
    }
    case FrameType::kData: {
      {
        std::lock_guard<std::mutex> lock(mu);
        bad = ledger.check_data(i, h, pool->slot_bytes());
      }
      if (bad.ok()) {
        // The slot is granted to the trainer: the consumer does not touch it.
        // (Direct mode: a write announcement, nccl, received into the weights.)
        Status s = pool->receive_data(link, h, Deadline::Never());
        if (!s.ok()) link_lost(i, s);
        return;
      }
      break;
    }
    case FrameType::kBye:
      link_lost(i, Unavailable(link.peer() + " said goodbye (kBye)"));
      return;
    default: {
      std::lock_guard<std::mutex> lock(mu);
      bad = ledger.land(i, h).status();  // refuses every other type, naming it
      break;
    }
  }
  out_of_protocol(i, h, std::move(bad));
}

// Fails the refit (or the next start) with `bad`, and keeps the stream in
// sync by discarding the frame's payload.
void Receiver::Impl::out_of_protocol(std::size_t i, const FrameHeader& h, Status bad) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (ledger.active()) {
      fail_locked(std::move(bad));
    } else if (stray.ok()) {
      stray = std::move(bad);
    }
  }
  if (h.payload_bytes > 0) {
    Status s = links[i]->skip_payload(h.payload_bytes, Deadline::Never());
    if (!s.ok()) link_lost(i, s);
  }
}

// ---------------------------------------------------------------- consumer

Status Receiver::Impl::start(std::uint64_t v, Deadline deadline) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!fatal.ok()) return fatal;
    if (links.empty()) {
      return FailedPrecondition(options.name + ": start(" + std::to_string(v) +
                                ") with no trainer links attached; attach_link() each feeding trainer first");
    }
    if (!stray.ok()) {
      Status s = std::move(stray);
      stray = Status::Ok();
      return s.WithContext("before refit " + std::to_string(v));
    }
    for (std::size_t i = 0; i < links.size(); ++i) {
      if (!closed[i].empty()) {
        return Aborted(options.name + ": cannot start refit " + std::to_string(v) + ": " + link_name(i) +
                       " is closed (" + closed[i] + ")");
      }
    }
    if (ledger.links() != links.size()) {  // the links are fixed from the first start() on
      std::vector<std::string> names;
      for (std::size_t i = 0; i < links.size(); ++i) names.push_back(link_name(i));
      ledger.set_links(std::move(names));
    }
    ledger.begin(v, direct);
    error = Status::Ok();
    stats = ReceiverStats{};
  }
  // Every batch of the previous refit is dead now.
  release_before(UINT64_MAX);
  free_slots.clear();
  if (!direct) {  // direct mode grants nothing: the ledger granted every bucket slot 0
    for (int s = 0; s < pool->slots(); ++s) free_slots.push_back(s);
  }
  for (int b = 0; b < 2; ++b) {
    if (buffer_busy[b]) release_buffer(b);
  }
  next_buffer = 0;
  chunk_tensor = -1;
  chunk_buffer = -1;
  next_grant = next_bucket = sequence = 0;
  ended = false;
  started = true;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!io_started) {
      io_started = true;
      io = std::thread([this] { io_loop(); });
    }
  }
  return grant_and_send(v, deadline);
}

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
  release_before(n);
  RETURN_IF_ERROR(grant_and_send(v, deadline));

  const std::uint64_t buckets = plan->buckets.size();
  while (next_bucket < buckets) {
    const std::uint64_t j = next_bucket;
    int slot = -1;
    {
      std::unique_lock<std::mutex> lock(mu);
      auto ready = [&] { return ledger.landed(j) || !error.ok() || !fatal.ok(); };
      if (deadline.is_never()) {
        cv.wait(lock, ready);
      } else if (!cv.wait_until(lock, deadline.at(), ready)) {
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - entered).count();
        return DeadlineExceeded(options.name + " timed out after " + std::to_string(waited) +
                                " ms waiting for bucket " + std::to_string(j) + " of " + std::to_string(buckets) +
                                " from " + link_name(feeder(j)) + " (refit " + std::to_string(v) + ")");
      }
      if (!fatal.ok()) return fatal;
      if (!error.ok()) return error;
      slot = ledger.slot_of(j);
    }

    // Bucket j landed in `slot`; it is the consumer's until released. Its
    // bytes may still be on their way (cuda_ipc announces a bucket before
    // its pack finished): wait for them before reading the slot or handing
    // it out; what needs only the plan is done meanwhile.
    const Bucket& bucket = plan->buckets[j];
    bool in_place = false;
    auto wait_in_place = [&]() -> Status {
      if (in_place) return Status::Ok();
      auto interrupted = [this]() -> Status {
        std::lock_guard<std::mutex> lock(mu);
        return !fatal.ok() ? fatal : error;
      };
      RETURN_IF_ERROR(pool->wait_landed(slot, deadline, interrupted)
                          .WithContext(options.name + ": bucket " + std::to_string(j) + " from " +
                                       link_name(feeder(j)) + " (refit " + std::to_string(v) + ")"));
      in_place = true;
      return Status::Ok();
    };
    // A bucket of whole tensors yields the same views each time it lands in
    // the same slot: they are built once, then copied (a MoE bucket has
    // thousands; building them touches every tensor's spec).
    const std::size_t cached_at = j * static_cast<std::size_t>(pool->slots()) + static_cast<std::size_t>(slot);
    if (cached_at < whole_views.size() && !whole_views[cached_at].empty()) {
      ++next_bucket;
      Batch batch;
      batch.bucket = j;
      batch.tensors = whole_views[cached_at];
      RETURN_IF_ERROR(wait_in_place());
      return yield(std::move(batch), slot, {}, v, deadline);
    }
    std::byte* base = pool->slot(slot);
    std::vector<std::pair<std::uint32_t, std::byte*>> done;  // tensor -> bytes
    done.reserve(bucket.entries.size());
    bool slot_referenced = false;
    std::vector<int> buffers_used;
    for (const PlanEntry& e : bucket.entries) {
      const TensorSpec& spec = plan->specs[e.tensor];
      if (!e.is_chunk(spec)) {
        done.emplace_back(e.tensor, base + e.bucket_offset);
        slot_referenced = true;
        continue;
      }
      if (e.tensor_offset == 0) {
        const int b = next_buffer;
        if (buffer_busy[b]) {
          return Internal(options.name + ": reassembly buffer " + std::to_string(b) + " is still held when tensor '" +
                          spec.name + "' starts in bucket " + std::to_string(j));
        }
        buffer_busy[b] = true;
        buffer_used[b] = spec.nbytes();
        next_buffer = 1 - b;
        chunk_tensor = e.tensor;
        chunk_buffer = b;
      } else if (chunk_tensor != static_cast<std::int64_t>(e.tensor)) {
        return Internal(options.name + ": bucket " + std::to_string(j) + " continues tensor '" + spec.name +
                        "' that was never started");
      }
      RETURN_IF_ERROR(wait_in_place());
      RETURN_IF_ERROR(copy_bytes(buffer(chunk_buffer) + e.tensor_offset, base + e.bucket_offset, e.bytes)
                          .WithContext(options.name + ": reassembling '" + spec.name + "' from bucket " +
                                       std::to_string(j)));
      if (e.tensor_offset + e.bytes == spec.nbytes()) {
        done.emplace_back(e.tensor, buffer(chunk_buffer));
        buffers_used.push_back(chunk_buffer);
        chunk_tensor = -1;
        chunk_buffer = -1;
      }
    }
    ++next_bucket;

    if (bucket.completes.empty() || !slot_referenced) {  // copied out
      RETURN_IF_ERROR(wait_in_place());  // (waited already, unless the bucket holds no bytes)
      release_slot(slot);
    }
    if (bucket.completes.empty()) {
      RETURN_IF_ERROR(grant_and_send(v, deadline));
      continue;
    }

    Batch batch;
    batch.bucket = j;
    batch.tensors.reserve(bucket.completes.size());
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
      batch.tensors.push_back(TensorView{&plan->specs[t], it->second, pool->memory(), pool->device()});
    }
    if (slot_referenced && buffers_used.empty() && batch.tensors.size() == bucket.entries.size()) {
      if (whole_views.size() <= cached_at) whole_views.resize(cached_at + 1);
      whole_views[cached_at] = batch.tensors;
    }
    RETURN_IF_ERROR(wait_in_place());
    return yield(std::move(batch), slot_referenced ? slot : -1, std::move(buffers_used), v, deadline);
  }

  ended = true;
  {
    std::lock_guard<std::mutex> lock(mu);
    ledger.end();
  }
  return std::optional<Batch>();
}

Status Receiver::Impl::wait_all_landed(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu);
  if (!fatal.ok()) return fatal;
  if (!started) return FailedPrecondition(options.name + ": wait_all_landed() called before start()");
  if (!direct) return FailedPrecondition(options.name + ": wait_all_landed() on a staged receiver (read its batches)");
  auto ready = [&] { return ledger.landed_count() == ledger.buckets() || !error.ok() || !fatal.ok(); };
  if (deadline.is_never()) {
    cv.wait(lock, ready);
  } else if (!cv.wait_until(lock, deadline.at(), ready)) {
    const std::uint64_t missing = ledger.buckets() - ledger.landed_count();
    std::uint64_t first = 0;
    while (ledger.landed(first)) ++first;
    return DeadlineExceeded(options.name + " timed out waiting for " + std::to_string(missing) + " of " +
                            std::to_string(ledger.buckets()) + " direct buckets (refit " +
                            std::to_string(ledger.version()) + "; the first is bucket " + std::to_string(first) +
                            " from " + link_name(feeder(first)) + ")");
  }
  if (!fatal.ok()) return fatal;
  if (!error.ok()) return error;
  ledger.end();
  return Status::Ok();
}

// ---------------------------------------------------------------- Receiver

StatusOr<std::unique_ptr<Receiver>> Receiver::Create(const Plan* plan, int rank, std::unique_ptr<TargetMemory> pool,
                                                     ReceiverOptions options) {
  if (plan == nullptr) return InvalidArgument(options.name + ": Receiver::Create without a plan");
  if (pool == nullptr) return InvalidArgument(options.name + ": Receiver::Create without a receive pool");
  if (plan->buckets.empty()) {
    return FailedPrecondition(options.name + ": the plan has no buckets (an empty stream is an error)");
  }
  if (pool->slots() < 2) {
    return FailedPrecondition(options.name + ": the receive pool has " + std::to_string(pool->slots()) +
                              " slot(s); slots must be at least 2 (one is filled while the consumer holds another)");
  }
  if (pool->slot_bytes() < plan->bucket_size) {
    return FailedPrecondition(options.name + ": the receive pool's slot_bytes " + std::to_string(pool->slot_bytes()) +
                              " is smaller than the plan's bucket_size " + std::to_string(plan->bucket_size));
  }
  std::unique_ptr<Receiver> r(new Receiver(plan, rank, std::move(pool), std::move(options), /*direct=*/false));
  Impl& impl = *r->impl_;
  if (plan->largest_chunked_tensor > 0) {
    try {
      for (int b = 0; b < 2; ++b) {
        if (impl.on_device()) {
          ASSIGN_OR_RETURN(impl.device_buffers[b],
                           DeviceBuffer::Allocate(impl.pool->device(), plan->largest_chunked_tensor));
        } else {
          impl.buffers[b] = std::make_unique_for_overwrite<std::byte[]>(plan->largest_chunked_tensor);
        }
      }
    } catch (const std::bad_alloc&) {
      return ResourceExhausted(impl.options.name + ": cannot allocate two reassembly buffers of " +
                               std::to_string(plan->largest_chunked_tensor) + " bytes");
    }
  }
  impl.wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl.wake_fd < 0) return ErrnoStatus(impl.options.name + ": eventfd for the receiver's I/O thread", errno);
  return r;
}

StatusOr<std::unique_ptr<Receiver>> Receiver::CreateDirect(const Plan* plan, int rank,
                                                           std::unique_ptr<TargetMemory> weights,
                                                           ReceiverOptions options) {
  if (plan == nullptr) return InvalidArgument(options.name + ": Receiver::CreateDirect without a plan");
  if (weights == nullptr) return InvalidArgument(options.name + ": Receiver::CreateDirect without exposed weights");
  if (plan->buckets.empty()) {
    return FailedPrecondition(options.name + ": the plan has no buckets (an empty stream is an error)");
  }
  std::unique_ptr<Receiver> r(new Receiver(plan, rank, std::move(weights), std::move(options), /*direct=*/true));
  Impl& impl = *r->impl_;
  impl.wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl.wake_fd < 0) return ErrnoStatus(impl.options.name + ": eventfd for the receiver's I/O thread", errno);
  return r;
}

Receiver::Receiver(const Plan* plan, int rank, std::unique_ptr<TargetMemory> pool, ReceiverOptions options,
                   bool direct)
    : plan_(plan), rank_(rank), pool_(std::move(pool)) {
  impl_ = std::make_unique<Impl>(plan, rank, pool_.get(), std::move(options), direct);
}

Receiver::~Receiver() { impl_->stop(); }  // before the pool and links go

std::unique_ptr<TargetMemory> Receiver::release_pool() {
  impl_->stop();
  return std::move(pool_);
}

void Receiver::attach_link(std::unique_ptr<Link> link) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (link == nullptr) {
    if (impl_->fatal.ok()) impl_->fatal = InvalidArgument(impl_->options.name + ": attach_link(nullptr)");
    return;
  }
  if (impl_->io_started) {
    if (impl_->fatal.ok()) {
      impl_->fatal = FailedPrecondition(impl_->options.name + ": attach_link(" + link->peer() +
                                        ") after start(): attach every trainer link before the first refit");
    }
    return;
  }
  impl_->links.push_back(std::move(link));
  impl_->closed.emplace_back();
}

Status Receiver::start(std::uint64_t version, Deadline deadline) { return impl_->start(version, deadline); }

StatusOr<std::optional<Batch>> Receiver::next(Deadline deadline) { return impl_->next(deadline); }

Status Receiver::wait_all_landed(Deadline deadline) { return impl_->wait_all_landed(deadline); }

void Receiver::cancel(Status why) {
  if (why.ok()) why = Aborted(impl_->options.name + ": cancelled");
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->fatal.ok()) impl_->fatal = std::move(why);
  impl_->cv.notify_all();
}

ReceiverStats Receiver::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace refit
