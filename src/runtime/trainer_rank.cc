// The trainer role: see trainer_rank.h and roles.h.
#include "runtime/trainer_rank.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <cstdio>
#include <vector>

#include "control/auth.h"
#include "control/control_client.h"
#include "control/coordinator.h"
#include "refit/batched_copy.h"
#include "refit/copy_engine.h"
#include "refit/device.h"
#include "refit/engine.h"
#include "refit/model.h"
#include "refit/plan.h"
#include "refit/shard_copy.h"
#include "refit/transport.h"
#include "runtime/model_choice.h"

namespace refit {

using Clock = std::chrono::steady_clock;

class TrainerRank::Impl {
 public:
  Impl(const RankOptions& options, std::unique_ptr<WeightSource> source)
      : options_(options), source_(std::move(source)) {}

  Status serve() {
    if (on_demand_) {
      return FailedPrecondition(name() + ": the coordinator runs refits on demand (--refits 0): call refit(version)");
    }
    for (;;) {
      recovered_ = false;
      ASSIGN_OR_RETURN(Json message, client_->wait_for("start", Deadline::Never(), "shutdown"));
      if (message["type"] == "shutdown") return Status::Ok();
      ASSIGN_OR_RETURN(std::uint64_t version, json_uint(message, "version"));
      Status status = refit_or_report(version);
      if (!status.ok() && !recovered_) return status;
    }
  }

  Status refit(std::uint64_t version) {
    recovered_ = false;
    if (!on_demand_) {
      return FailedPrecondition(name() + ": the coordinator schedules this job's refits (--refits N): call serve()");
    }
    if (finished_) return FailedPrecondition(name() + ": refit(" + std::to_string(version) + ") after finish()");
    if (version <= committed_) {
      return InvalidArgument(name() + ": refit version " + std::to_string(version) +
                             " is not above the last committed version " + std::to_string(committed_));
    }
    RETURN_IF_ERROR(client_->send(Json{{"type", "request"}, {"version", version}}));
    ASSIGN_OR_RETURN(Json message, client_->wait_for("start", Deadline::Never(), "shutdown"));
    if (message["type"] == "shutdown") return Aborted(name() + ": the coordinator shut the job down");
    ASSIGN_OR_RETURN(std::uint64_t started, json_uint(message, "version"));
    if (started != version) {
      return FailedPrecondition(name() + ": asked for refit " + std::to_string(version) +
                                " but the coordinator started " + std::to_string(started) +
                                " (every trainer rank must ask for the same version)");
    }
    return refit_or_report(version);
  }

  Status finish() {
    if (!on_demand_ || finished_) return Status::Ok();
    finished_ = true;
    RETURN_IF_ERROR(client_->send(Json{{"type", "finish"}}));
    ASSIGN_OR_RETURN(Json message, client_->wait_for("shutdown", Deadline::AfterSeconds(options_.refit_timeout_s)));
    (void)message;
    return Status::Ok();
  }

  std::uint64_t committed_version() const { return committed_; }
  bool on_demand() const { return on_demand_; }
  bool recovered() const { return recovered_; }

  std::string name() const { return "trainer rank " + std::to_string(options_.rank); }

  Status setup() {
    Deadline deadline = Deadline::AfterSeconds(options_.setup_timeout_s);
    RETURN_IF_ERROR(validate_rank_counts(options_.trainer_ranks, options_.engine_ranks));
    RETURN_IF_ERROR(validate_rank_settings(options_, /*engine=*/false));
    source_on_device_ = source_->memory() == MemoryKind::kCuda;
    direct_ = options_.mode == "direct";
    const Model& model = source_->model();
    engine_rank_ = options_.rank % options_.engine_ranks;
    pack_rank_ = options_.debug_pack_rank >= 0 ? options_.debug_pack_rank % options_.engine_ranks : engine_rank_;
    ASSIGN_OR_RETURN(plan_, make_plan(engine_stream(model, engine_rank_, options_.engine_ranks), options_.bucket_size));
    ASSIGN_OR_RETURN(transport_, make_transport(options_.transport));
    if (source_on_device_ && !transport_->capabilities().device_memory) {
      return FailedPrecondition(name() + ": its weights are in device memory but --transport " + options_.transport +
                                " moves host memory");
    }

    Json dtypes = Json::object();
    for (const TensorSpec& s : plan_.specs) {
      std::string d(dtype_name(s.dtype));
      if (!dtypes.contains(d)) dtypes[d] = s.name;
    }
    ASSIGN_OR_RETURN(client_, ControlClient::Connect(options_.coordinator, Secret(options_.secret), deadline));
    Json join{{"type", "join"},
              {"role", "trainer"},
              {"rank", options_.rank},
              {"pid", static_cast<int>(::getpid())},
              {"device", source_on_device_ ? "cuda" : "cpu"},
              {"mode", options_.mode},
              {"trainer_ranks", options_.trainer_ranks},
              {"engine_ranks", options_.engine_ranks},
              {"bucket_size", options_.bucket_size},
              {"transport", options_.transport},
              {"engine_rank", engine_rank_},
              {"plan_digest", plan_.digest_hex()},
              {"stream_dtypes", dtypes}};
    // Which physical GPU this rank uses (the coordinator warns where an nccl
    // job puts two ranks on one); a rank that cannot tell just says nothing.
    if (source_on_device_) {
      if (auto uuid = cuda_device_uuid(source_->device()); uuid.ok()) join["gpu"] = *uuid;
    }
    ASSIGN_OR_RETURN(Json setup, client_->join(join, deadline));
    ASSIGN_OR_RETURN(seed_, json_uint(setup, "seed"));
    ASSIGN_OR_RETURN(std::string address, json_string(setup, "engine_address"));
    ASSIGN_OR_RETURN(std::string descriptor, json_string(setup, "descriptor"));
    ASSIGN_OR_RETURN(std::uint64_t index, json_uint(setup, "trainer_index"));
    ASSIGN_OR_RETURN(std::uint64_t feeders, json_uint(setup, "feeders"));
    if (feeders == 0 || index >= feeders) return InvalidArgument("setup: trainer_index out of range");
    trainer_index_ = index;
    feeders_ = feeders;
    on_demand_ = setup.value("on_demand", false);
    target_on_device_ = setup.value("engine_device", std::string("cpu")) == "cuda";
    if (source_on_device_ && !target_on_device_) {
      return FailedPrecondition(name() + ": its weights are in device memory but engine rank " +
                                std::to_string(engine_rank_) + " keeps host memory (--device cpu)");
    }

    engine_address_ = address;
    ASSIGN_OR_RETURN(link_, connect_to_engine(deadline));
    // From the device that writes: the weights' device, or for host weights
    // into a device engine the one that copies (--gpu). Transports that bind
    // a device at open (nccl) send from it; cuda_ipc enables peer access from
    // it to the engine's GPU (the pack kernel writes into the slot).
    const int writer = source_on_device_ ? source_->device() : (target_on_device_ ? options_.gpu : -1);
    ASSIGN_OR_RETURN(target_, transport_->open_target_on(descriptor, link_.get(), writer));
    RETURN_IF_ERROR(send_hello(deadline));

    // Direct mode writes into the engine's weight arena, laid out the same
    // way from the engine rank's stream.
    if (direct_) engine_offsets_ = weight_arena_offsets(plan_.specs, nullptr);
    if (transport_->capabilities().remote_write) {
      RETURN_IF_ERROR(setup_remote_writes());
    } else if (source_on_device_ || target_on_device_) {
      const int gpu = source_on_device_ ? source_->device() : options_.gpu;
      ASSIGN_OR_RETURN(BatchedCopier copier, BatchedCopier::Create(gpu));
      copier_ = std::make_unique<BatchedCopier>(std::move(copier));
      ASSIGN_OR_RETURN(stream_, CudaStream::Create(gpu));
      if (source_on_device_) RETURN_IF_ERROR(create_gpu_span(gpu));
      // Host weights that never move (a mapped checkpoint): registered once,
      // then the copy engines read them directly, with no host-side copy.
      if (!source_on_device_ && target_on_device_ && options_.register_host_weights) {
        register_host_weights(gpu);
      }
      host_registered_ = !registrations_.empty();
      device_reads_ = source_on_device_ || host_registered_;
      for (int b = 0; b < 2; ++b) {
        ASSIGN_OR_RETURN(h2d_done_[b], CudaEvent::Create(gpu));
      }
      if (!device_reads_) {
        // Host weights into device memory: pack into pinned memory, copy it
        // to the device (the slot itself; in direct mode a device bucket
        // that one launch scatters into the weights).
        for (int b = 0; b < 2; ++b) {
          ASSIGN_OR_RETURN(pinned_[b], PinnedBuffer::Allocate(plan_.bucket_size));
        }
        if (direct_) {
          ASSIGN_OR_RETURN(device_bucket_, DeviceBuffer::Allocate(gpu, plan_.bucket_size));
        }
      }
    } else if (!transport_->capabilities().one_sided) {
      staging_.resize(plan_.bucket_size);
    }

    client_->start_reader([this](const Status&) {
      std::lock_guard<std::mutex> lock(link_mu_);
      link_->shutdown();
    });
    return client_->send(Json{{"type", "linked"}});
  }

 private:
  // A data-plane connection to the engine rank (setup and recovery),
  // authenticated both ways with the job's secret in the data context of
  // that engine rank (auth.h); then the caller sends the hello. An engine
  // that refuses this side, or cannot prove it knows the secret, fails the
  // call naming it.
  StatusOr<std::unique_ptr<Link>> connect_to_engine(Deadline deadline) {
    ASSIGN_OR_RETURN(auto link, Link::Connect(engine_address_, "engine rank " + std::to_string(engine_rank_) + " at " +
                                                                   engine_address_,
                                              deadline));
    const Secret secret(options_.debug_data_secret.empty() ? options_.secret : options_.debug_data_secret);
    RETURN_IF_ERROR(authenticate_as_client(*link, secret, data_auth_context(engine_rank_), deadline)
                        .WithContext("authenticating the data link"));
    return link;
  }

  Status send_hello(Deadline deadline) {
    FrameHeader hello;
    hello.type = FrameType::kHello;
    hello.a = static_cast<std::uint64_t>(options_.rank);
    hello.b = static_cast<std::uint64_t>(engine_rank_);
    hello.c = plan_.digest;
    return link_->send(hello, {}, deadline);
  }

  // Runs refit `version`. On failure: reports it, then recovers when the
  // coordinator says so ("relink": a fresh data-plane connection over the
  // same transport target and registrations) and returns the refit's error
  // with recovered_ set; a coordinator that shuts down or is lost leaves the
  // error fatal.
  Status refit_or_report(std::uint64_t version) {
    recovered_ = false;
    Status status = run_refit(version);
    if (status.ok()) return Status::Ok();
    // A broken CUDA context (a sticky error) fails every later refit the same
    // way: report it, and end this process instead of relinking.
    const Status health = stream_.device() >= 0 ? cuda_context_health(stream_.device()) : Status::Ok();
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
    if (copier_) (void)stream_.synchronize();
    packs_unwaited_ = false;
    pending_landed_.clear();
    h2d_pending_[0].active = h2d_pending_[1].active = false;
    direct_runs_.clear();
    direct_bytes_ = 0;
    abandon_remote();
    auto instruction = client_->wait_for_recovery(Deadline::AfterSeconds(options_.setup_timeout_s));
    if (!instruction.ok() || (*instruction)["type"] != "relink") return status;
    Deadline deadline = Deadline::AfterSeconds(options_.setup_timeout_s);
    auto fresh = connect_to_engine(deadline);
    if (!fresh.ok()) return status.WithContext("recovery failed: " + fresh.status().message());
    {
      std::lock_guard<std::mutex> lock(link_mu_);
      link_->adopt(**fresh);
    }
    Status relinked = target_->relinked();  // nccl: a new communicator at the next submit
    if (relinked.ok()) relinked = send_hello(deadline);
    if (relinked.ok()) relinked = client_->send(Json{{"type", "linked"}, {"version", committed_}});
    if (!relinked.ok()) return status.WithContext("recovery failed: " + relinked.message());
    std::fprintf(stderr, "%s: refit %llu failed (%s); relinked, ready for the next refit\n", name().c_str(),
                 static_cast<unsigned long long>(version), status.message().c_str());
    recovered_ = true;
    return status;
  }

  Status run_refit(std::uint64_t version) {
    RETURN_IF_ERROR(source_->prepare(version, seed_).WithContext(name() + ", preparing the weights of refit " +
                                                                  std::to_string(version)));
    RETURN_IF_ERROR(client_->send(Json{{"type", "ready"}, {"version", version}}));
    ASSIGN_OR_RETURN(Json go, client_->wait_for("go", Deadline::AfterSeconds(options_.refit_timeout_s)));
    (void)go;
    Deadline deadline = Deadline::AfterSeconds(options_.refit_timeout_s);
    const Clock::time_point went = Clock::now();
    if (gpu_span_) RETURN_IF_ERROR(gpu_span_->first.record(stream_.handle()).WithContext(name()));
    std::uint64_t buckets = 0, bytes = 0;
    Clock::time_point last_progress = Clock::now();
    for (std::uint64_t j = trainer_index_; j < plan_.buckets.size(); j += feeders_) {
      const bool die_after_this = version == options_.debug_die_after_announce && stream_.device() >= 0;
      if (die_after_this) RETURN_IF_ERROR(inject_gpu_delay(stream_.device(), stream_.handle(), 30000));
      RETURN_IF_ERROR(send_bucket(version, j, deadline));
      if (die_after_this) {
        std::fprintf(stderr, "%s: bucket %llu of refit %llu sent behind a 30 s GPU delay; dying by SIGKILL "
                     "(--debug-die-after-announce)\n", name().c_str(), static_cast<unsigned long long>(j),
                     static_cast<unsigned long long>(version));
        ::raise(SIGKILL);
      }
      if (version == options_.debug_fail_refit) {
        return Internal(name() + ": injected fault in refit " + std::to_string(version) + " (--debug-fail-refit)");
      }
      if (version == options_.debug_cuda_fault_refit && stream_.device() >= 0) {
        RETURN_IF_ERROR(inject_illegal_address(stream_.device(), stream_.handle()));
        RETURN_IF_ERROR(stream_.synchronize().WithContext(name() + ", refit " + std::to_string(version) +
                                                          " (--debug-cuda-fault-refit)"));
      }
      ++buckets;
      bytes += plan_.buckets[j].bytes;
      if (Clock::now() - last_progress > std::chrono::milliseconds(50)) {
        last_progress = Clock::now();
        RETURN_IF_ERROR(client_->send(Json{{"type", "progress"}, {"version", version}, {"bytes", bytes}}));
      }
    }
    RETURN_IF_ERROR(flush_direct(version, deadline));
    RETURN_IF_ERROR(flush_h2d(deadline));
    RETURN_IF_ERROR(finish_remote(deadline));
    if (packs_unwaited_) {
      // Packs announced before they finished: they end before this rank says
      // "sent" (and before the caller may change its weights).
      RETURN_IF_ERROR(stream_.synchronize().WithContext(name() + ", the packs of refit " + std::to_string(version)));
      packs_unwaited_ = false;
    }
    const double send_ms = std::chrono::duration<double, std::milli>(Clock::now() - went).count();
    // Every copy has finished here (the flushes waited for them): the end
    // event completes at once, and is read after "sent", outside the timing.
    if (gpu_span_) RETURN_IF_ERROR(gpu_span_->second.record(stream_.handle()).WithContext(name()));
    // Every byte was read: a checkpoint file that changed meanwhile fails the refit.
    RETURN_IF_ERROR(source_->check_unchanged().WithContext(name() + ", refit " + std::to_string(version)));
    RETURN_IF_ERROR(client_->send(Json{{"type", "progress"}, {"version", version}, {"bytes", bytes}}));
    RETURN_IF_ERROR(client_->send(Json{{"type", "sent"}, {"version", version}}));
    Json stats{{"buckets", buckets}, {"bytes", bytes}, {"send_ms", send_ms}, {"memory_path", memory_path()}};
    if (gpu_span_) {
      // From 'go' reaching this rank's stream to the end of its last copy:
      // close to send_ms when the copies, not the host, set the pace.
      RETURN_IF_ERROR(gpu_span_->second.synchronize().WithContext(name()));
      ASSIGN_OR_RETURN(float gpu_ms, gpu_span_->second.elapsed_ms_since(gpu_span_->first));
      stats["gpu_span_ms"] = gpu_ms;
    }
    RETURN_IF_ERROR(client_->send(Json{{"type", "done"}, {"version", version}, {"stats", std::move(stats)}}));
    ASSIGN_OR_RETURN(Json commit, client_->wait_for("commit", deadline));
    (void)commit;
    committed_ = version;
    return client_->send(Json{{"type", "committed"}, {"version", version}});
  }

  // Staged: waits for the credit of bucket j, packs the bucket into the
  // granted slot (in place when the transport is one-sided), announces it.
  // Direct: writes each entry straight into the engine's weight, announces it.
  Status wait_credit(std::uint64_t version, std::uint64_t j, Deadline deadline, std::uint64_t* slot) {
    // A credit that does not come within the bucket deadline means a stalled
    // or dead engine rank: fail instead of waiting for the whole refit's.
    auto credit = link_->recv_header(deadline.min(Deadline::AfterSeconds(options_.bucket_timeout_s)), 0);
    if (!credit.ok() && credit.status().code() == StatusCode::kDeadlineExceeded && !deadline.expired()) {
      return DeadlineExceeded(name() + " waited " + format_seconds(options_.bucket_timeout_s) +
                              " for the credit of bucket " + std::to_string(j) + " of refit " +
                              std::to_string(version) + " from " + link_->peer() +
                              " (a stalled or dead engine rank; --bucket-timeout)");
    }
    if (!credit.ok()) return credit.status();
    if (credit->type != FrameType::kCredit || credit->a != version || credit->b != j) {
      return InvalidArgument("protocol error from " + link_->peer() + ": expected the credit for bucket " +
                             std::to_string(j) + " of version " + std::to_string(version) + ", got frame type " +
                             std::to_string(static_cast<int>(credit->type)) + " (version " +
                             std::to_string(credit->a) + ", bucket " + std::to_string(credit->b) + ")");
    }
    *slot = credit->c;
    return Status::Ok();
  }

  // Host weights into a staged device target, pipelined over two pinned
  // buffers: bucket j is packed (by several threads) while bucket j-1 is
  // copied to the device; j-1 is announced before the credit of j is awaited
  // (the engine frees a slot only after it applied the bucket before), then
  // j's copy starts and is announced with bucket j+1.
  Status send_bucket_pinned(std::uint64_t version, std::uint64_t j, Deadline deadline) {
    const Bucket& bucket = plan_.buckets[j];
    const std::string where = name() + ", bucket " + std::to_string(j);
    const int b = static_cast<int>(sequence_++ % 2);
    RETURN_IF_ERROR(announce_h2d(b, deadline));  // the buffer's previous copy (normally announced already)
    std::byte* pinned = pinned_[b].data();
    runs_.clear();
    for (const PlanEntry& e : bucket.entries) {
      append_shard_copy_runs(source_->model().weights[e.tensor], pack_rank_, options_.engine_ranks,
                             source_->data(e.tensor), e.tensor_offset, e.bytes, pinned + e.bucket_offset, &runs_);
    }
    copy_runs_on_host_parallel(runs_);
    RETURN_IF_ERROR(announce_h2d(1 - b, deadline));
    std::uint64_t slot = 0;
    RETURN_IF_ERROR(wait_credit(version, j, deadline, &slot));
    std::byte* dst = target_->mapped_slot(static_cast<int>(slot));
    if (dst == nullptr) return Internal(where + ": the device target has no mapped slot " + std::to_string(slot));
    RETURN_IF_ERROR(copy_async(dst, pinned, bucket.bytes, stream_.handle()).WithContext(where));
    RETURN_IF_ERROR(h2d_done_[b].record(stream_.handle()).WithContext(where));
    h2d_pending_[b] = PendingH2D{true, version, j, slot};
    return Status::Ok();
  }

  Status send_bucket(std::uint64_t version, std::uint64_t j, Deadline deadline) {
    const Bucket& bucket = plan_.buckets[j];
    const std::string where = name() + ", bucket " + std::to_string(j);
    if (remote_writes_) return send_bucket_remote(version, j, deadline);
    if (target_on_device_ && !device_reads_ && !direct_) return send_bucket_pinned(version, j, deadline);
    std::uint64_t slot = 0;
    std::byte* dst = nullptr;
    if (direct_) {
      dst = target_->mapped_slot(0);
    } else {
      RETURN_IF_ERROR(wait_credit(version, j, deadline, &slot));
      dst = target_->mapped_slot(static_cast<int>(slot));
    }
    const bool in_place = dst != nullptr;

    if (target_on_device_ && !device_reads_) {
      // Host weights, device target, direct mode: pack on the host into
      // pinned memory, copy it to a device bucket, scatter it into the weights.
      if (!in_place) return Internal(where + ": the device target has no mapped slot");
      std::byte* pinned = pinned_[0].data();
      runs_.clear();
      for (const PlanEntry& e : bucket.entries) {
        append_shard_copy_runs(source_->model().weights[e.tensor], pack_rank_, options_.engine_ranks,
                               source_->data(e.tensor), e.tensor_offset, e.bytes, pinned + e.bucket_offset, &runs_);
      }
      copy_runs_on_host_parallel(runs_);
      std::byte* to = direct_ ? device_bucket_.data() : dst;
      RETURN_IF_ERROR(copy_async(to, pinned, bucket.bytes, stream_.handle()).WithContext(where));
      if (direct_) {
        runs_.clear();
        for (const PlanEntry& e : bucket.entries) {
          runs_.push_back(copy_run_1d(device_bucket_.data() + e.bucket_offset,
                                      dst + engine_offsets_[e.tensor] + e.tensor_offset, e.bytes));
        }
        RETURN_IF_ERROR(copier_->copy(runs_, stream_.handle()).WithContext(where));
        // One device bucket: its scatter must finish before the next copy.
        RETURN_IF_ERROR(stream_.synchronize().WithContext(where));
        return send_landed(version, j, slot, deadline);
      }
      return Internal(where + ": staged buckets of host weights take the pinned pipeline");
    }

    if (device_reads_ && in_place && !direct_ && !host_registered_) {
      // Staged into a mapped slot: one launch for the whole bucket, replayed
      // from a table built on first use (no host work per tensor). The engine
      // reads the slot once it sees kLanded and (cuda_ipc on one GPU) the
      // slot's landing event completed: kLanded goes out at once, and this
      // rank waits for its stream once, at the end of the refit. Otherwise it
      // waits for the copy before kLanded (one host wait per bucket).
      ASSIGN_OR_RETURN(const PreparedCopy* pack, prepared_pack(j, slot, dst, where));
      RETURN_IF_ERROR(copier_->launch(*pack, stream_.handle()).WithContext(where));
      ASSIGN_OR_RETURN(const bool ordered, target_->record_landed(static_cast<int>(slot), stream_.handle()));
      if (ordered) {
        packs_unwaited_ = true;
      } else {
        RETURN_IF_ERROR(stream_.synchronize().WithContext(where));
      }
      return send_landed(version, j, slot, deadline);
    }
    if (!in_place) dst = staging_.data();
    runs_.clear();
    for (const PlanEntry& e : bucket.entries) {
      std::byte* to = direct_ ? dst + engine_offsets_[e.tensor] + e.tensor_offset : dst + e.bucket_offset;
      append_shard_copy_runs(source_->model().weights[e.tensor], pack_rank_, options_.engine_ranks,
                             source_->data(e.tensor), e.tensor_offset, e.bytes, to, &runs_);
    }
    if (device_reads_) {
      // Direct: nobody reads the weights before the refit ends, so launches
      // queue back to back with no host wait, each covering at least
      // kDirectLaunchBytes (a launch per small bucket leaves most of the GPU
      // idle; one launch for everything measured slower than ~1 GiB launches).
      if (direct_) {
        direct_runs_.insert(direct_runs_.end(), runs_.begin(), runs_.end());
        direct_bytes_ += bucket.bytes;
        pending_landed_.push_back(j);
        if (direct_bytes_ >= kDirectLaunchBytes) RETURN_IF_ERROR(launch_direct(where));
        return Status::Ok();
      }
      if (host_registered_) return send_bucket_registered(version, j, slot, deadline);
      // Staged: one launch for the whole bucket; the engine reads the slot as
      // soon as it sees kLanded, so wait for the copy (one host wait per bucket).
      RETURN_IF_ERROR(copier_->copy(runs_, stream_.handle()).WithContext(where));
      RETURN_IF_ERROR(stream_.synchronize().WithContext(where));
    } else {
      copy_runs_on_host(runs_);
    }
    if (!in_place) {
      ASSIGN_OR_RETURN(Ticket ticket, target_->submit(static_cast<int>(slot), 0,
                                                      std::span<const std::byte>(dst, bucket.bytes), version,
                                                      deadline));
      for (;;) {
        ASSIGN_OR_RETURN(bool done, target_->poll(ticket));
        if (done) break;
        if (deadline.expired()) {
          target_->cancel(ticket);
          return DeadlineExceeded(name() + " timed out writing bucket " + std::to_string(j) + " to " + link_->peer());
        }
      }
    }
    return send_landed(version, j, slot, deadline);
  }

  // Remote writes (ucx: submit writes into the engine's registered memory,
  // staged or direct): two staging buffers, so that bucket j is packed into
  // one while bucket j-1's write from the other is in flight (the transport
  // moves it meanwhile). Device weights are packed on the device, then copied
  // into pinned host buffers when the transport cannot register device
  // memory ("host-staged"); otherwise the staging buffers are device memory.
  // The engine pools' side (device memory behind host buffers) is the
  // transport's business.
  Status setup_remote_writes() {
    remote_writes_ = true;
    const TransportCapabilities caps = transport_->capabilities();
    const std::uint64_t bytes = plan_.bucket_size;
    if (!source_on_device_) {
      for (auto& b : remote_host_) b.resize(bytes);
      return Status::Ok();
    }
    const int gpu = source_->device();
    ASSIGN_OR_RETURN(BatchedCopier copier, BatchedCopier::Create(gpu));
    copier_ = std::make_unique<BatchedCopier>(std::move(copier));
    ASSIGN_OR_RETURN(stream_, CudaStream::Create(gpu));
    RETURN_IF_ERROR(create_gpu_span(gpu));
    device_reads_ = true;
    remote_staged_ = caps.device_memory_staged;
    for (int b = 0; b < 2; ++b) {
      if (remote_staged_) {
        ASSIGN_OR_RETURN(pinned_[b], PinnedBuffer::Allocate(bytes));
      } else {
        ASSIGN_OR_RETURN(remote_device_[b], DeviceBuffer::Allocate(gpu, bytes));
      }
    }
    if (remote_staged_) {
      ASSIGN_OR_RETURN(device_bucket_, DeviceBuffer::Allocate(gpu, bytes));
      static std::once_flag once;
      std::call_once(once, [&] {
        std::fprintf(stderr,
                     "%s: --transport %s cannot register CUDA memory: device weights are staged through pinned "
                     "host buffers (memory path host-staged)\n",
                     name().c_str(), options_.transport.c_str());
      });
    }
    return Status::Ok();
  }

  // Where this rank's bytes are read from, for the report: "host",
  // "cuda" (device memory the transport reads itself), "host-staged".
  std::string memory_path() const {
    if (!source_on_device_) return "host";
    return transport_->capabilities().device_memory_staged ? "host-staged" : "cuda";
  }

  Status send_bucket_remote(std::uint64_t version, std::uint64_t j, Deadline deadline) {
    const Bucket& bucket = plan_.buckets[j];
    const std::string where = name() + ", bucket " + std::to_string(j);
    const int b = static_cast<int>(sequence_++ % 2);
    std::byte* staging = !source_on_device_ ? remote_host_[b].data()
                         : remote_staged_   ? pinned_[b].data()
                                            : remote_device_[b].data();
    // 1. Pack bucket j (buffer b's last write, of bucket j-2, completed
    // before bucket j-1 was submitted).
    std::byte* pack_to = remote_staged_ ? device_bucket_.data() : staging;
    runs_.clear();
    for (const PlanEntry& e : bucket.entries) {
      append_shard_copy_runs(source_->model().weights[e.tensor], pack_rank_, options_.engine_ranks,
                             source_->data(e.tensor), e.tensor_offset, e.bytes, pack_to + e.bucket_offset, &runs_);
    }
    if (source_on_device_) {
      RETURN_IF_ERROR(copier_->copy(runs_, stream_.handle()).WithContext(where));
      if (remote_staged_) {
        RETURN_IF_ERROR(copy_async(staging, device_bucket_.data(), bucket.bytes, stream_.handle()).WithContext(where));
      }
      RETURN_IF_ERROR(stream_.synchronize().WithContext(where));
    } else {
      copy_runs_on_host_parallel(runs_);
    }
    // 2. Bucket j-1 lands and is announced (the engine frees a slot only
    // after it applied the bucket before).
    RETURN_IF_ERROR(finish_remote(deadline));
    // 3. Bucket j's write starts: into the granted slot, or (direct) each
    // packed run at its offset in the engine's weight arena, runs adjacent on
    // both sides merged into one write.
    std::uint64_t slot = 0;
    if (!direct_) RETURN_IF_ERROR(wait_credit(version, j, deadline, &slot));
    RemoteInFlight& f = remote_in_flight_;
    f = RemoteInFlight{true, version, j, slot, {}};
    auto write = [&](std::uint64_t at, std::uint64_t from, std::uint64_t n) -> Status {
      ASSIGN_OR_RETURN(Ticket t, target_->submit(static_cast<int>(slot), at,
                                                 std::span<const std::byte>(staging + from, n), version, deadline));
      f.tickets.push_back(t);
      return Status::Ok();
    };
    if (!direct_) return write(0, 0, bucket.bytes).WithContext(where);
    std::uint64_t at = 0, from = 0, n = 0;
    for (const PlanEntry& e : bucket.entries) {
      if (e.bytes == 0) continue;
      const std::uint64_t to = engine_offsets_[e.tensor] + e.tensor_offset;
      if (n > 0 && to == at + n && e.bucket_offset == from + n) {
        n += e.bytes;
        continue;
      }
      if (n > 0) RETURN_IF_ERROR(write(at, from, n).WithContext(where));
      at = to;
      from = e.bucket_offset;
      n = e.bytes;
    }
    if (n > 0) RETURN_IF_ERROR(write(at, from, n).WithContext(where));
    return Status::Ok();
  }

  // Remote writes: waits until the bucket in flight is in the engine's
  // memory, then announces it. No-op when none is in flight.
  Status finish_remote(Deadline deadline) {
    RemoteInFlight& f = remote_in_flight_;
    if (!f.active) return Status::Ok();
    for (std::size_t i = 0; i < f.tickets.size(); ++i) {
      for (;;) {
        ASSIGN_OR_RETURN(bool done, target_->poll(f.tickets[i]));
        if (done) break;
        if (deadline.expired()) {
          return DeadlineExceeded(name() + " timed out writing bucket " + std::to_string(f.bucket) + " to " +
                                  link_->peer());
        }
      }
    }
    f.active = false;
    return send_landed(f.version, f.bucket, f.slot, deadline);
  }

  // After a failed refit: the writes still in flight are cancelled (the
  // transport lets the next write wait for them).
  void abandon_remote() {
    RemoteInFlight& f = remote_in_flight_;
    if (f.active) {
      for (Ticket t : f.tickets) target_->cancel(t);
    }
    f = RemoteInFlight();
  }

  // Registered host weights into a staged device target: the copy engines
  // read the bucket's runs straight out of the registered mapping into the
  // granted slot (runs_ were built for it by send_bucket). Bucket j's copy
  // is enqueued before bucket j-1 is announced, so the copy engine always
  // has work while the host waits; the events of the pinned path order them.
  Status send_bucket_registered(std::uint64_t version, std::uint64_t j, std::uint64_t slot, Deadline deadline) {
    const std::string where = name() + ", bucket " + std::to_string(j);
    const int b = static_cast<int>(sequence_++ % 2);
    RETURN_IF_ERROR(announce_h2d(b, deadline));  // bucket j-2 (normally announced already)
    RETURN_IF_ERROR(copy_runs_with_copy_engine(runs_, stream_.handle()).WithContext(where));
    RETURN_IF_ERROR(h2d_done_[b].record(stream_.handle()).WithContext(where));
    h2d_pending_[b] = PendingH2D{true, version, j, slot};
    return announce_h2d(1 - b, deadline);  // bucket j-1
  }

  // Registers source_'s stable host ranges (a checkpoint's file mappings)
  // with the device, once, and says on stderr how long it took. Where the
  // driver refuses a range, says why and drops every registration: the
  // weights then go through the pinned buffers (slower, never wrong).
  void register_host_weights(int gpu) {
    const Clock::time_point started = Clock::now();
    std::uint64_t total = 0;
    for (const auto& [data, bytes] : source_->stable_host_ranges()) {
      StatusOr<HostRegistration> r = HostRegistration::Register(data, bytes);
      if (!r.ok()) {
        std::fprintf(stderr, "%s: cannot register its host weights (%llu bytes) for device %d: %s; packing through "
                     "pinned buffers instead\n",
                     name().c_str(), static_cast<unsigned long long>(bytes), gpu, r.status().ToString().c_str());
        registrations_.clear();
        return;
      }
      registrations_.push_back(std::move(*r));
      total += bytes;
    }
    if (registrations_.empty()) return;
    const double s = std::chrono::duration<double>(Clock::now() - started).count();
    std::fprintf(stderr, "%s: registered %.2f GB of host weights (%zu ranges) for device %d in %.2f s\n",
                 name().c_str(), static_cast<double>(total) / 1e9, registrations_.size(), gpu, s);
  }

  // Pinned path: waits for the copy from pinned buffer b, then announces its
  // bucket. No-op when nothing is pending there.
  Status announce_h2d(int b, Deadline deadline) {
    PendingH2D& p = h2d_pending_[b];
    if (!p.active) return Status::Ok();
    p.active = false;
    RETURN_IF_ERROR(h2d_done_[b].synchronize().WithContext(name() + ", bucket " + std::to_string(p.bucket)));
    return send_landed(p.version, p.bucket, p.slot, deadline);
  }

  // Announces every bucket still copying, oldest first.
  Status flush_h2d(Deadline deadline) {
    for (std::uint64_t k = 0; k < 2; ++k) RETURN_IF_ERROR(announce_h2d(static_cast<int>((sequence_ + k) % 2), deadline));
    return Status::Ok();
  }

  // The host pack of the pinned path: a bucket's runs split over a few
  // threads (one thread's memcpy from the page cache is several times slower
  // than the host-to-device link).
  void copy_runs_on_host_parallel(std::span<const CopyRun> runs) {
    std::uint64_t total = 0;
    for (const CopyRun& r : runs) total += r.row_bytes * r.rows;
    // Up to one thread per core but two (the engine's and this rank's own
    // threads), at most kPackThreads, at least 4 MiB each.
    const unsigned cores = std::max(std::thread::hardware_concurrency(), 3u) - 2;
    const unsigned threads = std::min({kPackThreads, cores, static_cast<unsigned>(total / (4u << 20) + 1)});
    if (threads <= 1) {
      copy_runs_on_host(runs);
      return;
    }
    // Split into 1-D pieces of about total / threads bytes each.
    std::vector<std::vector<CopyRun>> parts(threads);
    const std::uint64_t share = total / threads + 1;
    std::uint64_t filled = 0;
    std::size_t part = 0;
    for (const CopyRun& r : runs) {
      for (std::uint64_t row = 0; row < r.rows; ++row) {
        const std::byte* src = r.src + row * r.src_pitch;
        std::byte* dst = r.dst + row * r.dst_pitch;
        std::uint64_t left = r.row_bytes;
        while (left > 0) {
          const std::uint64_t take = std::min(left, share - filled);
          parts[part].push_back(copy_run_1d(src, dst, take));
          src += take;
          dst += take;
          left -= take;
          filled += take;
          if (filled >= share && part + 1 < parts.size()) {
            ++part;
            filled = 0;
          }
        }
      }
    }
    std::vector<std::thread> workers;
    for (unsigned t = 1; t < threads; ++t) workers.emplace_back([&parts, t] { copy_runs_on_host(parts[t]); });
    copy_runs_on_host(parts[0]);
    for (auto& w : workers) w.join();
  }

  static std::string format_seconds(double s) {
    char text[32];
    std::snprintf(text, sizeof text, "%g s", s);
    return text;
  }

  Status send_landed(std::uint64_t version, std::uint64_t j, std::uint64_t slot, Deadline deadline) {
    FrameHeader landed;
    landed.type = FrameType::kLanded;
    landed.a = version;
    landed.b = j;
    landed.c = slot;
    landed.d = plan_.buckets[j].bytes;
    return link_->send(landed, {}, deadline);
  }

  // The pack of bucket j into slot `slot` (mapped at `dst`), prepared on its
  // first use and kept: the plan, the weights (source_->data) and the
  // mapped slots do not move while this rank runs; a slot mapped elsewhere
  // (after a relink) is prepared again.
  StatusOr<const PreparedCopy*> prepared_pack(std::uint64_t j, std::uint64_t slot, std::byte* dst,
                                              const std::string& where) {
    PreparedPack& p = prepared_packs_[{j, slot}];
    if (p.dst != dst) {
      runs_.clear();
      for (const PlanEntry& e : plan_.buckets[j].entries) {
        append_shard_copy_runs(source_->model().weights[e.tensor], pack_rank_, options_.engine_ranks,
                               source_->data(e.tensor), e.tensor_offset, e.bytes, dst + e.bucket_offset, &runs_);
      }
      p.dst = nullptr;
      auto prepared = copier_->prepare(runs_);
      if (!prepared.ok()) return prepared.status().WithContext(where + ": preparing its pack");
      p.copy = std::move(prepared).value();
      p.dst = dst;
    }
    return &p.copy;
  }

  Status launch_direct(const std::string& where) {
    RETURN_IF_ERROR((host_registered_ ? copy_runs_with_copy_engine(direct_runs_, stream_.handle())
                                      : copier_->copy(direct_runs_, stream_.handle()))
                        .WithContext(where));
    direct_runs_.clear();
    direct_bytes_ = 0;
    return Status::Ok();
  }

  // Direct mode on a device: launches what is left, waits once for every
  // launch, then announces every packed bucket.
  Status create_gpu_span(int gpu) {
    ASSIGN_OR_RETURN(CudaEvent first, CudaEvent::Create(gpu, /*timing=*/true));
    ASSIGN_OR_RETURN(CudaEvent second, CudaEvent::Create(gpu, /*timing=*/true));
    gpu_span_.emplace(std::move(first), std::move(second));
    return Status::Ok();
  }

  Status flush_direct(std::uint64_t version, Deadline deadline) {
    if (pending_landed_.empty()) return Status::Ok();
    const std::string where = name() + ", direct writes of refit " + std::to_string(version);
    RETURN_IF_ERROR(launch_direct(where));
    RETURN_IF_ERROR(stream_.synchronize().WithContext(where));
    for (std::uint64_t j : pending_landed_) RETURN_IF_ERROR(send_landed(version, j, 0, deadline));
    pending_landed_.clear();
    return Status::Ok();
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
  // The device copies the weights itself (device memory, or registered host
  // memory); otherwise host weights are packed through pinned memory.
  bool device_reads_ = false;
  bool host_registered_ = false;  // source_'s host weights registered: the copy engines read them
  std::vector<HostRegistration> registrations_;  // of source_'s stable host ranges
  bool on_demand_ = false, finished_ = false;
  bool recovered_ = false;  // the last failed refit was recovered from
  std::uint64_t committed_ = 0;
  std::vector<std::uint64_t> engine_offsets_;  // direct mode: of each tensor in the engine's arena
  std::unique_ptr<BatchedCopier> copier_;
  CudaStream stream_;
  // Timing events on stream_ (device weights only): the refit's GPU span.
  std::optional<std::pair<CudaEvent, CudaEvent>> gpu_span_;
  // Host weights into a device target (the pinned path): two pinned buckets,
  // one packed while the other is copied to the device.
  struct PendingH2D {
    bool active = false;
    std::uint64_t version = 0, bucket = 0, slot = 0;
  };
  PinnedBuffer pinned_[2];
  CudaEvent h2d_done_[2];
  PendingH2D h2d_pending_[2];
  std::uint64_t sequence_ = 0;  // buckets sent so far: picks the pinned buffer
  static constexpr unsigned kPackThreads = 14;
  DeviceBuffer device_bucket_; // ... and in direct mode its copy on the device
  std::vector<CopyRun> runs_;
  std::vector<std::uint64_t> pending_landed_;  // direct mode on a device: buckets packed, not yet announced
  struct PreparedPack {
    std::byte* dst = nullptr;  // the slot it writes into; null until prepared
    PreparedCopy copy;
  };
  std::map<std::pair<std::uint64_t, std::uint64_t>, PreparedPack> prepared_packs_;  // by (bucket, slot)
  bool packs_unwaited_ = false;  // packs announced with a landing event, not yet waited for
  std::vector<CopyRun> direct_runs_;           // runs packed but not launched yet
  std::uint64_t direct_bytes_ = 0;             // their bytes
  static constexpr std::uint64_t kDirectLaunchBytes = 1ull << 30;
  std::vector<std::byte> staging_;
  // Remote writes (setup_remote_writes): the bucket in flight, and the
  // staging buffers (host weights: remote_host_; device weights: pinned_
  // when host-staged, else remote_device_).
  struct RemoteInFlight {
    bool active = false;
    std::uint64_t version = 0, bucket = 0, slot = 0;
    std::vector<Ticket> tickets;
  };
  bool remote_writes_ = false, remote_staged_ = false;
  RemoteInFlight remote_in_flight_;
  std::vector<std::byte> remote_host_[2];
  DeviceBuffer remote_device_[2];
};

TrainerRank::TrainerRank(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TrainerRank::~TrainerRank() = default;

StatusOr<std::unique_ptr<TrainerRank>> TrainerRank::Join(const RankOptions& options,
                                                         std::unique_ptr<WeightSource> source) {
  if (!source) return InvalidArgument("trainer rank " + std::to_string(options.rank) + ": no weight source");
  auto impl = std::make_unique<Impl>(options, std::move(source));
  RETURN_IF_ERROR(impl->setup().WithContext(impl->name()));
  return std::unique_ptr<TrainerRank>(new TrainerRank(std::move(impl)));
}

Status TrainerRank::serve() { return impl_->serve().WithContext(impl_->name()); }
Status TrainerRank::refit(std::uint64_t version) { return impl_->refit(version).WithContext(impl_->name()); }
Status TrainerRank::finish() { return impl_->finish().WithContext(impl_->name()); }
std::uint64_t TrainerRank::committed_version() const { return impl_->committed_version(); }
bool TrainerRank::on_demand() const { return impl_->on_demand(); }
bool TrainerRank::recovered() const { return impl_->recovered(); }

StatusOr<std::unique_ptr<WeightSource>> make_rank_source(const RankOptions& options) {
  const std::vector<std::string> presets = model_presets();
  if (std::find(presets.begin(), presets.end(), options.model) != presets.end() && options.shard_rules.empty()) {
    const bool on_device = options.device == "cuda";
    return make_synthetic_source(options.model, options.layers, on_device ? MemoryKind::kCuda : MemoryKind::kHost,
                                 options.gpu);
  }
  if (options.device == "cuda") {
    return InvalidArgument("--device cuda: a checkpoint's weights are read into host memory; use --device cpu "
                           "(device engines are still fed, through pinned memory)");
  }
  ASSIGN_OR_RETURN(ModelChoice choice, open_model_choice(options.model, options.layers, options.shard_rules));
  ASSIGN_OR_RETURN(std::vector<ShardRulePattern> rules, shard_rules_from_text(options.shard_rules));
  return make_checkpoint_source(std::move(*choice.checkpoint), rules);
}

Status run_trainer(const RankOptions& options) {
  auto source = make_rank_source(options);
  if (!source.ok()) return source.status().WithContext("trainer rank " + std::to_string(options.rank));
  ASSIGN_OR_RETURN(auto rank, TrainerRank::Join(options, std::move(*source)));
  return rank->serve();
}

}  // namespace refit
