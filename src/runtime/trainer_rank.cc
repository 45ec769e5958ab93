// The trainer role: see roles.h.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <vector>

#include "control/control_client.h"
#include "control/coordinator.h"
#include "refit/batched_copy.h"
#include "refit/content.h"
#include "refit/device.h"
#include "refit/device_content.h"
#include "refit/engine.h"
#include "refit/model.h"
#include "refit/shard_copy.h"
#include "refit/plan.h"
#include "refit/transport.h"
#include "runtime/roles.h"

namespace refit {
namespace {

using Clock = std::chrono::steady_clock;

class TrainerRank {
 public:
  explicit TrainerRank(const RankOptions& options) : options_(options) {}

  Status run() {
    RETURN_IF_ERROR(setup());
    for (;;) {
      ASSIGN_OR_RETURN(Json message, client_->wait_for("start", Deadline::Never(), "shutdown"));
      if (message["type"] == "shutdown") return Status::Ok();
      ASSIGN_OR_RETURN(std::uint64_t version, json_uint(message, "version"));
      Status status = refit(version);
      if (!status.ok()) return client_->report_failure(version, status);
    }
  }

 private:
  std::string name() const { return "trainer rank " + std::to_string(options_.rank); }

  Status setup() {
    Deadline deadline = Deadline::AfterSeconds(options_.setup_timeout_s);
    RETURN_IF_ERROR(validate_rank_counts(options_.trainer_ranks, options_.engine_ranks));
    RETURN_IF_ERROR(validate_rank_settings(options_, /*engine=*/false));
    on_device_ = options_.device == "cuda";
    direct_ = options_.mode == "direct";
    ASSIGN_OR_RETURN(model_, make_model(options_.model, options_.layers));
    engine_rank_ = options_.rank % options_.engine_ranks;
    pack_rank_ = options_.debug_pack_rank >= 0 ? options_.debug_pack_rank % options_.engine_ranks : engine_rank_;
    ASSIGN_OR_RETURN(plan_, make_plan(engine_stream(model_, engine_rank_, options_.engine_ranks), options_.bucket_size));
    ASSIGN_OR_RETURN(transport_, make_transport(options_.transport));

    Json dtypes = Json::object();
    for (const TensorSpec& s : plan_.specs) {
      std::string d(dtype_name(s.dtype));
      if (!dtypes.contains(d)) dtypes[d] = s.name;
    }
    ASSIGN_OR_RETURN(client_, ControlClient::Connect(options_.coordinator, deadline));
    Json join{{"type", "join"},
              {"role", "trainer"},
              {"rank", options_.rank},
              {"pid", static_cast<int>(::getpid())},
              {"device", options_.device},
              {"mode", options_.mode},
              {"trainer_ranks", options_.trainer_ranks},
              {"engine_ranks", options_.engine_ranks},
              {"bucket_size", options_.bucket_size},
              {"transport", options_.transport},
              {"engine_rank", engine_rank_},
              {"plan_digest", plan_.digest_hex()},
              {"stream_dtypes", dtypes}};
    ASSIGN_OR_RETURN(Json setup, client_->join(join, deadline));
    ASSIGN_OR_RETURN(seed_, json_uint(setup, "seed"));
    ASSIGN_OR_RETURN(std::string address, json_string(setup, "engine_address"));
    ASSIGN_OR_RETURN(std::string descriptor, json_string(setup, "descriptor"));
    ASSIGN_OR_RETURN(std::uint64_t index, json_uint(setup, "trainer_index"));
    ASSIGN_OR_RETURN(std::uint64_t feeders, json_uint(setup, "feeders"));
    if (feeders == 0 || index >= feeders) return InvalidArgument("setup: trainer_index out of range");
    trainer_index_ = index;
    feeders_ = feeders;

    std::string peer = "engine rank " + std::to_string(engine_rank_) + " at " + address;
    ASSIGN_OR_RETURN(link_, Link::Connect(address, peer, deadline));
    ASSIGN_OR_RETURN(target_, transport_->open_target(descriptor, link_.get()));
    FrameHeader hello;
    hello.type = FrameType::kHello;
    hello.a = static_cast<std::uint64_t>(options_.rank);
    hello.b = static_cast<std::uint64_t>(engine_rank_);
    hello.c = plan_.digest;
    RETURN_IF_ERROR(link_->send(hello, {}, deadline));

    // The weights this rank holds: one arena (host or device), allocated once
    // (stream index == model index).
    std::vector<TensorSpec> full;
    for (const Weight& w : model_.weights) full.push_back(w.spec);
    std::uint64_t arena_bytes = 0;
    weight_offsets_ = weight_arena_offsets(full, &arena_bytes);
    if (on_device_) {
      ASSIGN_OR_RETURN(device_weights_, DeviceBuffer::Allocate(options_.gpu, arena_bytes));
      ASSIGN_OR_RETURN(BatchedCopier copier, BatchedCopier::Create(options_.gpu));
      copier_ = std::make_unique<BatchedCopier>(std::move(copier));
      ASSIGN_OR_RETURN(stream_, CudaStream::Create(options_.gpu));
    } else {
      host_weights_.resize(arena_bytes);
    }
    // Direct mode writes into the engine's weight arena, laid out the same
    // way from the engine rank's stream.
    if (direct_) engine_offsets_ = weight_arena_offsets(plan_.specs, nullptr);
    if (!transport_->capabilities().one_sided) staging_.resize(plan_.bucket_size);

    client_->start_reader([this](const Status&) { link_->shutdown(); });
    return client_->send(Json{{"type", "linked"}});
  }

  Status refit(std::uint64_t version) {
    // The "optimizer step": new content for every weight.
    for (std::size_t i = 0; i < model_.weights.size(); ++i) {
      const TensorSpec& spec = model_.weights[i].spec;
      const std::uint64_t key = content_key(seed_, version, spec.name);
      if (on_device_) {
        RETURN_IF_ERROR(fill_content_device(key, 0, weights() + weight_offsets_[i], spec.nbytes(), stream_.handle()));
      } else {
        fill_content(key, 0, std::span<std::byte>(weights() + weight_offsets_[i], spec.nbytes()));
      }
    }
    if (on_device_) RETURN_IF_ERROR(stream_.synchronize());
    RETURN_IF_ERROR(client_->send(Json{{"type", "ready"}, {"version", version}}));
    ASSIGN_OR_RETURN(Json go, client_->wait_for("go", Deadline::AfterSeconds(options_.refit_timeout_s)));
    (void)go;
    Deadline deadline = Deadline::AfterSeconds(options_.refit_timeout_s);
    const Clock::time_point went = Clock::now();
    std::uint64_t buckets = 0, bytes = 0;
    Clock::time_point last_progress = Clock::now();
    for (std::uint64_t j = trainer_index_; j < plan_.buckets.size(); j += feeders_) {
      RETURN_IF_ERROR(send_bucket(version, j, deadline));
      ++buckets;
      bytes += plan_.buckets[j].bytes;
      if (Clock::now() - last_progress > std::chrono::milliseconds(50)) {
        last_progress = Clock::now();
        RETURN_IF_ERROR(client_->send(Json{{"type", "progress"}, {"version", version}, {"bytes", bytes}}));
      }
    }
    RETURN_IF_ERROR(flush_direct(version, deadline));
    const double send_ms = std::chrono::duration<double, std::milli>(Clock::now() - went).count();
    RETURN_IF_ERROR(client_->send(Json{{"type", "progress"}, {"version", version}, {"bytes", bytes}}));
    RETURN_IF_ERROR(client_->send(Json{{"type", "sent"}, {"version", version}}));
    RETURN_IF_ERROR(client_->send(
        Json{{"type", "done"},
             {"version", version},
             {"stats", {{"buckets", buckets}, {"bytes", bytes}, {"send_ms", send_ms}}}}));
    ASSIGN_OR_RETURN(Json commit, client_->wait_for("commit", deadline));
    (void)commit;
    return client_->send(Json{{"type", "committed"}, {"version", version}});
  }

  std::byte* weights() { return on_device_ ? device_weights_.data() : host_weights_.data(); }

  // Staged: waits for the credit of bucket j, packs the bucket into the
  // granted slot (in place when the transport is one-sided), announces it.
  // Direct: writes each entry straight into the engine's weight, announces it.
  Status send_bucket(std::uint64_t version, std::uint64_t j, Deadline deadline) {
    const Bucket& bucket = plan_.buckets[j];
    std::uint64_t slot = 0;
    std::byte* dst = nullptr;
    if (direct_) {
      dst = target_->mapped_slot(0);
    } else {
      ASSIGN_OR_RETURN(FrameHeader credit, link_->recv_header(deadline, 0));
      if (credit.type != FrameType::kCredit || credit.a != version || credit.b != j) {
        return InvalidArgument("protocol error from " + link_->peer() + ": expected the credit for bucket " +
                               std::to_string(j) + " of version " + std::to_string(version) + ", got frame type " +
                               std::to_string(static_cast<int>(credit.type)) + " (version " +
                               std::to_string(credit.a) + ", bucket " + std::to_string(credit.b) + ")");
      }
      slot = credit.c;
      dst = target_->mapped_slot(static_cast<int>(slot));
    }
    const bool in_place = dst != nullptr;
    if (!in_place) dst = staging_.data();
    runs_.clear();
    for (const PlanEntry& e : bucket.entries) {
      std::byte* to = direct_ ? dst + engine_offsets_[e.tensor] + e.tensor_offset : dst + e.bucket_offset;
      append_shard_copy_runs(model_.weights[e.tensor], pack_rank_, options_.engine_ranks,
                             weights() + weight_offsets_[e.tensor], e.tensor_offset, e.bytes, to, &runs_);
    }
    if (on_device_) {
      // Direct: nobody reads the weights before the refit ends, so launches
      // queue back to back with no host wait, each covering at least
      // kDirectLaunchBytes (a launch per small bucket leaves most of the GPU
      // idle; one launch for everything measured slower than ~1 GiB launches).
      if (direct_) {
        direct_runs_.insert(direct_runs_.end(), runs_.begin(), runs_.end());
        direct_bytes_ += bucket.bytes;
        pending_landed_.push_back(j);
        if (direct_bytes_ >= kDirectLaunchBytes) RETURN_IF_ERROR(launch_direct(name() + ", bucket " + std::to_string(j)));
        return Status::Ok();
      }
      // Staged: one launch for the whole bucket; the engine reads the slot as
      // soon as it sees kLanded, so wait for the copy (one host wait per bucket).
      RETURN_IF_ERROR(copier_->copy(runs_, stream_.handle()).WithContext(name() + ", bucket " + std::to_string(j)));
      RETURN_IF_ERROR(stream_.synchronize().WithContext(name() + ", bucket " + std::to_string(j)));
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

  Status send_landed(std::uint64_t version, std::uint64_t j, std::uint64_t slot, Deadline deadline) {
    FrameHeader landed;
    landed.type = FrameType::kLanded;
    landed.a = version;
    landed.b = j;
    landed.c = slot;
    landed.d = plan_.buckets[j].bytes;
    return link_->send(landed, {}, deadline);
  }

  Status launch_direct(const std::string& where) {
    RETURN_IF_ERROR(copier_->copy(direct_runs_, stream_.handle()).WithContext(where));
    direct_runs_.clear();
    direct_bytes_ = 0;
    return Status::Ok();
  }

  // Direct mode on a device: launches what is left, waits once for every
  // launch, then announces every packed bucket.
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
  Model model_;
  int engine_rank_ = 0;
  int pack_rank_ = 0;  // == engine_rank_ unless a test injects a fault
  Plan plan_;
  // Destroyed in reverse order: the client's reader thread (which may shut
  // the link down) stops first, then the target, then the link it uses.
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Link> link_;
  std::unique_ptr<RemoteTarget> target_;
  std::unique_ptr<ControlClient> client_;
  std::uint64_t seed_ = 0, trainer_index_ = 0, feeders_ = 1;
  bool on_device_ = false, direct_ = false;
  std::vector<std::uint64_t> weight_offsets_;  // of each weight in this rank's arena
  std::vector<std::uint64_t> engine_offsets_;  // direct mode: of each tensor in the engine's arena
  std::vector<std::byte> host_weights_;
  DeviceBuffer device_weights_;
  std::unique_ptr<BatchedCopier> copier_;
  CudaStream stream_;
  std::vector<CopyRun> runs_;
  std::vector<std::uint64_t> pending_landed_;  // direct mode on a device: buckets packed, not yet announced
  std::vector<CopyRun> direct_runs_;           // runs packed but not launched yet
  std::uint64_t direct_bytes_ = 0;             // their bytes
  static constexpr std::uint64_t kDirectLaunchBytes = 1ull << 30;
  std::vector<std::byte> staging_;
};

}  // namespace

Status run_trainer(const RankOptions& options) {
  TrainerRank rank(options);
  return rank.run().WithContext("trainer rank " + std::to_string(options.rank));
}

}  // namespace refit
