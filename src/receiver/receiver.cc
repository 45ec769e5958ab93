// Receiver: the engine rank's end of the data plane (receiver.h). This file
// holds its life cycle and the start of each refit; receiver_impl.h its
// state and threads, receiver_io.cc the I/O thread, receiver_batches.cc how
// landed buckets become batches.
#include "receiver/receiver_impl.h"

#include <algorithm>
#include "refit/transfer_defaults.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

namespace refit {

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
      ledger.set_links(std::move(names), feeders.empty() ? round_robin_feeders(*plan, links.size()) : feeders);
    }
    ledger.begin(v, direct, delta_base);
    error = Status::Ok();
    stats = ReceiverStats{};
  }
  // Every batch of the previous refit is dead now, and the tap forwarded
  // every bucket of it (set_tap's contract).
  std::fill(slot_bucket.begin(), slot_bucket.end(), -1);
  RETURN_IF_ERROR(release_before(UINT64_MAX, deadline));
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
                            " from " + feeders_of(first) + ")");
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
  if (pool->slot_bytes() < pool_slot_bytes(*plan)) {
    return FailedPrecondition(options.name + ": the receive pool's slot_bytes " + std::to_string(pool->slot_bytes()) +
                              " is smaller than the plan's largest bucket " + std::to_string(pool_slot_bytes(*plan)));
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

Status Receiver::set_feeders(BucketFeeders feeders) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const std::string name = impl_->options.name;
  if (impl_->io_started) return FailedPrecondition(name + ": set_feeders() after start()");
  if (feeders.size() != plan_->buckets.size()) {
    return InvalidArgument(name + ": feeders for " + std::to_string(feeders.size()) + " buckets, the plan has " +
                           std::to_string(plan_->buckets.size()));
  }
  for (std::size_t j = 0; j < feeders.size(); ++j) {
    std::uint64_t bytes = 0;
    for (std::size_t k = 0; k < feeders[j].size(); ++k) {
      const BucketContributor& c = feeders[j][k];
      if (c.link >= impl_->links.size() || (k > 0 && c.link <= feeders[j][k - 1].link) || c.bytes == 0) {
        return InvalidArgument(name + ": bucket " + std::to_string(j) + "'s feeders must be attached links, " +
                               "ascending, each writing bytes (link " + std::to_string(c.link) + " of " +
                               std::to_string(impl_->links.size()) + ", " + std::to_string(c.bytes) + " bytes)");
      }
      bytes += c.bytes;
    }
    std::uint64_t payload = 0;  // the entries' bytes, without the alignment padding between them
    for (const PlanEntry& e : plan_->buckets[j].entries) payload += e.bytes;
    if (bytes != payload) {
      return InvalidArgument(name + ": bucket " + std::to_string(j) + "'s feeders write " + std::to_string(bytes) +
                             " bytes, its entries hold " + std::to_string(payload));
    }
  }
  impl_->feeders = std::move(feeders);
  return Status::Ok();
}

Status Receiver::start(std::uint64_t version, Deadline deadline) { return impl_->start(version, deadline); }

Status Receiver::replan(const std::function<void()>& change) {
  Impl& impl = *impl_;
  impl.whole_views.clear();  // keyed by bucket: the old plan's
  std::lock_guard<std::mutex> lock(impl.mu);
  if (!impl.feeders.empty()) {
    return FailedPrecondition(impl.options.name + ": a partial refit's plan with sharded trainers' bucket parts");
  }
  impl.ledger.end();
  change();
  if (impl.ledger.links() == 0) return Status::Ok();  // dealt at the first start
  std::vector<std::string> names;
  for (std::size_t i = 0; i < impl.ledger.links(); ++i) names.push_back(impl.ledger.link_name(i));
  impl.ledger.set_links(std::move(names), round_robin_feeders(*plan_, impl.ledger.links()));
  return Status::Ok();
}

Status Receiver::set_delta_base(std::uint64_t base, CommittedBytes committed) {
  if (base != 0 && (impl_->direct || !committed)) {
    return FailedPrecondition(impl_->options.name + ": delta refits decode into staged pools, with the "
                              "engine's committed bytes to read");
  }
  impl_->delta_base = base;
  impl_->committed = std::move(committed);
  return Status::Ok();
}

Status Receiver::set_tap(BucketTap* tap) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->direct) return FailedPrecondition(impl_->options.name + ": relays forward from a staged receive pool");
  // Between refits (the last one's stream read to its end) on the consumer's thread, which alone reads the tap.
  if (impl_->started && !impl_->ended) return FailedPrecondition(impl_->options.name + ": set_tap() during a refit");
  impl_->tap = tap;
  impl_->slot_bucket.assign(static_cast<std::size_t>(impl_->pool->slots()), -1);
  return Status::Ok();
}

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
