// The trainer role: see trainer_rank.h and roles.h; its state and steps in
// trainer_rank_impl.h.
#include "runtime/trainer_rank_impl.h"

namespace refit {

using Clock = std::chrono::steady_clock;

Status TrainerRank::Impl::serve() {
  if (on_demand_) {
    return FailedPrecondition(name() + ": the coordinator runs refits on demand (--refits 0): call refit(version)");
  }
  for (;;) {
    recovered_ = false;
    ASSIGN_OR_RETURN(std::optional<Start> start, client_->wait_for_start_while_alive(between_refits()));
    if (!start) {
      log(LogLevel::kInfo, name(), tally_.summary("sent", "committed"));  // the job ended well
      return Status::Ok();
    }
    land_in(start->arena);
    Status status = refit_or_report(*start);
    if (!status.ok() && !recovered_) return status;
  }
}

Status TrainerRank::Impl::refit(std::uint64_t version, const std::vector<std::string>& only) {
  const Clock::time_point called = Clock::now();  // the report's seconds start here
  recovered_ = false;
  if (!on_demand_) {
    return FailedPrecondition(name() + ": the coordinator schedules this job's refits (--refits N): call serve()");
  }
  if (finished_) return FailedPrecondition(name() + ": refit(" + std::to_string(version) + ") after finish()");
  if (version <= committed_) {
    return InvalidArgument(name() + ": refit version " + std::to_string(version) +
                           " is not above the last committed version " + std::to_string(committed_));
  }
  ASSIGN_OR_RETURN(const RefitScope scope, partial_scope(version, only));
  // A job that ended meanwhile (a rank lost while this one was idle)
  // answers with its reason, not with a failed send.
  if (std::optional<Status> ended = client_->abort_reason()) return *ended;
  if (Status asked = client_->send(Request{version, scope.only}); !asked.ok()) {
    return client_->await_abort_reason(std::chrono::milliseconds(500)).value_or(asked);
  }
  ASSIGN_OR_RETURN(std::optional<Start> start, client_->wait_for_start_while_alive(between_refits()));
  if (!start) return Aborted(name() + ": the coordinator shut the job down");
  const std::uint64_t started = start->version;
  if (started != version) {
    return FailedPrecondition(name() + ": asked for refit " + std::to_string(version) +
                              " but the coordinator started " + std::to_string(started) +
                              " (every trainer rank must ask for the same version)");
  }
  land_in(start->arena);
  return refit_or_report(*start, called);
}

Status TrainerRank::Impl::finish() {
  if (!on_demand_ || finished_) return Status::Ok();
  finished_ = true;
  RETURN_IF_ERROR(client_->send(Finish{}));
  ASSIGN_OR_RETURN(Shutdown shutdown, client_->wait_for<Shutdown>(Deadline::AfterSeconds(options_.refit_timeout_s)));
  (void)shutdown;
  log(LogLevel::kInfo, name(), tally_.summary("sent", "committed"));  // the job ended well
  return Status::Ok();
}

void TrainerRank::Impl::land_in(std::uint64_t arena) {
  landing_ = arena * shadow_arena_stride(plan_.specs);
  for (auto& channel : channels_) channel->land_in(arena);
}

void TrainerRank::Impl::report_setup_failure(const Status& error) {
  if (stage_ == SetupStage::kLocal) refit::report_setup_failure(options_, Role::kTrainer, error);
  if (stage_ == SetupStage::kJoined) (void)client_->send(Failed{0, error});
}

Status TrainerRank::Impl::setup() {
  Deadline deadline = Deadline::AfterSeconds(options_.setup_timeout_s);
  RETURN_IF_ERROR(validate_rank_counts(options_.trainer_ranks, options_.engine_ranks));
  RETURN_IF_ERROR(validate_rank_settings(options_, /*engine=*/false));
  ASSIGN_OR_RETURN(source_, with_engine_experts(std::move(source_), options_));  // the engine's expert rules
  ASSIGN_OR_RETURN(source_, with_quantization(std::move(source_), options_));    // --quantize: codes, scales
  ASSIGN_OR_RETURN(HeartbeatTiming heartbeats,
                   heartbeat_timing(options_.heartbeat_interval_s, options_.heartbeat_timeout_s, name()));
  source_on_device_ = source_->memory() == MemoryKind::kCuda;
  direct_ = options_.mode == "direct";
  const Model& model = source_->model();
  ASSIGN_OR_RETURN(layout_, parse_trainer_layout(options_.trainer_layout, options_.trainer_ranks));
  // A source of shards (a sharded --trainer-layout's, or the binding's layouts) makes a sharded rank.
  const bool shards = !source_->trainer_layouts().empty();
  if (!shards) RETURN_IF_ERROR(validate_full_trainer_counts(layout_, options_.trainer_ranks, options_.engine_ranks));
  engine_rank_ = options_.rank % options_.engine_ranks;
  pack_rank_ = options_.debug_pack_rank >= 0 ? options_.debug_pack_rank % options_.engine_ranks : engine_rank_;
  options_.bucket_size = effective_bucket_size(options_.bucket_size, options_.transport);
  if (!layout_.full || shards) {
    RETURN_IF_ERROR(check_sharded_settings(options_, *source_));
    ASSIGN_OR_RETURN(sharded_, make_sharded_plan(*source_, options_));
  } else {
    ASSIGN_OR_RETURN(plan_,
                     make_plan(engine_stream(model, engine_rank_, options_.engine_ranks), options_.bucket_size));
  }
  ASSIGN_OR_RETURN(transport_, make_transport(options_.transport));
  if (source_on_device_ && !transport_->capabilities().device_memory) {
    return FailedPrecondition(name() + ": its weights are in device memory but --transport " + options_.transport +
                              " moves host memory");
  }

  stage_ = SetupStage::kJoining;
  ASSIGN_OR_RETURN(client_, ControlClient::Connect(options_.coordinator, Secret(options_.secret), deadline));
  const TrainerJoinFacts facts{&model,   &plan_, engine_rank_, source_on_device_, source_->device(),
                               &layout_, sharded_ ? &*sharded_ : nullptr};
  ASSIGN_OR_RETURN(Setup setup, client_->join(trainer_join(options_, facts), deadline));
  stage_ = SetupStage::kJoined;
  // From its Setup on, the coordinator and this rank watch each other's
  // heartbeats; an abort closes the data link, waking any wait on it.
  client_->start_reader(heartbeats, [this](const Status&) {
    std::lock_guard<std::mutex> lock(link_mu_);
    if (link_) link_->shutdown();
    for (auto& c : channels_) c->shutdown_link();
  });
  seed_ = setup.seed;
  release_ = setup.release_between_refits;
  if (sharded_) return link_sharded(setup, deadline);
  const std::string address = setup.engine_address, descriptor = setup.descriptor;
  if (setup.feeder_count == 0 || setup.trainer_index >= setup.feeder_count) {
    return InvalidArgument("setup: trainer_index out of range");
  }
  trainer_index_ = setup.trainer_index;
  feeders_ = setup.feeder_count;
  if (options_.delta) {  // the bases of the buckets this rank sends, kept across refits and releases
    std::vector<std::uint64_t> sends(plan_.buckets.size(), 0);
    for (std::uint64_t j = trainer_index_; j < sends.size(); j += feeders_) sends[j] = plan_.buckets[j].bytes;
    if (source_on_device_) {
      device_bases_.emplace(source_->device(), std::move(sends));
    } else {
      bases_.emplace(std::move(sends));
    }
  }
  on_demand_ = setup.on_demand;
  target_on_device_ = setup.engine_device == "cuda";
  if (source_on_device_ && !target_on_device_) {
    return FailedPrecondition(name() + ": its weights are in device memory but engine rank " +
                              std::to_string(engine_rank_) + " keeps host memory (--device cpu)");
  }

  engine_address_ = address;
  RETURN_IF_ERROR(link_engine(descriptor, deadline));
  return client_->send(Linked{});
}

Status TrainerRank::Impl::make_sender(int writer) {
  writer_ = writer;
  plain_sender_.reset();
  ASSIGN_OR_RETURN(sender_, new_sender(writer, options_.delta));
  sending_ = sender_.get();
  if (!source_on_device_ || sender_->stream() == nullptr) return Status::Ok();
  ASSIGN_OR_RETURN(gpu_span_, GpuSpan::Create(writer));
  return Status::Ok();
}

StatusOr<std::unique_ptr<BucketSender>> TrainerRank::Impl::new_sender(int writer, bool delta) {
  SenderContext context;
  context.name = name();
  context.plan = &plan_;
  context.source = source_.get();
  context.pack_rank = pack_rank_;
  context.engine_ranks = options_.engine_ranks;
  context.target = target_.get();
  context.protocol = &protocol_;
  context.delta_bases = delta && bases_ ? &*bases_ : nullptr;
  context.device_delta_bases = delta && device_bases_ ? &*device_bases_ : nullptr;
  // Direct mode writes into the engine's weight arena, laid out the same
  // way from the engine rank's stream.
  if (direct_) context.arena_offsets = weight_arena_offsets(plan_.specs, nullptr);
  context.landing = &landing_;
  SenderSettings settings;
  settings.direct = direct_;
  settings.weights_on_device = source_on_device_;
  settings.target_on_device = target_on_device_;
  settings.register_host_weights = options_.register_host_weights;
  settings.delta = delta;
  settings.gpu = writer;
  settings.transport = options_.transport;
  settings.capabilities = transport_->capabilities();
  return make_bucket_sender(std::move(context), settings);
}

StatusOr<BucketSender*> TrainerRank::Impl::refit_sender(bool partial) {
  if (!partial || !options_.delta || sender_ == nullptr) return sender_.get();
  if (plain_sender_ == nullptr) {
    ASSIGN_OR_RETURN(plain_sender_, new_sender(writer_, false));
  }
  return plain_sender_.get();
}

Status TrainerRank::Impl::refit_or_report(const Start& start, Clock::time_point called) {
  recovered_ = false;
  const std::uint64_t version = start.version;
  Status status = run_refit(version, start.only, called);
  if (status.ok()) return Status::Ok();
  // In doubt: the coordinator is lost, nobody to report to or relink with.
  if (in_doubt_) return status;
  // A broken CUDA context (a sticky error) fails every later refit the same
  // way: report it, and end this process instead of relinking.
  const Status health = sending_ != nullptr && sending_->stream() != nullptr
                            ? cuda_context_health(sending_->stream()->device())
                            : Status::Ok();
  if (!health.ok()) status = Status(health.code(), status.message() + "; " + health.message());
  status = client_->report_failure(version, status);
  if (!health.ok()) {
    // Exit only once the coordinator took the report (its relink or
    // shutdown), so that the job's error is this cause, not this exit.
    (void)client_->wait_for_recovery(Deadline::AfterSeconds(options_.setup_timeout_s));
    return status;
  }
  // Nothing of the failed refit may still be writing when the link is
  // replaced: wait for the device, forget the half-sent refit.
  if (sender_) sender_->abandon();
  if (plain_sender_) plain_sender_->abandon();
  for (auto& c : channels_) c->abandon();
  if (bases_) bases_->drop_pending();
  auto relink = client_->wait_for_recovery(Deadline::AfterSeconds(options_.setup_timeout_s));
  if (!relink.ok() || !*relink) return status;
  Deadline deadline = Deadline::AfterSeconds(options_.setup_timeout_s);
  Status relinked = relink_to(**relink, deadline);
  if (relinked.ok()) relinked = client_->send(Linked{committed_, std::nullopt});
  if (!relinked.ok()) return status.WithContext("recovery failed: " + relinked.message());
  log(LogLevel::kWarning, name(),
      "refit " + std::to_string(version) + " failed (" + status.message() + "); relinked, ready for the next refit");
  recovered_ = true;
  return status;
}

Status TrainerRank::Impl::run_refit(std::uint64_t version, const std::vector<std::string>& only,
                                    Clock::time_point called) {
  TrainerRefitReport report;
  report.version = version;
  report.only = only;
  // The sender before the plan is swapped: a sender sizes its buffers from the full plan's slot.
  ASSIGN_OR_RETURN(sending_, refit_sender(!only.empty()));
  ASSIGN_OR_RETURN(const PlanSwap partial, use_scope(version, only));
  report.wait_start_s = seconds_since(called);
  protocol_.begin_refit();
  if (bases_) bases_->drop_pending();
  fire_fault_hook(options_.debug_fault, ProtocolStep::kStart, version, name());
  RETURN_IF_ERROR(source_->prepare(version, seed_).WithContext(name() + ", preparing the weights of refit " +
                                                                std::to_string(version)));
  fire_fault_hook(options_.debug_fault, ProtocolStep::kReady, version, name());
  RETURN_IF_ERROR(client_->send(Ready{version, sharded_ ? std::string() : plan_.digest_hex()}));
  const Clock::time_point ready = Clock::now();
  RETURN_IF_ERROR(client_->wait_for<Go>(Deadline::AfterSeconds(options_.refit_timeout_s)).status());
  report.wait_go_s = seconds_since(ready);
  fire_fault_hook(options_.debug_fault, ProtocolStep::kGo, version, name());
  Deadline deadline = Deadline::AfterSeconds(options_.refit_timeout_s);
  RETURN_IF_ERROR(derive_refit(*source_, *client_, version, deadline).WithContext(name()));
  ASSIGN_OR_RETURN(const SentShare sent, send_share(version, deadline));
  fire_fault_hook(options_.debug_fault, ProtocolStep::kSent, version, name());
  RETURN_IF_ERROR(client_->send(Sent{version}));
  ASSIGN_OR_RETURN(Json stats, share_stats(sent));
  fire_fault_hook(options_.debug_fault, ProtocolStep::kDone, version, name());
  RETURN_IF_ERROR(client_->send(Done{version, false, std::move(stats), memory_path()}));
  const Clock::time_point done = Clock::now();
  RETURN_IF_ERROR(await_commit(version, deadline));
  report.wait_commit_s = seconds_since(done);
  report.seconds = seconds_since(called);
  fire_fault_hook(options_.debug_fault, ProtocolStep::kCommit, version, name());
  committed_ = version;
  commit_bases(version);
  tally_.add(version, sent.bytes);
  report.buckets = sent.buckets;
  report.bytes = sent.bytes;
  report.send_s = sent.send_ms / 1e3;
  report.wait_credits_s = protocol_.tally().credit_wait_s;
  last_refit_ = report;
  fire_fault_hook(options_.debug_fault, ProtocolStep::kCommitted, version, name());
  RETURN_IF_ERROR(client_->send(Committed{version}));
  return release_ ? release_after(version) : Status::Ok();
}

StatusOr<TrainerRank::Impl::SentShare> TrainerRank::Impl::send_share(std::uint64_t version, Deadline deadline) {
  if (sharded_) return send_sharded(version, deadline);
  const Clock::time_point went = Clock::now();
  CudaStream* stream = sending_->stream();  // the sender's copies, or null (host paths)
  if (gpu_span_ && stream != nullptr) RETURN_IF_ERROR(gpu_span_->begin(*stream).WithContext(name()));
  SentShare sent;
  Clock::time_point last_progress = Clock::now();
  for (std::uint64_t j = trainer_index_; j < plan_.buckets.size(); j += feeders_) {
    RETURN_IF_ERROR(send_bucket(version, j, deadline));
    ++sent.buckets;
    sent.bytes += plan_.buckets[j].bytes;
    if (Clock::now() - last_progress > std::chrono::milliseconds(50)) {
      last_progress = Clock::now();
      RETURN_IF_ERROR(client_->send(Progress{version, sent.bytes}));
    }
  }
  RETURN_IF_ERROR(sending_->finish(version, deadline));
  sent.send_ms = std::chrono::duration<double, std::milli>(Clock::now() - went).count();
  // Every copy has finished here (the flushes waited for them): the end
  // event completes at once, and is read after "sent", outside the timing.
  if (gpu_span_ && stream != nullptr) RETURN_IF_ERROR(gpu_span_->end(*stream).WithContext(name()));
  // Every byte was read: a checkpoint file that changed meanwhile fails the refit.
  RETURN_IF_ERROR(source_->check_unchanged().WithContext(name() + ", refit " + std::to_string(version)));
  RETURN_IF_ERROR(client_->send(Progress{version, sent.bytes}));
  sent.shares = {EngineShare{engine_rank_, payload_of_buckets(plan_, trainer_index_, feeders_)}};
  return sent;
}

StatusOr<TrainerRank::Impl::SentShare> TrainerRank::Impl::send_sharded(std::uint64_t version, Deadline deadline) {
  const Clock::time_point went = Clock::now();
  ASSIGN_OR_RETURN(const ShardedSent sent, send_over_channels(channels_, version, deadline));
  const double send_ms = std::chrono::duration<double, std::milli>(Clock::now() - went).count();
  const SentShare share{sent.buckets, sent.bytes, send_ms, sent.shares};
  RETURN_IF_ERROR(source_->check_unchanged().WithContext(name() + ", refit " + std::to_string(version)));
  RETURN_IF_ERROR(client_->send(Progress{version, share.bytes}));
  return share;
}

Status TrainerRank::Impl::send_bucket(std::uint64_t version, std::uint64_t j, Deadline deadline) {
  CudaStream* stream = sending_->stream();
  ASSIGN_OR_RETURN(const bool die, before_bucket_faults(options_, version, stream));
  RETURN_IF_ERROR(sending_->send(version, j, deadline));
  const std::string what = "bucket " + std::to_string(j) + " of refit " + std::to_string(version);
  return after_bucket_faults(options_, name(), version, what, die, j == trainer_index_, stream);
}

StatusOr<Json> TrainerRank::Impl::share_stats(const SentShare& sent) {
  Json stats{{"buckets", sent.buckets}, {"bytes", sent.bytes}, {"send_ms", sent.send_ms},
             {"memory_path", memory_path()}};
  if (bases_) add_delta_fields(stats, protocol_.tally(), bases_->bytes_held());
  if (device_bases_) add_delta_fields(stats, protocol_.tally(), device_bases_->bytes_held());
  add_share_fields(stats, sent.shares, gathered_bytes(*source_));
  if (gpu_span_) RETURN_IF_ERROR(gpu_span_->add_to(stats).WithContext(name()));
  return stats;
}

Status TrainerRank::Impl::await_commit(std::uint64_t version, Deadline deadline) {
  auto commit = client_->wait_for<Commit>(deadline);
  if (!commit.ok()) {
    in_doubt_ = client_->lost();
    return in_doubt_ ? commit_in_doubt(version, committed_, commit.status()) : commit.status();
  }
  if (commit->version != version) {
    return InvalidArgument("protocol error: the coordinator committed refit " + std::to_string(commit->version) +
                           " during refit " + std::to_string(version));
  }
  return Status::Ok();
}

void TrainerRank::Impl::commit_bases(std::uint64_t version) {
  if (partial_touched_ != nullptr) {  // sent by the plain sender, by the subset plan
    // The untouched bases hold what the engine rank serves only when every
    // credit named the version they hold (else: all go, the next refit is full).
    const std::uint64_t held = device_bases_ ? device_bases_->base_version() : bases_ ? bases_->base_version() : 0;
    const std::vector<bool> every(partial_touched_->size(), true);  // (plan_ is still the subset plan here)
    const std::vector<bool>& dropped = protocol_.tally().every_credit_named(held) ? *partial_touched_ : every;
    if (device_bases_) device_bases_->commit_partial(version, dropped);
    if (bases_) bases_->commit_partial(version, dropped);
    partial_touched_ = nullptr;
    return;
  }
  if (device_bases_) device_bases_->commit(version);
  if (!bases_) return;
  if (Status kept = bases_->commit(version); !kept.ok()) {
    log(LogLevel::kError, name(), kept.ToString() + "; the next refit sends every bucket as it is");
  }
}

std::string TrainerRank::Impl::memory_path() const {
  if (!source_on_device_) return "host";
  return transport_->capabilities().device_memory_staged ? "host-staged" : "cuda";
}

TrainerRank::TrainerRank(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TrainerRank::~TrainerRank() = default;

StatusOr<std::unique_ptr<TrainerRank>> TrainerRank::Join(const RankOptions& options,
                                                         std::unique_ptr<WeightSource> source) {
  if (!source) return InvalidArgument("trainer rank " + std::to_string(options.rank) + ": no weight source");
  auto impl = std::make_unique<Impl>(options, std::move(source));
  if (Status setup = impl->setup(); !setup.ok()) {
    impl->report_setup_failure(setup);
    return setup.WithContext(impl->name());
  }
  return std::unique_ptr<TrainerRank>(new TrainerRank(std::move(impl)));
}

Status TrainerRank::serve() {
  const Status status = impl_->serve();  // before reading the version it leaves
  return with_committed_version(status, impl_->committed_version()).WithContext(impl_->name());
}
Status TrainerRank::refit(std::uint64_t version, const std::vector<std::string>& only) {
  const Status status = impl_->refit(version, only);
  return with_committed_version(status, impl_->committed_version()).WithContext(impl_->name());
}
Status TrainerRank::finish() { return impl_->finish().WithContext(impl_->name()); }
std::uint64_t TrainerRank::committed_version() const { return impl_->committed_version(); }
std::optional<TrainerRefitReport> TrainerRank::last_refit() const { return impl_->last_refit(); }
bool TrainerRank::on_demand() const { return impl_->on_demand(); }
bool TrainerRank::recovered() const { return impl_->recovered(); }

}  // namespace refit
