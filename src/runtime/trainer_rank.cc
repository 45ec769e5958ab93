// The trainer role: see trainer_rank.h and roles.h.
#include "refit/trainer_rank.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <vector>

#include "control/auth.h"
#include "control/control_client.h"
#include "core/refit_tally.h"
#include "cuda/device.h"
#include "delta/bucket_bases.h"
#include "net/frames.h"
#include "refit/coordinator.h"
#include "refit/format.h"
#include "refit/model.h"
#include "refit/plan.h"
#include "refit/reference_engine.h"
#include "refit/trainer_layout.h"
#include "runtime/bucket_faults.h"
#include "runtime/bucket_sender.h"
#include "runtime/data_connect.h"
#include "runtime/engine_link_protocol.h"
#include "runtime/gpu_span.h"
#include "runtime/expert_source.h"
#include "runtime/quantized_shards.h"
#include "runtime/quantized_source.h"
#include "runtime/setup_failure.h"
#include "runtime/shard_channel.h"
#include "runtime/trainer_join.h"
#include "runtime/trainer_share.h"
#include "transport/transport.h"
#include "refit/log.h"

namespace refit {

using Clock = std::chrono::steady_clock;

// The protocol of a trainer rank: join, link, and per refit ready, go,
// credits and kLanded (its EngineLinkProtocol, which its sender calls),
// sent, done, commit. How a bucket's bytes move is the BucketSender's business.
class TrainerRank::Impl {
 public:
  Impl(const RankOptions& options, std::unique_ptr<WeightSource> source)
      : options_(options), source_(std::move(source)), protocol_(name(), &plan_, options.bucket_timeout_s) {}
  // The control reader shuts channels' links down until the client goes:
  // the channels go first, under the lock it takes.
  ~Impl() {
    std::lock_guard<std::mutex> lock(link_mu_);
    channels_.clear();
  }

  Status serve() {
    if (on_demand_) {
      return FailedPrecondition(name() + ": the coordinator runs refits on demand (--refits 0): call refit(version)");
    }
    for (;;) {
      recovered_ = false;
      ASSIGN_OR_RETURN(std::optional<Start> start, client_->wait_for_start_while_alive(on_acquire()));
      if (!start) {
        log(LogLevel::kInfo, name(), tally_.summary("sent", "committed"));  // the job ended well
        return Status::Ok();
      }
      land_in(start->arena);
      Status status = refit_or_report(start->version);
      if (!status.ok() && !recovered_) return status;
    }
  }

  Status refit(std::uint64_t version) {
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
    // A job that ended meanwhile (a rank lost while this one was idle)
    // answers with its reason, not with a failed send.
    if (std::optional<Status> ended = client_->abort_reason()) return *ended;
    if (Status asked = client_->send(Request{version}); !asked.ok()) {
      return client_->await_abort_reason(std::chrono::milliseconds(500)).value_or(asked);
    }
    ASSIGN_OR_RETURN(std::optional<Start> start, client_->wait_for_start_while_alive(on_acquire()));
    if (!start) return Aborted(name() + ": the coordinator shut the job down");
    const std::uint64_t started = start->version;
    if (started != version) {
      return FailedPrecondition(name() + ": asked for refit " + std::to_string(version) +
                                " but the coordinator started " + std::to_string(started) +
                                " (every trainer rank must ask for the same version)");
    }
    land_in(start->arena);
    return refit_or_report(version, called);
  }

  Status finish() {
    if (!on_demand_ || finished_) return Status::Ok();
    finished_ = true;
    RETURN_IF_ERROR(client_->send(Finish{}));
    ASSIGN_OR_RETURN(Shutdown shutdown, client_->wait_for<Shutdown>(Deadline::AfterSeconds(options_.refit_timeout_s)));
    (void)shutdown;
    log(LogLevel::kInfo, name(), tally_.summary("sent", "committed"));  // the job ended well
    return Status::Ok();
  }

  std::uint64_t committed_version() const { return committed_; }
  const std::optional<TrainerRefitReport>& last_refit() const { return last_refit_; }
  bool on_demand() const { return on_demand_; }
  bool recovered() const { return recovered_; }

  std::string name() const { return "trainer rank " + std::to_string(options_.rank); }
  ControlClient::BetweenRefits on_acquire() {
    return {[this](const Acquire& a) { return acquire(a); }, {}, {}};
  }

  // Direct mode over shadow weights: the arena the coming refit writes
  // (Start::arena; 0 otherwise), in the engine rank's region or each fed one's.
  void land_in(std::uint64_t arena) {
    landing_ = arena * shadow_arena_stride(plan_.specs);
    for (auto& channel : channels_) channel->land_in(arena);
  }

  // Tells the coordinator why setup failed (runtime/setup_failure.h): by a
  // SetupFailed before joining, a Failed after; not while joining (the
  // coordinator refused this rank, or cannot be reached).
  void report_setup_failure(const Status& error) {
    if (stage_ == SetupStage::kLocal) refit::report_setup_failure(options_, Role::kTrainer, error);
    if (stage_ == SetupStage::kJoined) (void)client_->send(Failed{0, error});
  }

  Status setup() {
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
      bases_.emplace(std::move(sends));
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

  // The data link to the engine rank, its transport target from
  // `descriptor` and the sender over them (setup, and after an acquire).
  Status link_engine(const std::string& descriptor, Deadline deadline) {
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

  // A sharded rank's links: one channel per engine rank it feeds.
  Status link_sharded(const Setup& setup, Deadline deadline) {
    on_demand_ = setup.on_demand;
    targets_ = setup.targets;
    RETURN_IF_ERROR(link_channels(deadline));
    return client_->send(Linked{});
  }

  Status link_channels(Deadline deadline) {
    ASSIGN_OR_RETURN(auto channels,
                     link_shard_channels(options_, *sharded_, targets_, client_.get(), source_.get(), deadline));
    {
      std::lock_guard<std::mutex> lock(link_mu_);  // the control reader shuts them down
      channels_ = std::move(channels);
    }
    return Status::Ok();
  }

  // --release-between-refits, once this rank said committed: on the
  // coordinator's release the sender (its staging), the transport targets
  // (the mappings of the engine ranks' pools) and the data links go, so
  // that the engines' pools can return to the device.
  Status release_after(std::uint64_t version) {
    ASSIGN_OR_RETURN(Release release, client_->wait_for<Release>(Deadline::AfterSeconds(options_.setup_timeout_s)));
    if (release.version != version) {
      return InvalidArgument("protocol error: the coordinator asked to release after refit " +
                             std::to_string(release.version) + " during refit " + std::to_string(version));
    }
    gpu_span_.reset();
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

  // Before the next start (after a release): the engine ranks' new pools,
  // opened and linked as at setup; a failure is reported to the coordinator.
  Status acquire(const Acquire& acquire) {
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

 private:
  // A data-plane connection to the engine rank (setup, recovery, acquire).
  StatusOr<std::unique_ptr<Link>> connect_to_engine(Deadline deadline) {
    return connect_data_link(options_, engine_rank_, engine_address_, *client_, deadline);
  }

  Status send_hello(Deadline deadline) {
    const HelloFrame hello{static_cast<std::uint64_t>(options_.rank), static_cast<std::uint64_t>(engine_rank_),
                           plan_.digest};
    return link_->send(encode(hello), {}, deadline);
  }

  // Chooses this rank's bucket sender, once (bucket_sender.h). `writer`: the
  // device that copies (-1: none).
  Status make_sender(int writer) {
    SenderContext context;
    context.name = name();
    context.plan = &plan_;
    context.source = source_.get();
    context.pack_rank = pack_rank_;
    context.engine_ranks = options_.engine_ranks;
    context.target = target_.get();
    context.protocol = &protocol_;
    context.delta_bases = bases_ ? &*bases_ : nullptr;
    // Direct mode writes into the engine's weight arena, laid out the same
    // way from the engine rank's stream.
    if (direct_) context.arena_offsets = weight_arena_offsets(plan_.specs, nullptr);
    context.landing = &landing_;
    SenderSettings settings;
    settings.direct = direct_;
    settings.weights_on_device = source_on_device_;
    settings.target_on_device = target_on_device_;
    settings.register_host_weights = options_.register_host_weights;
    settings.delta = options_.delta;
    settings.gpu = writer;
    settings.transport = options_.transport;
    settings.capabilities = transport_->capabilities();
    ASSIGN_OR_RETURN(sender_, make_bucket_sender(std::move(context), settings));
    if (!source_on_device_ || sender_->stream() == nullptr) return Status::Ok();
    ASSIGN_OR_RETURN(gpu_span_, GpuSpan::Create(writer));
    return Status::Ok();
  }

  // Runs refit `version`. On failure: reports it, then recovers when the
  // coordinator says so ("relink": a fresh data-plane connection over the
  // same transport target and registrations) and returns the refit's error
  // with recovered_ set; a coordinator that shuts down or is lost leaves the
  // error fatal.
  // `called`: when the caller began this refit (the report's seconds).
  Status refit_or_report(std::uint64_t version, Clock::time_point called = Clock::now()) {
    recovered_ = false;
    Status status = run_refit(version, called);
    if (status.ok()) return Status::Ok();
    // In doubt: the coordinator is lost, nobody to report to or relink with.
    if (in_doubt_) return status;
    // A broken CUDA context (a sticky error) fails every later refit the same
    // way: report it, and end this process instead of relinking.
    const Status health = sender_ != nullptr && sender_->stream() != nullptr
                              ? cuda_context_health(sender_->stream()->device())
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
    for (auto& c : channels_) c->abandon();
    if (bases_) bases_->drop_pending();
    auto relink = client_->wait_for_recovery(Deadline::AfterSeconds(options_.setup_timeout_s));
    if (!relink.ok() || !*relink) return status;
    Deadline deadline = Deadline::AfterSeconds(options_.setup_timeout_s);
    Status relinked = sharded_ ? relink_channels(channels_, deadline) : relink_engine(deadline);
    if (relinked.ok()) relinked = client_->send(Linked{committed_, std::nullopt});
    if (!relinked.ok()) return status.WithContext("recovery failed: " + relinked.message());
    log(LogLevel::kWarning, name(),
        "refit " + std::to_string(version) + " failed (" + status.message() + "); relinked, ready for the next refit");
    recovered_ = true;
    return status;
  }

  // Recovery of the one engine link: a fresh data-plane connection over the
  // same transport target, and the hello again.
  Status relink_engine(Deadline deadline) {
    ASSIGN_OR_RETURN(auto fresh, connect_to_engine(deadline));
    {
      std::lock_guard<std::mutex> lock(link_mu_);
      link_->adopt(*fresh);
    }
    RETURN_IF_ERROR(target_->relinked());  // nccl: a new communicator at the next submit
    return send_hello(deadline);
  }

  Status run_refit(std::uint64_t version, Clock::time_point called) {
    TrainerRefitReport report;
    report.version = version;
    report.wait_start_s = seconds_since(called);
    protocol_.begin_refit();
    if (bases_) bases_->drop_pending();
    fire_fault_hook(options_.debug_fault, ProtocolStep::kStart, version, name());
    RETURN_IF_ERROR(source_->prepare(version, seed_).WithContext(name() + ", preparing the weights of refit " +
                                                                  std::to_string(version)));
    fire_fault_hook(options_.debug_fault, ProtocolStep::kReady, version, name());
    RETURN_IF_ERROR(client_->send(Ready{version}));
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

  // What this rank sent of one refit.
  struct SentShare {
    std::uint64_t buckets = 0, bytes = 0;
    double send_ms = 0;               // from 'go' until every copy finished
    std::vector<EngineShare> shares;  // payload bytes per engine rank written into
  };

  // This rank's buckets of refit `version` (every feeders_-th from its
  // index), with progress every 50 ms; returns once every bucket is
  // announced and every copy finished, and the weights were checked
  // unchanged: only then may the rank say "sent".
  StatusOr<SentShare> send_share(std::uint64_t version, Deadline deadline) {
    if (sharded_) return send_sharded(version, deadline);
    const Clock::time_point went = Clock::now();
    CudaStream* stream = sender_->stream();  // the sender's copies, or null (host paths)
    if (gpu_span_) RETURN_IF_ERROR(gpu_span_->begin(*stream).WithContext(name()));
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
    RETURN_IF_ERROR(sender_->finish(version, deadline));
    sent.send_ms = std::chrono::duration<double, std::milli>(Clock::now() - went).count();
    // Every copy has finished here (the flushes waited for them): the end
    // event completes at once, and is read after "sent", outside the timing.
    if (gpu_span_) RETURN_IF_ERROR(gpu_span_->end(*stream).WithContext(name()));
    // Every byte was read: a checkpoint file that changed meanwhile fails the refit.
    RETURN_IF_ERROR(source_->check_unchanged().WithContext(name() + ", refit " + std::to_string(version)));
    RETURN_IF_ERROR(client_->send(Progress{version, sent.bytes}));
    sent.shares = {EngineShare{engine_rank_, payload_of_buckets(plan_, trainer_index_, feeders_)}};
    return sent;
  }

  // A sharded rank's share of refit `version`: its part of every bucket of
  // every engine rank it feeds, one thread per engine rank.
  StatusOr<SentShare> send_sharded(std::uint64_t version, Deadline deadline) {
    const Clock::time_point went = Clock::now();
    ASSIGN_OR_RETURN(const ShardedSent sent, send_over_channels(channels_, version, deadline));
    const double send_ms = std::chrono::duration<double, std::milli>(Clock::now() - went).count();
    const SentShare share{sent.buckets, sent.bytes, send_ms, sent.shares};
    RETURN_IF_ERROR(source_->check_unchanged().WithContext(name() + ", refit " + std::to_string(version)));
    RETURN_IF_ERROR(client_->send(Progress{version, share.bytes}));
    return share;
  }

  // Bucket j of refit `version`, and the per-bucket fault injections for
  // tests (bucket_faults.h).
  Status send_bucket(std::uint64_t version, std::uint64_t j, Deadline deadline) {
    CudaStream* stream = sender_->stream();
    ASSIGN_OR_RETURN(const bool die, before_bucket_faults(options_, version, stream));
    RETURN_IF_ERROR(sender_->send(version, j, deadline));
    const std::string what = "bucket " + std::to_string(j) + " of refit " + std::to_string(version);
    return after_bucket_faults(options_, name(), version, what, die, j == trainer_index_, stream);
  }

  // The Done's stats of what this rank sent (gpu_span.h, engine_link_protocol.h).
  StatusOr<Json> share_stats(const SentShare& sent) {
    Json stats{{"buckets", sent.buckets}, {"bytes", sent.bytes}, {"send_ms", sent.send_ms},
               {"memory_path", memory_path()}};
    if (bases_) add_delta_fields(stats, protocol_.tally(), bases_->bytes_held());
    add_share_fields(stats, sent.shares, gathered_bytes(*source_));
    if (gpu_span_) RETURN_IF_ERROR(gpu_span_->add_to(stats).WithContext(name()));
    return stats;
  }

  // The coordinator decides refit `version` committed once every rank is
  // done; before its Commit nothing here treats it as committed. A
  // coordinator lost meanwhile leaves the refit in doubt here.
  Status await_commit(std::uint64_t version, Deadline deadline) {
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

  // --delta: what this refit sent becomes the base of the next (the
  // engines committed the same version). A base that does not decode is a
  // bug; the bases are then cleared and the next refit goes full.
  void commit_bases(std::uint64_t version) {
    if (!bases_) return;
    if (Status kept = bases_->commit(version); !kept.ok()) {
      log(LogLevel::kError, name(), kept.ToString() + "; the next refit sends every bucket as it is");
    }
  }
  static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

  // Where this rank's bytes are read from, for the report: "host",
  // "cuda" (device memory the transport reads itself), "host-staged".
  std::string memory_path() const {
    if (!source_on_device_) return "host";
    return transport_->capabilities().device_memory_staged ? "host-staged" : "cuda";
  }

  RankOptions options_;
  std::unique_ptr<WeightSource> source_;
  int engine_rank_ = 0;
  int pack_rank_ = 0;  // == engine_rank_ unless a test injects a fault
  Plan plan_;
  // Destroyed in reverse order: the client's reader thread (which may shut
  // the link down) stops first, then the target, then the link it uses.
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Link> link_;
  std::mutex link_mu_;  // the control reader's shutdown() vs recovery's adopt()
  std::string engine_address_;
  std::unique_ptr<RemoteTarget> target_;
  std::unique_ptr<ControlClient> client_;
  std::uint64_t seed_ = 0, trainer_index_ = 0, feeders_ = 1;
  bool source_on_device_ = false, target_on_device_ = false, direct_ = false;
  bool on_demand_ = false, finished_ = false;
  bool release_ = false;  // --release-between-refits (the setup says)
  bool recovered_ = false;  // the last failed refit was recovered from
  bool in_doubt_ = false;   // done sent, then the coordinator lost before its commit
  SetupStage stage_ = SetupStage::kLocal;
  std::uint64_t committed_ = 0;
  std::optional<TrainerRefitReport> last_refit_;  // the last committed refit's
  RefitTally tally_;                              // every committed refit, for the summary line
  std::uint64_t landing_ = 0;                     // the senders' SenderContext::landing
  EngineLinkProtocol protocol_;                   // credits and kLanded on link_, for the sender
  std::optional<BucketBases> bases_;              // --delta: what its buckets are encoded against
  // How this rank's buckets move (chosen once at setup; uses target_ and
  // link_, so declared after them: destroyed first).
  std::unique_ptr<BucketSender> sender_;
  // Sharded trainers (issue 19): the layout, the plans computed at setup and
  // one channel per engine rank fed (null / empty for full weights).
  TrainerLayout layout_;
  std::optional<ShardedPlan> sharded_;
  std::vector<std::unique_ptr<ShardChannel>> channels_;
  std::vector<EngineTarget> targets_;  // the setup's, with each acquire's descriptors

  std::optional<GpuSpan> gpu_span_;  // device weights: the refit on the sender's stream
};

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
Status TrainerRank::refit(std::uint64_t version) {
  const Status status = impl_->refit(version);
  return with_committed_version(status, impl_->committed_version()).WithContext(impl_->name());
}
Status TrainerRank::finish() { return impl_->finish().WithContext(impl_->name()); }
std::uint64_t TrainerRank::committed_version() const { return impl_->committed_version(); }
std::optional<TrainerRefitReport> TrainerRank::last_refit() const { return impl_->last_refit(); }
bool TrainerRank::on_demand() const { return impl_->on_demand(); }
bool TrainerRank::recovered() const { return impl_->recovered(); }

}  // namespace refit
