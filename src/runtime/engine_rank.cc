// The engine role: see engine_rank.h and roles.h; its state and steps in
// engine_rank_impl.h.
#include "runtime/engine_rank_impl.h"

namespace refit {

Status EngineRank::Impl::serve() {
  for (;;) {
    auto version = next();
    if (!version.ok() && recovered_) continue;  // the failed refit is reported; serve the next one
    if (!version.ok()) return version.status();
    if (!*version) return Status::Ok();
  }
}

StatusOr<std::optional<std::uint64_t>> EngineRank::Impl::next() {
  recovered_ = false;
  ASSIGN_OR_RETURN(std::optional<Start> start,
                   client_->wait_for_start_while_alive({[this](const Acquire& a) { return acquire(a); },
                                                        [this](const Relink& r) { return reroute(r); },
                                                        [this](const CatchUp& c) { return catch_up(c); }}));
  if (!start) return std::optional<std::uint64_t>();
  const std::uint64_t version = start->version;
  std::optional<PlanSwap> partial;
  Status status = refit(*start, partial);
  if (status.ok()) last_only_ = start->only;
  if (!status.ok() && relay_) {
    relay_->cancel(status);  // its workers leave the failed refit's buckets
    if (partial) (void)relay_->wait_idle(Deadline::AfterSeconds(options_.bucket_timeout_s));
  }
  partial.reset();  // the setup's plans again: nothing of the refit reads the subset's
  // Committed: a failed release ends the job (the coordinator's verdict), never aborts the version.
  if (status.ok() && release_) RETURN_IF_ERROR(release_after(version));
  if (!status.ok()) {
    engine_->abort(version, status);  // the version stays at the last committed one
    // In doubt: the coordinator is lost, nobody to report to or relink with.
    if (in_doubt_) return status;
    // A broken CUDA context (a sticky error) fails every later refit the
    // same way: report it, and end this process instead of relinking.
    const Status health = on_device_ ? cuda_context_health(device_) : Status::Ok();
    if (!health.ok()) status = Status(health.code(), status.message() + "; " + health.message());
    status = client_->report_failure(version, status);
    if (!health.ok()) {
      // Exit only once the coordinator took the report (its relink or
      // shutdown), so that the job's error is this cause, not this exit.
      (void)client_->wait_for_recovery(Deadline::AfterSeconds(options_.setup_timeout_s));
      return status;
    }
    auto recovered = recover();
    if (!recovered.ok()) return status.WithContext("recovery failed: " + recovered.status().message());
    recovered_ = *recovered;
    return status;
  }
  return std::optional<std::uint64_t>(version);
}

// Setup, in steps: check the options and the binding, allocate the
// receive pool (or expose the weights), join the coordinator, adopt its
// Setup, accept the trainers' data links, say linked.
Status EngineRank::Impl::setup() {
  Deadline deadline = Deadline::AfterSeconds(options_.setup_timeout_s);
  RETURN_IF_ERROR(check_binding());
  ASSIGN_OR_RETURN(HeartbeatTiming heartbeats,
                   heartbeat_timing(options_.heartbeat_interval_s, options_.heartbeat_timeout_s, name()));
  options_.bucket_size = effective_bucket_size(options_.bucket_size, options_.transport);
  ASSIGN_OR_RETURN(plan_, make_plan(binding_.stream, options_.bucket_size));
  ASSIGN_OR_RETURN(transport_, make_transport(options_.transport));
  ASSIGN_OR_RETURN(std::unique_ptr<TargetMemory> pool, make_pool());
  const std::string descriptor = pool ? pool->descriptor() : "none";
  RETURN_IF_ERROR(check_listen_without_secret(options_.listen_host, Secret(options_.secret),
                                              name() + "'s data port", "--listen-host " + options_.listen_host));
  ASSIGN_OR_RETURN(listener_, Listener::Listen(options_.listen_host, 0));

  stage_ = SetupStage::kJoining;
  ASSIGN_OR_RETURN(client_, ControlClient::Connect(options_.coordinator, Secret(options_.secret), deadline));
  ASSIGN_OR_RETURN(Setup setup, client_->join(make_join(descriptor), deadline));
  stage_ = SetupStage::kJoined;
  // From its Setup on, the coordinator and this rank watch each other's
  // heartbeats; an abort cancels whatever the receiver waits for.
  client_->start_reader(heartbeats, [this](const Status& why) {
    std::lock_guard<std::mutex> lock(data_mu_);
    if (receiver_) receiver_->cancel(why);
    if (relay_) relay_->cancel(why);
  });
  if (!pool && !direct_) return Internal("the coordinator accepted a receive pool that was never allocated");
  RETURN_IF_ERROR(adopt_setup(setup));
  RETURN_IF_ERROR(make_receiver(std::move(pool)));
  RETURN_IF_ERROR(accept_links(deadline));
  RETURN_IF_ERROR(link_relay(setup.relay, deadline));
  // Every trainer has opened the target: remove its name so a crash leaves nothing behind.
  RETURN_IF_ERROR(receiver_->pool().seal());
  return client_->send(Linked{});
}

// The options and the binding fit together (before anything is allocated).
Status EngineRank::Impl::check_binding() {
  RETURN_IF_ERROR(validate_rank_counts(options_.trainer_ranks, options_.engine_ranks));
  RETURN_IF_ERROR(validate_rank_settings(options_, /*engine=*/true));
  if (rank() < 0 || rank() >= options_.engine_ranks) {
    return InvalidArgument("--rank " + std::to_string(rank()) + " is outside 0.." +
                           std::to_string(options_.engine_ranks - 1) + " (--engine-ranks " +
                           std::to_string(options_.engine_ranks) + ")");
  }
  if (binding_.engine == nullptr) return InvalidArgument("no engine to apply the weights to");
  if (!binding_.rules.empty() && binding_.rules.size() != binding_.stream.size()) {
    return InvalidArgument(std::to_string(binding_.rules.size()) + " shard rules for a stream of " +
                           std::to_string(binding_.stream.size()) + " tensors");
  }
  engine_ = binding_.engine;
  direct_ = options_.mode == "direct";
  on_device_ = binding_.memory == MemoryKind::kCuda;
  device_ = binding_.device;
  if (on_device_ != (options_.device == "cuda")) {
    return InvalidArgument("--device " + options_.device + " but the engine's weights are in " +
                           (on_device_ ? "device" : "host") + " memory");
  }
  if (direct_) {  // with shadow weights both arenas, shadow_arena_stride apart
    const std::uint64_t need = (binding_.shadow ? 2 : 1) * shadow_arena_stride(binding_.stream);
    if (binding_.arena == nullptr || binding_.arena_bytes < need) {
      return InvalidArgument("direct mode needs the engine's weight arena" +
                             std::string(binding_.shadow ? "s (two, shadow weights: " : " (") + std::to_string(need) +
                             " bytes laid out by weight_arena_offsets), got " + std::to_string(binding_.arena_bytes));
    }
  }
  return Status::Ok();
}

// The receive pool (staged) or the engine's weights exposed as the
// receiver's one slot (direct: trainers write into the weights
// themselves). Null when the pool would exceed --memory-limit: the rank
// joins with a placeholder and the coordinator names the setting for
// every rank.
StatusOr<std::unique_ptr<TargetMemory>> EngineRank::Impl::make_pool() {
  if (direct_) return transport_->expose_memory(binding_.arena, binding_.arena_bytes, binding_.memory, device_);
  PoolOptions pool_options;
  pool_options.slot_bytes = pool_slot_bytes(plan_);
  options_.pool_slots = effective_pool_slots(options_.pool_slots, pool_options.slot_bytes, options_.memory_limit);
  pool_options.slots = options_.pool_slots;
  pool_options.owner = name();
  pool_options.memory = binding_.memory;
  pool_options.device = device_;
  if (options_.memory_limit != 0 &&
      static_cast<std::uint64_t>(std::max(options_.pool_slots, 0)) * pool_options.slot_bytes > options_.memory_limit) {
    pool_options.slots = 0;
  }
  if (pool_options.slots < 2) return std::unique_ptr<TargetMemory>();
  return transport_->create_target(pool_options);
}

refit::Join EngineRank::Impl::make_join(const std::string& descriptor) const {
  refit::Join join;
  join.role = Role::kEngine;
  join.rank = rank();
  join.engine = static_cast<std::uint64_t>(options_.engine);
  join.pid = ::getpid();
  join.device = options_.device;
  join.mode = options_.mode;
  join.trainer_ranks = static_cast<std::uint64_t>(options_.trainer_ranks);
  join.engine_ranks = static_cast<std::uint64_t>(options_.engine_ranks);
  join.bucket_size = options_.bucket_size;
  join.transport = options_.transport;
  join.plan_digest = plan_.digest_hex();
  join.quantize = options_.quantize;
  const StatusOr<std::uint64_t> change = change_parts(options_.change_fraction);  // checked in check_binding
  join.change = change.ok() ? *change : kEveryElement;
  join.delta = options_.delta;
  join.quantized_tensors = binding_.quantized_tensors;
  join.shadow = binding_.shadow;
  join.partial = engine_->takes_partial_refits();
  // It can send its committed weights to an engine that joins (read back
  // from its weights in staged mode).
  join.catch_up = binding_.read_committed && !direct_;
  join.data_address = listener_->address();
  join.descriptor = descriptor;
  join.pool_slots = direct_ ? 2 : static_cast<std::uint64_t>(std::max(options_.pool_slots, 0));
  join.memory_limit = options_.memory_limit;
  if (options_.supported_dtypes.empty()) {
    for (int d = 0; d < kDTypeCount; ++d) join.supported_dtypes.emplace_back(dtype_name(static_cast<DType>(d)));
  } else {
    join.supported_dtypes = options_.supported_dtypes;
  }
  join.specs = binding_.stream;
  join.rules = binding_.rules;
  if (on_device_) {  // for the coordinator's check of ranks sharing a GPU
    if (auto uuid = cuda_device_uuid(device_); uuid.ok()) join.gpu = *uuid;
  }
  return join;
}

// The coordinator's Setup: the seed, every rank's stream as it validated
// them (the peers' plans replay their batch boundaries so that every rank
// of the engine computes the same aligned batches without talking to the
// others) and the trainer ranks that feed this one, in trainer-index order.
Status EngineRank::Impl::adopt_setup(const Setup& setup) {
  seed_ = setup.seed;
  if (setup.engine != static_cast<std::uint64_t>(options_.engine)) {
    return Internal("setup: the coordinator's setup is for engine " + std::to_string(setup.engine));
  }
  engines_ = setup.engines;
  release_ = setup.release_between_refits;
  if (setup.streams.size() != static_cast<std::size_t>(options_.engine_ranks)) {
    return InvalidArgument("setup: 'streams' must hold one spec list per engine rank");
  }
  const std::vector<std::vector<TensorSpec>>& streams = setup.streams;
  if (!binding_.expected_streams.empty() && streams != binding_.expected_streams) {
    return FailedPrecondition(name() + ": the engine's ranks disagree on the model: the streams the coordinator "
                              "collected differ from this rank's sharding of --model " + options_.model);
  }
  if (streams[static_cast<std::size_t>(rank())] != binding_.stream) {
    return Internal("setup: the coordinator's copy of this rank's stream differs from the one it sent");
  }
  peer_plans_.resize(streams.size());
  for (std::size_t r = 0; r < streams.size(); ++r) {
    if (static_cast<int>(r) == rank()) continue;
    ASSIGN_OR_RETURN(peer_plans_[r], make_plan(streams[r], options_.bucket_size));
  }
  if (setup.feeders.empty()) {
    return InvalidArgument("setup: 'feeders' must list the trainer ranks that feed this engine rank");
  }
  feeders_ = setup.feeders;
  return adopt_parts(setup.parts);
}

// Sharded trainers: several feeders write parts of a bucket (the
// coordinator checked that the parts fill each bucket); none: each bucket
// comes whole from one feeder.
Status EngineRank::Impl::adopt_parts(const std::vector<std::vector<Part>>& parts) {
  parts_.clear();
  if (parts.empty()) return Status::Ok();
  if (parts.size() != plan_.buckets.size()) {
    return InvalidArgument("setup: 'parts' lists " + std::to_string(parts.size()) + " buckets, the plan has " +
                           std::to_string(plan_.buckets.size()));
  }
  parts_.assign(parts.size(), {});
  for (std::size_t j = 0; j < parts.size(); ++j) {
    for (const Part& p : parts[j]) parts_[j].push_back(BucketContributor{p.index, p.bytes});
  }
  return Status::Ok();
}

Status EngineRank::Impl::refit(const Start& start, std::optional<PlanSwap>& partial) {
  const std::uint64_t version = start.version;
  fire_fault_hook(options_.debug_fault, ProtocolStep::kStart, version, name());
  ASSIGN_OR_RETURN(PlanSwap swapped, use_scope(version, start.only));
  partial.emplace(std::move(swapped));
  // A partial refit's buckets come as they are, but its credits still name the base: the trainers
  // keep the bases it left untouched only when this rank holds that version (commit_partial).
  if (options_.delta && !direct_) RETURN_IF_ERROR(receiver_->set_delta_base(delta_base(), binding_.read_committed));
  RETURN_IF_ERROR(begin_engine(version, start.only));
  // Direct mode has no credits: trainers announce buckets as soon as they
  // see "go", so the receiver takes this refit's frames before "ready".
  if (direct_) RETURN_IF_ERROR(receiver_->start(version, Deadline::AfterSeconds(options_.refit_timeout_s)));
  fire_fault_hook(options_.debug_fault, ProtocolStep::kReady, version, name());
  RETURN_IF_ERROR(client_->send(Ready{version, plan_.digest_hex()}));
  Deadline deadline = Deadline::AfterSeconds(options_.refit_timeout_s);
  ASSIGN_OR_RETURN(Go go, client_->wait_for<Go>(deadline));
  (void)go;
  fire_fault_hook(options_.debug_fault, ProtocolStep::kGo, version, name());
  if (direct_) return finish_direct(version, deadline);
  const auto went = std::chrono::steady_clock::now();
  if (relay_) relay_->begin(version, deadline);
  RETURN_IF_ERROR(receiver_->start(version, deadline));

  std::vector<PlanReplay> replays;
  replays.reserve(peer_plans_.size());
  std::vector<BatchSource*> sources;
  for (std::size_t r = 0; r < peer_plans_.size(); ++r) replays.emplace_back(&peer_plans_[r], static_cast<int>(r));
  for (std::size_t r = 0; r < peer_plans_.size(); ++r) {
    sources.push_back(static_cast<int>(r) == rank() ? static_cast<BatchSource*>(receiver_.get()) : &replays[r]);
  }
  ASSIGN_OR_RETURN(Aligner aligner, Aligner::Create(sources));
  std::uint64_t aligned = 0;
  // Where this rank's refit time goes: waiting for batches, applying them.
  std::chrono::steady_clock::duration waiting{}, applying{};
  for (;;) {
    // A batch that does not come within the bucket deadline means a
    // stalled or dead trainer rank.
    const auto asked = std::chrono::steady_clock::now();
    auto batch = aligner.next(deadline.min(Deadline::AfterSeconds(options_.bucket_timeout_s)));
    const auto got = std::chrono::steady_clock::now();
    waiting += got - asked;
    if (!batch.ok() && batch.status().code() == StatusCode::kDeadlineExceeded && !deadline.expired()) {
      return DeadlineExceeded(name() + " received no bucket for " + format_seconds(options_.bucket_timeout_s) +
                              " after " + std::to_string(aligned) + " aligned batches of refit " +
                              std::to_string(version) + " (a stalled or dead trainer rank; --bucket-timeout): " +
                              batch.status().message());
    }
    if (!batch.ok()) return batch.status();
    if (!*batch) break;
    RETURN_IF_ERROR(engine_->apply(**batch));
    applying += std::chrono::steady_clock::now() - got;
    ++aligned;
  }
  if (relay_) RETURN_IF_ERROR(relay_->finish(deadline));  // every child has every bucket
  const auto sent = std::chrono::steady_clock::now();
  fire_fault_hook(options_.debug_fault, ProtocolStep::kSent, version, name());
  RETURN_IF_ERROR(client_->send(Sent{version}));
  ASSIGN_OR_RETURN(const bool verified, verify(version));
  ReceiverStats stats = receiver_->stats();
  Json done{{"buckets", stats.buckets},
            {"batches", stats.batches},
            {"tensors", stats.tensors},
            {"bytes", stats.bytes},
            {"refit_bytes", plan_.total_bytes},
            {"aligned_batches", aligned},
            {"wait_ms", std::chrono::duration<double, std::milli>(waiting).count()},
            {"apply_ms", std::chrono::duration<double, std::milli>(applying).count()},
            {"refit_ms", std::chrono::duration<double, std::milli>(sent - went).count()}};
  if (relay_) done["relay_bytes"] = relay_->forwarded_bytes();
  if (options_.delta) done["delta"] = Json{{"wire_bytes", stats.wire_bytes}, {"words_buckets", stats.words_buckets}};
  return report_and_commit(version, deadline, verified, std::move(done));
}

// Direct mode: the trainers write every byte into the weights; this rank
// waits until the receiver saw every bucket's kLanded, in any order, from
// the link that feeds it (the receiver checks every frame, as in staged mode).
Status EngineRank::Impl::finish_direct(std::uint64_t version, Deadline deadline) {
  RETURN_IF_ERROR(receiver_->wait_all_landed(deadline));
  const std::uint64_t buckets = plan_.buckets.size(), bytes = receiver_->stats().bytes;
  fire_fault_hook(options_.debug_fault, ProtocolStep::kSent, version, name());
  RETURN_IF_ERROR(client_->send(Sent{version}));
  ASSIGN_OR_RETURN(const bool verified, verify(version));
  return report_and_commit(version, deadline, verified,
                           Json{{"buckets", buckets},
                                {"batches", 0},
                                {"tensors", moving_.empty() ? plan_.specs.size() : static_cast<std::size_t>(
                                                std::count(moving_.begin(), moving_.end(), true))},
                                {"bytes", bytes},
                                {"refit_bytes", plan_.total_bytes},
                                {"aligned_batches", 0}});
}

// The binding's check of refit `version`: true once every byte was
// compared and matched, false when there is no check (an error when a
// byte differs). What the Done's `verified` says.
StatusOr<bool> EngineRank::Impl::verify(std::uint64_t version) {
  if (!binding_.verify) return false;
  RETURN_IF_ERROR(binding_.verify(version, seed_, moving_));
  return true;
}

Status EngineRank::Impl::report_and_commit(std::uint64_t version, Deadline deadline, bool verified, Json stats) {
  // Where the bytes landed, for the report: "host", "cuda" (device memory
  // the transport writes itself), "host-staged" (through pinned host buffers).
  const char* memory_path = !on_device_                                         ? "host"
                            : transport_->capabilities().device_memory_staged ? "host-staged"
                                                                              : "cuda";
  stats["shadow"] = binding_.shadow;
  if (binding_.weight_memory_bytes != 0) stats["weight_memory_bytes"] = binding_.weight_memory_bytes;
  if (binding_.read_counts) {
    const ReadCounts reads = binding_.read_counts();
    stats["reads"] = reads.reads;
    stats["torn_reads"] = reads.torn_reads;
  }
  fire_fault_hook(options_.debug_fault, ProtocolStep::kDone, version, name());
  RETURN_IF_ERROR(client_->send(Done{version, verified, std::move(stats), memory_path}));
  // The coordinator decides the commit once every rank is done; until its
  // Commit arrives nothing here (the weights' version, --save) moves.
  auto commit = client_->wait_for<Commit>(deadline);
  if (!commit.ok()) {
    in_doubt_ = client_->lost();
    return in_doubt_ ? commit_in_doubt(version, engine_->weight_version(), commit.status()) : commit.status();
  }
  if (commit->version != version) {
    return InvalidArgument("protocol error: the coordinator committed refit " + std::to_string(commit->version) +
                           " during refit " + std::to_string(version));
  }
  fire_fault_hook(options_.debug_fault, ProtocolStep::kCommit, version, name());
  RETURN_IF_ERROR(engine_->commit(version));
  fire_fault_hook(options_.debug_fault, ProtocolStep::kCommitted, version, name());
  // From here `version` is committed for this rank whatever the
  // coordinator hears: a lost acknowledgement is a lost coordinator, which
  // the next wait reports.
  Status acked = client_->send(Committed{engine_->weight_version()});
  if (!acked.ok()) log(LogLevel::kWarning, name(), "refit " + std::to_string(version) + " committed; " + acked.message());
  return Status::Ok();
}

EngineRank::EngineRank(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EngineRank::~EngineRank() = default;

StatusOr<std::unique_ptr<EngineRank>> EngineRank::Join(const EngineOptions& options, EngineBinding binding) {
  auto impl = std::make_unique<Impl>(options, std::move(binding));
  if (Status setup = impl->setup(); !setup.ok()) {
    impl->report_setup_failure(setup);
    return setup.WithContext(impl->name());
  }
  return std::unique_ptr<EngineRank>(new EngineRank(std::move(impl)));
}

Status EngineRank::serve() {
  const Status status = impl_->serve();  // before reading the version it leaves
  return with_committed_version(status, impl_->committed_version()).WithContext(impl_->name());
}

bool EngineRank::recovered() const { return impl_->recovered(); }
std::uint64_t EngineRank::seed() const { return impl_->seed(); }
std::vector<std::string> EngineRank::last_only() const { return impl_->last_only_; }

StatusOr<std::optional<std::uint64_t>> EngineRank::next() {
  auto version = impl_->next();
  if (!version.ok()) {
    return with_committed_version(version.status(), impl_->committed_version()).WithContext(impl_->name());
  }
  return version;
}

}  // namespace refit
