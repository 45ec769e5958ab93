// The trainer rank's data links to the engine ranks (trainer_rank_impl.h):
// at setup, after a failed refit, to a new engine rank when the engine it
// fed was dropped, and the release and acquire between refits.
#include "runtime/trainer_rank_impl.h"

#include <algorithm>

namespace refit {

ControlClient::BetweenRefits TrainerRank::Impl::between_refits() {
  return {[this](const Acquire& a) { return acquire(a); }, [this](const Relink& r) { return move_to_root(r); }, {}};
}

Status TrainerRank::Impl::link_engine(const std::string& descriptor, Deadline deadline) {
  ASSIGN_OR_RETURN(auto link, connect_to_engine(deadline));
  {
    std::lock_guard<std::mutex> lock(link_mu_);  // the control reader may shut it down
    link_ = std::move(link);
  }
  protocol_.attach(link_.get());
  // From the device that writes: the weights' device, or for host weights into a device engine the one
  // that copies (--gpu). Transports that bind a device at open (nccl) send from it; cuda_ipc enables
  // peer access from it to the engine's GPU (the pack kernel writes into the slot).
  const int writer = source_on_device_ ? source_->device() : (target_on_device_ ? options_.gpu : -1);
  ASSIGN_OR_RETURN(target_, transport_->open_target_on(descriptor, link_.get(), writer));
  RETURN_IF_ERROR(send_hello(deadline));
  return make_sender(writer);
}

Status TrainerRank::Impl::link_sharded(const Setup& setup, Deadline deadline) {
  on_demand_ = setup.on_demand;
  targets_ = setup.targets;
  RETURN_IF_ERROR(link_channels(deadline));
  return client_->send(Linked{});
}

Status TrainerRank::Impl::link_channels(Deadline deadline) {
  ASSIGN_OR_RETURN(auto channels,
                   link_shard_channels(options_, *sharded_, targets_, client_.get(), source_.get(), deadline));
  {
    std::lock_guard<std::mutex> lock(link_mu_);  // the control reader shuts them down
    channels_ = std::move(channels);
  }
  return Status::Ok();
}

Status TrainerRank::Impl::release_after(std::uint64_t version) {
  ASSIGN_OR_RETURN(Release release, client_->wait_for<Release>(Deadline::AfterSeconds(options_.setup_timeout_s)));
  if (release.version != version) {
    return InvalidArgument("protocol error: the coordinator asked to release after refit " +
                           std::to_string(release.version) + " during refit " + std::to_string(version));
  }
  gpu_span_.reset();
  sending_ = nullptr;
  plain_sender_.reset();
  sender_.reset();
  target_.reset();
  {
    std::lock_guard<std::mutex> lock(link_mu_);
    channels_.clear();
    protocol_.attach(nullptr);
    link_.reset();
  }
  return client_->send(Released{version, 0});
}

Status TrainerRank::Impl::acquire(const Acquire& acquire) {
  Deadline deadline = Deadline::AfterSeconds(options_.setup_timeout_s);
  Status linked = Status::Ok();
  for (EngineTarget& target : targets_) {
    if (target.engine_rank < acquire.descriptors.size()) target.descriptor = acquire.descriptors[target.engine_rank];
  }
  if (!sharded_ && static_cast<std::size_t>(engine_rank_) >= acquire.descriptors.size()) {
    linked = InvalidArgument("protocol error: 'acquire' names no pool of engine rank " + std::to_string(engine_rank_));
  } else {
    linked = sharded_ ? link_channels(deadline)
                      : link_engine(acquire.descriptors[static_cast<std::size_t>(engine_rank_)], deadline);
  }
  if (!linked.ok()) {
    linked = linked.WithContext(name() + ", opening the engine ranks' pools again before refit " +
                                std::to_string(acquire.version));
    (void)client_->send(Failed{acquire.version, linked});
    return linked;
  }
  return client_->send(Linked{});
}

StatusOr<std::unique_ptr<Link>> TrainerRank::Impl::connect_to_engine(Deadline deadline) {
  return connect_data_link(options_, engine_rank_, engine_address_, *client_, deadline);
}

Status TrainerRank::Impl::send_hello(Deadline deadline) {
  const HelloFrame hello{static_cast<std::uint64_t>(options_.rank), static_cast<std::uint64_t>(engine_rank_),
                         plan_.digest};
  return link_->send(encode(hello), {}, deadline);
}

Status TrainerRank::Impl::relink_to(const Relink& relink, Deadline deadline) {
  if (!relink.route || relink.route->targets.empty()) {
    return sharded_ ? relink_channels(channels_, deadline) : relink_engine(deadline);
  }
  if (sharded_) return move_channels(relink.route->targets, deadline);
  const EngineTarget& root = relink.route->targets.front();
  if (root.engine_rank != static_cast<std::uint64_t>(engine_rank_)) {
    return InvalidArgument("protocol error: the relink names engine rank " + std::to_string(root.engine_rank) +
                           ", this rank feeds engine rank " + std::to_string(engine_rank_));
  }
  log(LogLevel::kInfo, name(),
      "the engine it fed was dropped: engine " + std::to_string(root.engine) + " rank " +
          std::to_string(root.engine_rank) + " at " + root.address + " takes its place");
  engine_address_ = root.address;
  RETURN_IF_ERROR(link_engine(root.descriptor, deadline));
  // Its pool was fed by its relay parent until now: nccl pairs with this
  // rank in a new communicator, announced at the first write.
  return target_->relinked();
}

// A sharded rank's engine ranks moved to the new root: each target of the
// relink replaces the one of the same engine rank, and every channel is
// linked again as at setup.
Status TrainerRank::Impl::move_channels(const std::vector<EngineTarget>& moved, Deadline deadline) {
  for (const EngineTarget& target : moved) {
    auto same = std::find_if(targets_.begin(), targets_.end(),
                             [&](const EngineTarget& t) { return t.engine_rank == target.engine_rank; });
    if (same == targets_.end()) {
      return InvalidArgument("protocol error: the relink names engine rank " + std::to_string(target.engine_rank) +
                             ", which this rank does not feed");
    }
    *same = target;
  }
  log(LogLevel::kInfo, name(),
      "the engine it fed was dropped: engine " + std::to_string(moved.front().engine) + " takes its place");
  return link_channels(deadline);
}

Status TrainerRank::Impl::move_to_root(const Relink& relink) {
  Status status = relink_to(relink, Deadline::AfterSeconds(options_.setup_timeout_s));
  if (!status.ok()) {
    status = status.WithContext(name() + ", linking again after an engine was dropped");
    (void)client_->send(Failed{relink.version, status});
    return status;
  }
  return client_->send(Linked{committed_, std::nullopt});
}

Status TrainerRank::Impl::relink_engine(Deadline deadline) {
  ASSIGN_OR_RETURN(auto fresh, connect_to_engine(deadline));
  {
    std::lock_guard<std::mutex> lock(link_mu_);
    link_->adopt(*fresh);
  }
  RETURN_IF_ERROR(target_->relinked());  // nccl: a new communicator at the next submit
  return send_hello(deadline);
}

}  // namespace refit
