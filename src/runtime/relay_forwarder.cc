// An engine rank's relay to its children: see relay_forwarder.h.
#include "runtime/relay_forwarder.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "control/auth.h"
#include "cuda/device.h"
#include "net/frames.h"
#include "refit/secret.h"

namespace refit {

struct RelayForwarder::Child {
  EngineTarget target;
  std::string name;  // "engine 1 rank 0"
  std::unique_ptr<Link> link;
  std::unique_ptr<RemoteTarget> remote;
  std::unique_ptr<EngineLinkProtocol> protocol;
  std::thread thread;
  // Under mu_: buckets of this refit it has, bytes written, and whether it
  // is writing one now.
  std::uint64_t done = 0, bytes = 0;
  bool busy = false;
  bool removed = false;  // set_children dropped it: its worker ends
};

RelayForwarder::RelayForwarder(RelaySettings settings, const Plan* plan)
    : settings_(std::move(settings)), plan_(plan) {}

StatusOr<std::unique_ptr<RelayForwarder>> RelayForwarder::Connect(RelaySettings settings, const Plan* plan,
                                                                 const std::vector<EngineTarget>& children,
                                                                 Deadline deadline) {
  std::unique_ptr<RelayForwarder> f(new RelayForwarder(std::move(settings), plan));
  ASSIGN_OR_RETURN(f->transport_, make_transport(f->settings_.transport));
  RETURN_IF_ERROR(f->set_children(children, /*relink_kept=*/false, deadline));
  f->set_up_ = true;
  return f;
}

void RelayForwarder::start_worker(Child& child) {
  child.thread = std::thread([this, c = &child] { work(c); });
}

RelayForwarder::~RelayForwarder() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& child : children_) {
    if (child->link) child->link->shutdown();  // wakes a wait for a credit
  }
  for (auto& child : children_) {
    if (child->thread.joinable()) child->thread.join();
  }
}

// A fresh data link to `child` (connect, authenticate, hello), and at
// setup its target and protocol over it.
Status RelayForwarder::link(Child& child, Deadline deadline) {
  const std::string peer = child.name + " at " + child.target.address;
  StatusOr<std::unique_ptr<Link>> connected = Unavailable("never tried to connect to " + peer);
  do {
    if (settings_.stopped) {
      if (std::optional<Status> why = settings_.stopped()) return *why;
    }
    const Deadline attempt = deadline.min(Deadline::After(std::chrono::milliseconds(100)));
    connected = Link::Connect(child.target.address, peer, attempt);
  } while (!connected.ok() && connected.status().code() == StatusCode::kUnavailable && !deadline.expired());
  RETURN_IF_ERROR(connected.status());
  std::unique_ptr<Link> fresh = std::move(*connected);
  RETURN_IF_ERROR(authenticate_as_client(*fresh, Secret(settings_.secret), data_auth_context(settings_.rank), deadline)
                      .WithContext("authenticating the relay link"));
  if (child.link) {  // relink: the target and protocol stay, over the same Link object
    child.link->adopt(*fresh);
    RETURN_IF_ERROR(child.remote->relinked());
  } else {
    child.link = std::move(fresh);
    ASSIGN_OR_RETURN(child.remote,
                     transport_->open_target_on(child.target.descriptor, child.link.get(), settings_.device));
    // A child linked after setup (its parent was dropped, or it joins) may
    // have had another feeder: the transport pairs with this rank anew
    // (nccl: a new communicator, announced at the first write).
    if (set_up_) RETURN_IF_ERROR(child.remote->relinked());
    child.protocol = std::make_unique<EngineLinkProtocol>(settings_.name + " (relay to " + child.name + ")", plan_,
                                                          settings_.bucket_timeout_s);
    child.protocol->attach(child.link.get());
  }
  const HelloFrame hello{relay_feeder(settings_.engine), static_cast<std::uint64_t>(settings_.rank), plan_->digest};
  return child.link->send(encode(hello), {}, deadline);
}

// Every worker has left the failed refit's bucket (cancel() shut its link).
Status RelayForwarder::wait_idle(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto idle = [&] { return std::none_of(children_.begin(), children_.end(), [](auto& c) { return c->busy; }); };
  if (!cv_.wait_until(lock, deadline.at(), idle)) {
    return DeadlineExceeded(settings_.name + ": a relay worker is still writing a bucket of the failed refit");
  }
  return Status::Ok();
}

Status RelayForwarder::set_children(const std::vector<EngineTarget>& children, bool relink_kept, Deadline deadline) {
  RETURN_IF_ERROR(wait_idle(deadline));
  auto wanted = [&](const Child& c) {
    return std::any_of(children.begin(), children.end(),
                       [&](const EngineTarget& t) { return t.engine == c.target.engine; });
  };
  for (auto it = children_.begin(); it != children_.end();) {
    if (wanted(**it)) {
      if (relink_kept) {
        RETURN_IF_ERROR(link(**it, deadline).WithContext(settings_.name + ", relinking to " + (*it)->name));
      }
      ++it;
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      (*it)->removed = true;
    }
    cv_.notify_all();
    (*it)->link->shutdown();
    (*it)->thread.join();
    std::lock_guard<std::mutex> lock(mu_);
    it = children_.erase(it);
  }
  for (const EngineTarget& target : children) {
    const bool known = std::any_of(children_.begin(), children_.end(),
                                   [&](const auto& c) { return c->target.engine == target.engine; });
    if (known) continue;
    auto child = std::make_unique<Child>();
    child->target = target;
    child->name = "engine " + std::to_string(target.engine) + " rank " + std::to_string(target.engine_rank);
    RETURN_IF_ERROR(link(*child, deadline).WithContext(settings_.name + ", linking its relay to " + child->name));
    std::lock_guard<std::mutex> lock(mu_);  // the other workers read children_ under mu_
    child->done = items_.size();            // the last refit's buckets are not its
    children_.push_back(std::move(child));
    start_worker(*children_.back());
  }
  return Status::Ok();
}

Status RelayForwarder::relink(Deadline deadline) {
  RETURN_IF_ERROR(wait_idle(deadline));
  for (auto& child : children_) {
    RETURN_IF_ERROR(link(*child, deadline).WithContext(settings_.name + ", relinking its relay to " + child->name));
  }
  return Status::Ok();
}

void RelayForwarder::begin(std::uint64_t version, Deadline deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  version_ = version;
  deadline_ = deadline;
  items_.clear();
  items_.reserve(plan_->buckets.size());
  error_ = Status::Ok();
  for (auto& child : children_) child->done = child->bytes = 0;
}

Status RelayForwarder::begin_for(std::uint64_t version, std::uint64_t engine, Deadline deadline) {
  begin(version, deadline);
  std::lock_guard<std::mutex> lock(mu_);
  bool found = false;
  for (auto& child : children_) {
    if (child->target.engine == engine) {
      found = true;
    } else {
      child->done = plan_->buckets.size();  // it has this version: nothing to forward to it
    }
  }
  if (found) return Status::Ok();
  return NotFound(settings_.name + " relays to no rank of engine " + std::to_string(engine) +
                  " (its route from the coordinator did not name it)");
}

Status RelayForwarder::landed(const TappedBucket& b) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.ok()) return error_;
  if (b.version != version_ || b.bucket != items_.size()) {
    return Internal(settings_.name + ": the relay was handed bucket " + std::to_string(b.bucket) + " of refit " +
                    std::to_string(b.version) + " while it expected bucket " + std::to_string(items_.size()) +
                    " of refit " + std::to_string(version_));
  }
  items_.push_back(Item{b.bucket, b.bytes, b.n, std::vector<std::byte>(b.encoding.begin(), b.encoding.end()), b.base});
  cv_.notify_all();
  return Status::Ok();
}

RelayPayload relay_payload(std::span<const std::byte> raw, std::span<const std::byte> encoding, std::uint64_t base,
                           std::uint64_t child_base) {
  if (!encoding.empty() && base != 0 && child_base == base) return RelayPayload{encoding, true};
  return RelayPayload{raw, false};
}

std::uint64_t RelayForwarder::forwarded_by_all() const {
  std::uint64_t fewest = items_.size();
  for (const auto& child : children_) fewest = std::min(fewest, child->done);
  return fewest;
}

Status RelayForwarder::wait_forwarded(std::uint64_t bucket, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] { return !error_.ok() || forwarded_by_all() > bucket; };
  if (!cv_.wait_until(lock, deadline.at(), ready)) {
    return DeadlineExceeded(settings_.name + " timed out relaying bucket " + std::to_string(bucket) + " of refit " +
                            std::to_string(version_));
  }
  return error_;
}

Status RelayForwarder::finish(Deadline deadline) {
  if (plan_->buckets.empty()) return Status::Ok();
  return wait_forwarded(plan_->buckets.size() - 1, deadline);
}

// From the control reader's thread too: children_ changes only under mu_.
void RelayForwarder::cancel(const Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.ok()) error_ = why.ok() ? Aborted(settings_.name + ": relay cancelled") : why;
  cv_.notify_all();
  for (auto& child : children_) {
    if (child->link) child->link->shutdown();
  }
}

std::uint64_t RelayForwarder::forwarded_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::uint64_t bytes = 0;
  for (const auto& child : children_) bytes += child->bytes;
  return bytes;
}

// One child's worker: forwards this refit's buckets in order as they land;
// a failure stops it until the next begin().
void RelayForwarder::work(Child* child) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || child->removed || (error_.ok() && child->done < items_.size()); });
    if (stopping_ || child->removed) return;
    const Item item = items_[child->done];
    const std::uint64_t version = version_;
    const Deadline deadline = deadline_;
    child->busy = true;
    lock.unlock();
    StatusOr<std::uint64_t> sent = forward(*child, item, version, deadline);
    lock.lock();
    child->busy = false;
    if (!sent.ok()) {
      if (error_.ok()) error_ = sent.status();
    } else if (version == version_ && child->done == item.bucket) {  // not a refit begun since
      ++child->done;
      child->bytes += *sent;
    }
    cv_.notify_all();
  }
}

// Bucket `item` into the child's pool: its credit, the bytes (or, to a
// child at the base it was encoded against, its encoding) into the mapped
// slot or written by the transport, kLanded. Returns the bytes written.
StatusOr<std::uint64_t> RelayForwarder::forward(Child& child, const Item& item, std::uint64_t version,
                                                Deadline deadline) {
  auto where = [&] {
    return settings_.name + ", relaying bucket " + std::to_string(item.bucket) + " of refit " +
           std::to_string(version) + " to " + child.name;
  };
  StatusOr<GrantedSlot> credit = child.protocol->wait_credit_base(version, item.bucket, deadline);
  if (!credit.ok()) return credit.status().WithContext(where());
  const RelayPayload payload =
      relay_payload(std::span<const std::byte>(item.bytes, item.n), item.encoding, item.base, credit->base);
  const int s = static_cast<int>(credit->slot);
  if (std::byte* dst = child.remote->mapped_slot(s); dst != nullptr && settings_.device >= 0) {
    // A device slot into a child's mapped device slot (cuda_ipc): a
    // synchronous copy, done before kLanded announces it.
    Status copied = copy_device_to_device(dst, payload.bytes.data(), payload.bytes.size());
    if (!copied.ok()) return copied.WithContext(where());
  } else if (dst != nullptr) {
    if (!payload.bytes.empty()) std::memcpy(dst, payload.bytes.data(), payload.bytes.size());
  } else if (!payload.bytes.empty()) {
    StatusOr<Ticket> ticket = child.remote->submit(s, 0, payload.bytes, version, deadline);
    if (!ticket.ok()) return ticket.status().WithContext(where());
    for (;;) {
      StatusOr<bool> done = child.remote->poll(*ticket);
      if (!done.ok()) return done.status().WithContext(where());
      if (*done) break;
      if (deadline.expired()) return DeadlineExceeded(where() + ": the write did not complete by the refit deadline");
    }
  }
  Status landed = payload.encoded
                      ? child.protocol->send_landed_encoded(version, item.bucket, credit->slot, payload.bytes.size(),
                                                            deadline)
                      : child.protocol->send_landed(version, item.bucket, credit->slot, deadline);
  RETURN_IF_ERROR(landed.WithContext(where()));
  return static_cast<std::uint64_t>(payload.bytes.size());
}

}  // namespace refit
