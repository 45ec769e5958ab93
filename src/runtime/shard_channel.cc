// A sharded trainer rank's channel to one engine rank: see shard_channel.h.
#include "runtime/shard_channel.h"

#include <signal.h>

#include <chrono>
#include <thread>

#include "control/auth.h"
#include "cuda/device.h"
#include "net/frames.h"
#include "refit/format.h"
#include "refit/log.h"
#include "refit/model.h"
#include "refit/reference_engine.h"
#include "refit/secret.h"
#include "refit/transfer_defaults.h"
#include "runtime/bucket_faults.h"
#include "runtime/data_connect.h"

namespace refit {

ShardChannel::ShardChannel(const RankOptions& options, ShardedPlan::Fed* fed, std::string address,
                           ControlClient* client)
    : options_(options), fed_(fed), address_(std::move(address)), client_(client) {}

StatusOr<std::unique_ptr<Link>> ShardChannel::connect(Deadline deadline) {
  return connect_data_link(options_, engine_rank(), address_, *client_, deadline);
}

Status ShardChannel::send_hello(Deadline deadline) {
  const HelloFrame hello{static_cast<std::uint64_t>(options_.rank), static_cast<std::uint64_t>(engine_rank()),
                         fed_->plan.digest};
  return link_->send(encode(hello), {}, deadline);
}

Status ShardChannel::link(const std::string& descriptor, int writer, Deadline deadline) {
  ASSIGN_OR_RETURN(transport_, make_transport(options_.transport));
  ASSIGN_OR_RETURN(auto link, connect(deadline));
  {
    std::lock_guard<std::mutex> lock(link_mu_);
    link_ = std::move(link);
  }
  ASSIGN_OR_RETURN(target_, transport_->open_target_on(descriptor, link_.get(), writer));
  return send_hello(deadline);
}

Status ShardChannel::make_sender(const WeightSource* source, SenderSettings settings,
                                 SharedRegistrations registrations) {
  SenderContext context;
  context.name = name() + " (to engine rank " + std::to_string(engine_rank()) + ")";
  context.plan = &fed_->plan;
  context.source = source;
  context.pack_rank = engine_rank();
  context.engine_ranks = options_.engine_ranks;
  context.target = target_.get();
  context.protocol = this;
  context.feed = &fed_->feed;
  context.feed_rank = options_.rank;
  context.registrations = std::move(registrations);
  if (settings.direct) context.arena_offsets = weight_arena_offsets(fed_->plan.specs, nullptr);
  context.landing = &landing_;
  settings.capabilities = transport_->capabilities();
  ASSIGN_OR_RETURN(sender_, make_bucket_sender(std::move(context), settings));
  return Status::Ok();
}

StatusOr<std::uint64_t> ShardChannel::send_all(std::uint64_t version, bool first, Deadline deadline) {
  std::uint64_t bytes = 0;
  for (std::uint64_t j = 0; j < fed_->plan.buckets.size(); ++j) {
    const BucketShare* share = fed_->feed.share(j, options_.rank);
    if (share == nullptr) continue;
    RETURN_IF_ERROR(inject_delays());
    RETURN_IF_ERROR(sender_->send(version, j, deadline));
    if (first && bytes == 0) {
      const std::string what = "its part of bucket " + std::to_string(j) + " of refit " + std::to_string(version);
      RETURN_IF_ERROR(after_bucket_faults(options_, name(), version, what, false, true, nullptr));
    }
    bytes += share->bytes;
  }
  RETURN_IF_ERROR(sender_->finish(version, deadline));
  return bytes;
}

// The tests' delays before a bucket part (--debug-gpu-delay-ms,
// --debug-host-delay-ms; roles.h).
Status ShardChannel::inject_delays() {
  if (CudaStream* stream = sender_->stream(); stream != nullptr && options_.debug_gpu_delay_ms > 0) {
    RETURN_IF_ERROR(inject_gpu_delay(stream->device(), stream->handle(), options_.debug_gpu_delay_ms));
  }
  if (options_.debug_host_delay_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.debug_host_delay_ms));
  }
  return Status::Ok();
}

// As the full-weight trainer's send_bucket does after its first bucket of
// the refit: the lines are the tests' proof that the refit is under way.
void ShardChannel::land_in(std::uint64_t arena) { landing_ = arena * shadow_arena_stride(fed_->plan.specs); }

Status ShardChannel::relink(Deadline deadline) {
  ASSIGN_OR_RETURN(auto fresh, connect(deadline));
  {
    std::lock_guard<std::mutex> lock(link_mu_);
    link_->adopt(*fresh);
  }
  RETURN_IF_ERROR(target_->relinked());
  return send_hello(deadline);
}

void ShardChannel::shutdown_link() {
  std::lock_guard<std::mutex> lock(link_mu_);
  if (link_) link_->shutdown();
}

StatusOr<CreditFrame> receive_credit(Link& link, const std::string& who, double bucket_timeout_s,
                                     std::uint64_t version, std::uint64_t j, Deadline deadline) {
  auto frame = link.recv_header(deadline.min(Deadline::AfterSeconds(bucket_timeout_s)), 0);
  if (!frame.ok() && frame.status().code() == StatusCode::kDeadlineExceeded && !deadline.expired()) {
    return DeadlineExceeded(who + " waited " + format_seconds(bucket_timeout_s) + " for the credit of bucket " +
                            std::to_string(j) + " of refit " + std::to_string(version) + " from " + link.peer() +
                            " (a stalled or dead engine rank; --bucket-timeout)");
  }
  if (!frame.ok()) return frame.status();
  ASSIGN_OR_RETURN(CreditFrame credit, decode_credit(*frame, link.peer()));
  if (credit.version != version || credit.bucket != j) {
    return DataLoss("protocol error from " + link.peer() + ": expected the credit for bucket " + std::to_string(j) +
                    " of version " + std::to_string(version) + ", got the credit for bucket " +
                    std::to_string(credit.bucket) + " of version " + std::to_string(credit.version));
  }
  return credit;
}

StatusOr<std::uint64_t> ShardChannel::wait_credit(std::uint64_t version, std::uint64_t j, Deadline deadline) {
  ASSIGN_OR_RETURN(const CreditFrame credit, receive_credit(*link_, name(), options_.bucket_timeout_s, version, j,
                                                            deadline));
  return credit.slot;
}

Status ShardChannel::send_landed(std::uint64_t version, std::uint64_t j, std::uint64_t slot, Deadline deadline) {
  const BucketShare* share = fed_->feed.share(j, options_.rank);
  const LandedFrame landed{version, j, slot, share == nullptr ? 0 : share->bytes};
  return link_->send(encode(landed), {}, deadline);
}

std::string ShardChannel::peer() const { return link_->peer(); }

}  // namespace refit

namespace refit {

std::vector<Feed> sharded_feeds(const ShardedPlan& plan, int trainer_rank) {
  std::vector<Feed> feeds;
  for (const ShardedPlan::Fed& fed : plan.fed) {
    Feed f;
    f.engine_rank = static_cast<std::uint64_t>(fed.engine_rank);
    f.plan_digest = fed.plan.digest_hex();
    for (std::uint64_t j = 0; j < fed.plan.buckets.size(); ++j) {
      if (const BucketShare* share = fed.feed.share(j, trainer_rank)) f.parts.push_back(Part{j, share->bytes});
    }
    feeds.push_back(std::move(f));
  }
  return feeds;
}

std::map<std::string, std::string> sharded_stream_dtypes(const ShardedPlan& plan) {
  std::map<std::string, std::string> out;
  for (const ShardedPlan::Fed& fed : plan.fed) {
    for (const TensorSpec& s : fed.plan.specs) out.emplace(std::string(dtype_name(s.dtype)), s.name);
  }
  return out;
}

namespace {

// The sender settings of a channel to `target` (check_sharded_settings said
// what runs): host weights feed host engines, or device engines over
// cuda_ipc from --gpu; device weights feed device engines from their device.
StatusOr<SenderSettings> channel_settings(const RankOptions& options, const WeightSource& source,
                                          const EngineTarget& target) {
  const bool on_device = source.memory() == MemoryKind::kCuda;
  const bool target_on_device = target.device != "cpu";
  if (on_device && !target_on_device) {
    return FailedPrecondition("trainer rank " + std::to_string(options.rank) + ": sharded device weights feed "
                              "engines that keep device memory; engine rank " + std::to_string(target.engine_rank) +
                              " keeps " + target.device + " memory");
  }
  if (!on_device && target_on_device && options.transport != "cuda_ipc") {
    return FailedPrecondition("trainer rank " + std::to_string(options.rank) + ": sharded host weights feed device "
                              "engines over cuda_ipc in this build (got --transport " + options.transport +
                              "); engine rank " + std::to_string(target.engine_rank) + " keeps " + target.device +
                              " memory");
  }
  SenderSettings settings;
  settings.transport = options.transport;
  settings.direct = options.mode == "direct";
  settings.weights_on_device = on_device;
  settings.target_on_device = target_on_device;
  settings.register_host_weights = options.register_host_weights;
  // The device that writes: the weights' own, or for host weights into a device engine the one that copies.
  settings.gpu = on_device ? source.device() : (target_on_device ? options.gpu : -1);
  return settings;
}

}  // namespace

StatusOr<std::vector<std::unique_ptr<ShardChannel>>> link_shard_channels(
    const RankOptions& options, ShardedPlan& plan, const std::vector<EngineTarget>& targets, ControlClient* client,
    const WeightSource* source, Deadline deadline) {
  const std::string name = "trainer rank " + std::to_string(options.rank);
  if (targets.size() != plan.fed.size()) {
    return InvalidArgument("setup: " + name + " feeds " + std::to_string(plan.fed.size()) +
                           " engine ranks, the coordinator named " + std::to_string(targets.size()));
  }
  std::vector<std::unique_ptr<ShardChannel>> channels;
  SharedRegistrations registrations;  // registered with the first channel's settings, shared by all
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (targets[i].engine_rank != static_cast<std::uint64_t>(plan.fed[i].engine_rank)) {
      return InvalidArgument("setup: " + name + " feeds engine rank " + std::to_string(plan.fed[i].engine_rank) +
                             ", the coordinator named engine rank " + std::to_string(targets[i].engine_rank));
    }
    ASSIGN_OR_RETURN(const SenderSettings settings, channel_settings(options, *source, targets[i]));
    if (!registrations) registrations = host_registrations(*source, settings, name);
    auto channel = std::make_unique<ShardChannel>(options, &plan.fed[i], targets[i].address, client);
    RETURN_IF_ERROR(channel->link(targets[i].descriptor, settings.gpu, deadline));
    RETURN_IF_ERROR(channel->make_sender(source, settings, registrations));
    channels.push_back(std::move(channel));
  }
  return channels;
}

Status check_sharded_settings(const RankOptions& options, const WeightSource& source) {
  const std::string what = "trainer rank " + std::to_string(options.rank) +
                           (options.trainer_layout == "full" ? ": sharded tensors"
                                                             : ": --trainer-layout " + options.trainer_layout);
  if (options.transport == "nccl") {
    return FailedPrecondition(what + " runs over shm, tcp, ucx or cuda_ipc in this build: an nccl target takes one "
                              "trainer rank, and a sharded engine rank is fed by every trainer rank whose shards "
                              "reach it (got --transport nccl)");
  }
  if (options.delta) return FailedPrecondition(what + ": --delta is built for full-weight trainers only, so far");
  if (source.trainer_layouts().size() != source.model().weights.size()) {
    return FailedPrecondition(what + ": its weight source holds full tensors, not this rank's shards");
  }
  return Status::Ok();
}

Status relink_channels(std::vector<std::unique_ptr<ShardChannel>>& channels, Deadline deadline) {
  for (auto& c : channels) RETURN_IF_ERROR(c->relink(deadline));
  return Status::Ok();
}

StatusOr<ShardedSent> send_over_channels(std::vector<std::unique_ptr<ShardChannel>>& channels,
                                         std::uint64_t version, Deadline deadline) {
  std::mutex mu;
  Status first_error;  // the first to fail, in time: the others fail because it shut their links
  ShardedSent sent;
  sent.shares.resize(channels.size());
  auto run = [&](std::size_t i) {
    StatusOr<std::uint64_t> bytes = channels[i]->send_all(version, /*first=*/i == 0, deadline);
    std::lock_guard<std::mutex> lock(mu);
    if (bytes.ok()) {
      sent.bytes += *bytes;
      sent.buckets += channels[i]->buckets();
      sent.shares[i] = EngineShare{channels[i]->engine_rank(), *bytes};
      return;
    }
    if (first_error.ok()) {
      first_error = bytes.status();
      for (auto& c : channels) c->shutdown_link();  // the others stop at their next wait
    }
  };
  std::vector<std::thread> threads;
  for (std::size_t i = 1; i < channels.size(); ++i) threads.emplace_back(run, i);
  run(0);
  for (auto& t : threads) t.join();
  if (!first_error.ok()) return first_error;
  return sent;
}

}  // namespace refit
