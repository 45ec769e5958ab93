// The engine rank's data links, recovery and release between refits
// (engine_rank_impl.h).
#include "runtime/engine_rank_impl.h"

namespace refit {

// --release-between-refits, once this rank said committed and the
// trainers let go of its memory: the receiver goes with the receive pool
// (staged; direct: the weights' exposure) and the links, and the engine
// frees what it needs only during a refit (Engine::release_idle: a
// shadow arena not served, staged mode). Released says
// the bytes returned: on a device as the driver counts them, on the host
// the pool's.
Status EngineRank::Impl::release_after(std::uint64_t version) {
  ASSIGN_OR_RETURN(Release release, client_->wait_for<Release>(Deadline::AfterSeconds(options_.setup_timeout_s)));
  if (release.version != version) {
    return InvalidArgument("protocol error: the coordinator asked to release after refit " +
                           std::to_string(release.version) + " during refit " + std::to_string(version));
  }
  std::uint64_t free_before = 0;
  if (on_device_) {
    ASSIGN_OR_RETURN(free_before, device_free_bytes(device_));
  }
  std::unique_ptr<Receiver> old;
  {
    std::lock_guard<std::mutex> lock(data_mu_);
    old = std::move(receiver_);
  }
  const std::uint64_t pool = direct_ ? 0 : static_cast<std::uint64_t>(old->pool().slots()) * old->pool().slot_bytes();
  old.reset();
  ASSIGN_OR_RETURN(const std::uint64_t idle, engine_->release_idle());  // a shadow arena not served
  std::uint64_t returned = pool + idle;
  if (on_device_) {
    ASSIGN_OR_RETURN(const std::uint64_t free_after, device_free_bytes(device_));
    returned = free_after > free_before ? free_after - free_before : 0;
  }
  return client_->send(Released{version, returned});
}

// Before the next start (after a release): the pool again (direct: the
// weights exposed again), its descriptor to the coordinator for the
// trainers, their links as at setup. A failure is reported.
Status EngineRank::Impl::acquire(const Acquire& acquire) {
  Status status = acquire_pool(acquire.version);
  if (status.ok()) return Status::Ok();
  status = status.WithContext(name() + ", taking its receive pool again before refit " +
                              std::to_string(acquire.version));
  (void)client_->send(Failed{acquire.version, status});
  return status;
}

Status EngineRank::Impl::acquire_pool(std::uint64_t version) {
  Deadline deadline = Deadline::AfterSeconds(options_.setup_timeout_s);
  RETURN_IF_ERROR(engine_->acquire_idle());
  ASSIGN_OR_RETURN(std::unique_ptr<TargetMemory> pool, make_pool());
  if (!pool) return Internal("the receive pool no longer fits --memory-limit");
  const std::string descriptor = pool->descriptor();
  RETURN_IF_ERROR(make_receiver(std::move(pool)));
  RETURN_IF_ERROR(client_->send(Acquired{version, descriptor}));
  RETURN_IF_ERROR(accept_links(deadline));
  RETURN_IF_ERROR(receiver_->pool().seal());
  return client_->send(Linked{});
}

// The receiver over the pool (staged) or the exposed weights (direct):
// every data-plane frame of either mode is checked there.
Status EngineRank::Impl::make_receiver(std::unique_ptr<TargetMemory> pool) {
  ReceiverOptions receiver_options;
  receiver_options.poison_recycled = options_.poison_recycled;
  receiver_options.name = name();
  ASSIGN_OR_RETURN(auto receiver, direct_ ? Receiver::CreateDirect(&plan_, rank(), std::move(pool), receiver_options)
                                          : Receiver::Create(&plan_, rank(), std::move(pool), receiver_options));
  if (relay_) RETURN_IF_ERROR(receiver->set_tap(relay_.get()));
  std::lock_guard<std::mutex> lock(data_mu_);
  receiver_ = std::move(receiver);
  return Status::Ok();
}

// Many engines: the relay to the same rank of each engine this one feeds
// (relay_forwarder.h), the receiver's tap from now on.
Status EngineRank::Impl::link_relay(const std::vector<EngineTarget>& children, Deadline deadline) {
  if (children.empty()) return Status::Ok();
  RelaySettings settings{name(), rank(), static_cast<std::uint64_t>(options_.engine), options_.secret,
                         options_.transport, options_.bucket_timeout_s, [this] { return client_->abort_reason(); },
                         on_device_ ? device_ : -1};
  ASSIGN_OR_RETURN(auto relay, RelayForwarder::Connect(std::move(settings), &plan_, children, deadline));
  std::lock_guard<std::mutex> lock(data_mu_);
  relay_ = std::move(relay);
  return receiver_->set_tap(relay_.get());
}

// The data-plane links of the trainer ranks that feed this rank
// (data_links.h), handed to the receiver; at setup and at every recovery.
Status EngineRank::Impl::accept_links(Deadline deadline) {
  const DataPort port{name(), rank(), options_.secret, plan_.digest, feeders_};
  ASSIGN_OR_RETURN(auto links,
                   accept_data_links(*listener_, port, [this] { return client_->abort_reason(); }, deadline));
  std::lock_guard<std::mutex> lock(data_mu_);
  for (auto& link : links) receiver_->attach_link(std::move(link));
  if (!parts_.empty()) RETURN_IF_ERROR(receiver_->set_feeders(parts_).WithContext(name()));
  return Status::Ok();
}

// After a failed refit (reported): on the coordinator's "relink", drops the
// data-plane links (and the receiver's state) but keeps the registered pool
// or exposed weights, accepts fresh links from the same trainer ranks and
// reports its weights: the last committed version, incomplete.
// Returns false when the coordinator ended the job instead.
StatusOr<bool> EngineRank::Impl::recover() {
  ASSIGN_OR_RETURN(std::optional<Relink> relink,
                   client_->wait_for_recovery(Deadline::AfterSeconds(options_.setup_timeout_s)));
  if (!relink) return false;
  RETURN_IF_ERROR(relink_data(*relink, /*after_failure=*/true));
  log(LogLevel::kInfo, name(),
      "recovered: weights at version " + std::to_string(engine_->weight_version()) + " (" +
          (engine_->weights_complete() ? "complete" : "incomplete: the failed refit wrote part of them") +
          "), relinked for the next refit");
  RETURN_IF_ERROR(client_->send(Linked{engine_->weight_version(), engine_->weights_complete()}));
  return true;
}

// The data links made again. After a failed refit (`after_failure`: every
// rank relinks): a new receiver over the same pool, its feeders' links
// accepted again, the relay to its children linked again. Between refits
// (many engines: an engine was dropped, only the engine ranks relink): the
// receiver and its links stay unless the route names new feeders, and the
// relay keeps the links to the children it keeps. A route (the relay tree
// changed) gives the feeders and children.
Status EngineRank::Impl::relink_data(const Relink& relink, bool after_failure) {
  Deadline deadline = Deadline::AfterSeconds(options_.setup_timeout_s);
  const bool new_feeders = relink.route && relink.route->feeders != feeders_;
  bool reopened = false;
  if (after_failure || new_feeders) {
    std::unique_ptr<Receiver> old;
    {
      std::lock_guard<std::mutex> lock(data_mu_);
      old = std::move(receiver_);
    }
    if (relink.route) {  // the relay tree's new root takes the trainer ranks' parts too
      feeders_ = relink.route->feeders;
      RETURN_IF_ERROR(adopt_parts(relink.route->parts));
    }
    RETURN_IF_ERROR(make_receiver(old->release_pool()));
    // A trainer rank may come back as a new process that must open the pool.
    ASSIGN_OR_RETURN(reopened, receiver_->pool().unseal());
    RETURN_IF_ERROR(accept_links(deadline));
  }
  if (relink.route && relay_) {
    RETURN_IF_ERROR(relay_->set_children(relink.route->relay, after_failure, deadline));
  } else if (relink.route) {
    RETURN_IF_ERROR(link_relay(relink.route->relay, deadline));
  } else if (relay_ && after_failure) {
    RETURN_IF_ERROR(relay_->relink(deadline));
  }
  if (reopened) RETURN_IF_ERROR(receiver_->pool().seal());
  return Status::Ok();
}

// Many engines, between refits: an engine was dropped and the relay tree
// changed; this rank links again as the route says and says linked.
Status EngineRank::Impl::reroute(const Relink& relink) {
  Status status = relink_data(relink, /*after_failure=*/false);
  if (!status.ok()) {
    status = status.WithContext(name() + ", linking again after an engine was dropped");
    log(LogLevel::kError, name(), status.message());
    (void)client_->send(Failed{relink.version, status});
    return status;
  }
  log(LogLevel::kInfo, name(), "relinked: an engine was dropped from the job and the relay tree changed");
  return client_->send(Linked{engine_->weight_version(), engine_->weights_complete()});
}

}  // namespace refit
