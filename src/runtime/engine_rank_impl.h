// EngineRank::Impl: the engine rank's state and steps (engine_rank.h is the
// contract). engine_rank.cc holds setup, the refit and the commit;
// engine_rank_links.cc the data links (the receiver over its pool, the
// feeders' links, the relay to other engines), recovery and the release
// between refits; engine_rank_catch_up.cc what a relay parent sends an
// engine joining the running job.
#pragma once

#include "refit/engine_rank.h"
#include <signal.h>
#include <unistd.h>
#include <cstring>
#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <cstdio>
#include <vector>
#include "control/auth.h"
#include "control/control_client.h"
#include "refit/content.h"
#include "refit/coordinator.h"
#include "control/spec_json.h"
#include "core/plan_swap.h"
#include "refit/partial.h"
#include "net/frames.h"
#include "aligner/aligner.h"
#include "cuda/device.h"
#include "refit/reference_engine.h"
#include "refit/format.h"
#include "refit/log.h"
#include "refit/model.h"
#include "refit/plan.h"
#include "refit/transfer_defaults.h"
#include "receiver/receiver.h"
#include "transport/transport.h"
#include "runtime/data_links.h"
#include "runtime/relay_forwarder.h"
#include "runtime/setup_failure.h"

namespace refit {

class EngineRank::Impl {
 public:
  Impl(const EngineOptions& options, EngineBinding binding) : options_(options), binding_(std::move(binding)) {}

  Status serve();
  bool recovered() const { return recovered_; }
  std::uint64_t seed() const { return seed_; }
  std::uint64_t committed_version() const { return engine_ != nullptr ? engine_->weight_version() : 0; }

  StatusOr<std::optional<std::uint64_t>> next();

  int rank() const { return options_.rank; }
  // "engine rank 0", or in a job of several engines "engine 1 rank 0".
  std::string name() const {
    if (engines_ <= 1 && options_.engine == 0) return "engine rank " + std::to_string(rank());
    return "engine " + std::to_string(options_.engine) + " rank " + std::to_string(rank());
  }

  Status setup();

  // Tells the coordinator why setup failed (runtime/setup_failure.h): by a
  // SetupFailed before joining, a Failed after; not while joining (the
  // coordinator refused this rank, or cannot be reached).
  void report_setup_failure(const Status& error) {
    if (stage_ == SetupStage::kLocal) refit::report_setup_failure(options_, Role::kEngine, error, options_.engine);
    if (stage_ == SetupStage::kJoined) (void)client_->send(Failed{0, error});
  }

  Status check_binding();
  StatusOr<std::unique_ptr<TargetMemory>> make_pool();

  refit::Join make_join(const std::string& descriptor) const;
  Status release_after(std::uint64_t version);

  Status acquire(const Acquire& acquire);
  Status acquire_pool(std::uint64_t version);

  Status adopt_setup(const Setup& setup);
  Status adopt_parts(const std::vector<std::vector<Part>>& parts);
  Status make_receiver(std::unique_ptr<TargetMemory> pool);

  Status link_relay(const std::vector<EngineTarget>& children, Deadline deadline);
  Status accept_links(Deadline deadline);

  StatusOr<bool> recover();
  Status relink_data(const Relink& relink, bool after_failure);
  Status reroute(const Relink& relink);
  // `partial`: a partial refit's plans, swapped back by the caller once
  // nothing of the refit runs any more (the relay's workers stopped).
  Status refit(const Start& start, std::optional<PlanSwap>& partial);
  // Partial refits (engine_rank_scope.cc): this rank's plan and its peers'
  // as the subset plans of `only` for one refit (the setup's again when the
  // PlanSwap goes; the receiver deals its buckets again each time), and the
  // tensors of the stream it moves (moving_; empty: every tensor).
  StatusOr<PlanSwap> use_scope(std::uint64_t version, const std::vector<std::string>& only);
  Status check_partial(std::uint64_t version) const;
  Status begin_engine(std::uint64_t version, const std::vector<std::string>& only);
  // Many engines: a joining engine's catch-up (engine_rank_catch_up.cc).
  Status catch_up(const CatchUp& catch_up);
  Status send_committed(const CatchUp& catch_up);

  // --delta: the version this rank's trainers may encode against: the one
  // it serves, when whole and readable (read_committed); 0 otherwise (a new
  // engine, or one a failed refit left incomplete, gets every byte).
  std::uint64_t delta_base() const {
    if (!binding_.read_committed || !engine_->weights_complete()) return 0;
    return engine_->weight_version();
  }

  Status finish_direct(std::uint64_t version, Deadline deadline);
  StatusOr<bool> verify(std::uint64_t version);

  Status report_and_commit(std::uint64_t version, Deadline deadline, bool verified, Json stats);

  EngineOptions options_;
  EngineBinding binding_;
  Plan plan_;  // the setup's, but during a partial refit its subset plan (use_scope)
  std::vector<Plan> peer_plans_;  // likewise
  struct SubsetPlans {
    Plan own;
    std::vector<Plan> peers;
    std::vector<bool> selected;  // of this rank's stream
  };
  std::map<std::vector<std::string>, SubsetPlans> subset_plans_;  // partial refits' plans, by their globs
  std::vector<bool> moving_;          // the refit in flight's tensors of the stream (empty: every tensor)
  std::vector<std::string> last_only_;  // the last committed refit's globs (empty: every tensor)
  static constexpr std::size_t kSubsetPlansKept = 8;
  std::uint64_t seed_ = 0;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Listener> listener_;
  bool on_device_ = false, direct_ = false;
  bool release_ = false;  // --release-between-refits (the setup says)
  int device_ = -1;  // local CUDA index
  Engine* engine_ = nullptr;  // binding_.engine
  std::vector<std::uint64_t> feeders_;  // trainer ranks feeding this rank, in trainer-index order
  BucketFeeders parts_;                 // sharded trainers: who writes each bucket; empty: round-robin
  std::mutex data_mu_;  // receiver_: the control reader's cancel vs recovery
  std::unique_ptr<Receiver> receiver_;
  std::unique_ptr<RelayForwarder> relay_;  // many engines: this rank's relay to its children, if any
  std::uint64_t engines_ = 1;               // the job's engine count (the setup says)
  bool recovered_ = false;  // the last failed refit was recovered from
  bool in_doubt_ = false;   // done sent, then the coordinator lost before its commit
  SetupStage stage_ = SetupStage::kLocal;
  // Declared last, destroyed first: its reader thread calls into receiver_.
  std::unique_ptr<ControlClient> client_;
};

}  // namespace refit
