// TrainerRank::Impl: the trainer rank's state and steps (trainer_rank.h is
// the contract). trainer_rank.cc holds setup, the refit and its report;
// trainer_rank_links.cc the data links to the engine ranks (setup, relink,
// a new engine rank to feed, release and acquire).
#pragma once

#include "refit/trainer_rank.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "control/auth.h"
#include "control/control_client.h"
#include "core/plan_swap.h"
#include "core/refit_tally.h"
#include "cuda/device.h"
#include "delta/bucket_bases.h"
#include "net/frames.h"
#include "refit/coordinator.h"
#include "refit/format.h"
#include "refit/model.h"
#include "refit/partial.h"
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

// The protocol of a trainer rank: join, link, and per refit ready, go,
// credits and kLanded (its EngineLinkProtocol, which its sender calls),
// sent, done, commit. How a bucket's bytes move is the BucketSender's business.
class TrainerRank::Impl {
 public:
  using Clock = std::chrono::steady_clock;

  Impl(const RankOptions& options, std::unique_ptr<WeightSource> source)
      : options_(options), source_(std::move(source)), protocol_(name(), &plan_, options.bucket_timeout_s) {}
  // The control reader shuts channels' links down until the client goes:
  // the channels go first, under the lock it takes.
  ~Impl() {
    std::lock_guard<std::mutex> lock(link_mu_);
    channels_.clear();
  }

  Status serve();

  Status refit(std::uint64_t version, const std::vector<std::string>& only);

  Status finish();

  std::uint64_t committed_version() const { return committed_; }
  const std::optional<TrainerRefitReport>& last_refit() const { return last_refit_; }
  bool on_demand() const { return on_demand_; }
  bool recovered() const { return recovered_; }

  std::string name() const { return "trainer rank " + std::to_string(options_.rank); }
  // What may come between refits: an acquire (release between refits), a
  // relink (many engines: the engine it fed was dropped; move_to_root).
  ControlClient::BetweenRefits between_refits();

  // Direct mode over shadow weights: the arena the coming refit writes
  // (Start::arena; 0 otherwise), in the engine rank's region or each fed one's.
  void land_in(std::uint64_t arena);

  // Tells the coordinator why setup failed (runtime/setup_failure.h): by a
  // SetupFailed before joining, a Failed after; not while joining (the
  // coordinator refused this rank, or cannot be reached).
  void report_setup_failure(const Status& error);

  Status setup();

  // The data link to the engine rank, its transport target from
  // `descriptor` and the sender over them (setup, and after an acquire).
  Status link_engine(const std::string& descriptor, Deadline deadline);

  // A sharded rank's links: one channel per engine rank it feeds.
  Status link_sharded(const Setup& setup, Deadline deadline);

  Status link_channels(Deadline deadline);

  // --release-between-refits, once this rank said committed: on the
  // coordinator's release the sender (its staging), the transport targets
  // (the mappings of the engine ranks' pools) and the data links go, so
  // that the engines' pools can return to the device.
  Status release_after(std::uint64_t version);

  // Before the next start (after a release): the engine ranks' new pools,
  // opened and linked as at setup; a failure is reported to the coordinator.
  Status acquire(const Acquire& acquire);

 private:
  // A data-plane connection to the engine rank (setup, recovery, acquire).
  StatusOr<std::unique_ptr<Link>> connect_to_engine(Deadline deadline);

  Status send_hello(Deadline deadline);

  // Chooses this rank's bucket sender, once (bucket_sender.h). `writer`: the
  // device that copies (-1: none).
  Status make_sender(int writer);
  // A sender of the rank's settings; `delta` false: a plain one even under
  // --delta (a partial refit's, whose subset plan has no bases).
  StatusOr<std::unique_ptr<BucketSender>> new_sender(int writer, bool delta);
  // The sender of a refit: sender_, but for a partial refit under --delta a
  // plain sender, made on first use.
  StatusOr<BucketSender*> refit_sender(bool partial);

  // Runs refit `version`. On failure: reports it, then recovers when the
  // coordinator says so ("relink": a fresh data-plane connection over the
  // same transport target and registrations) and returns the refit's error
  // with recovered_ set; a coordinator that shuts down or is lost leaves the
  // error fatal.
  // `called`: when the caller began this refit (the report's seconds).
  Status refit_or_report(const Start& start, Clock::time_point called = Clock::now());

  // The coordinator's relink, after a failed refit or (many engines) between
  // refits once the engine it fed was dropped: the route's target, when it
  // names one, is the engine rank it feeds from now on (the relay tree's new
  // root: a new link, target and sender, as at setup); otherwise the links
  // as before, made again.
  Status relink_to(const Relink& relink, Deadline deadline);
  Status move_channels(const std::vector<EngineTarget>& moved, Deadline deadline);
  // Between refits: relink_to, then linked (a failure is reported).
  Status move_to_root(const Relink& relink);
  // Recovery of the one engine link: a fresh data-plane connection over the
  // same transport target, and the hello again.
  Status relink_engine(Deadline deadline);

  Status run_refit(std::uint64_t version, const std::vector<std::string>& only, Clock::time_point called);

  // Partial refits (trainer_rank_scope.cc): whether this rank can move only
  // part of its stream (refused, named, where that is not built yet), and
  // plan_ as the subset plan of `only` for one refit (the setup's again
  // when the PlanSwap goes; nothing to swap for a full refit).
  Status check_partial(std::uint64_t version) const;
  StatusOr<RefitScope> partial_scope(std::uint64_t version, const std::vector<std::string>& only) const;
  StatusOr<PlanSwap> use_scope(std::uint64_t version, const std::vector<std::string>& only);
  static constexpr std::size_t kSubsetPlansKept = 8;

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
  StatusOr<SentShare> send_share(std::uint64_t version, Deadline deadline);

  // A sharded rank's share of refit `version`: its part of every bucket of
  // every engine rank it feeds, one thread per engine rank.
  StatusOr<SentShare> send_sharded(std::uint64_t version, Deadline deadline);

  // Bucket j of refit `version`, and the per-bucket fault injections for
  // tests (bucket_faults.h).
  Status send_bucket(std::uint64_t version, std::uint64_t j, Deadline deadline);

  // The Done's stats of what this rank sent (gpu_span.h, engine_link_protocol.h).
  StatusOr<Json> share_stats(const SentShare& sent);

  // The coordinator decides refit `version` committed once every rank is
  // done; before its Commit nothing here treats it as committed. A
  // coordinator lost meanwhile leaves the refit in doubt here.
  Status await_commit(std::uint64_t version, Deadline deadline);

  // --delta: what this refit sent becomes the base of the next (the
  // engines committed the same version). A base that does not decode is a
  // bug; the bases are then cleared and the next refit goes full. After a
  // partial refit the buckets it touched lose their bases, the others keep
  // theirs (the engines still serve those bytes).
  void commit_bases(std::uint64_t version);
  static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

  // Where this rank's bytes are read from, for the report: "host",
  // "cuda" (device memory the transport reads itself), "host-staged".
  std::string memory_path() const;

  RankOptions options_;
  std::unique_ptr<WeightSource> source_;
  int engine_rank_ = 0;
  int pack_rank_ = 0;  // == engine_rank_ unless a test injects a fault
  Plan plan_;  // the setup's, but during a partial refit its subset plan (use_scope)
  // A partial refit's plan, and which buckets of the setup's plan hold a
  // tensor it moves (--delta: those lose their bases at its commit).
  struct SubsetPlan {
    Plan plan;
    std::vector<bool> touched;
  };
  std::map<std::vector<std::string>, SubsetPlan> subset_plans_;  // partial refits' plans, by their globs
  const std::vector<bool>* partial_touched_ = nullptr;           // the refit in flight's; null: a full refit
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
  std::optional<DeviceBucketBases> device_bases_;  // --delta with device weights: the same, on its device
  // How this rank's buckets move (chosen once at setup; uses target_ and
  // link_, so declared after them: destroyed first).
  std::unique_ptr<BucketSender> sender_;
  std::unique_ptr<BucketSender> plain_sender_;  // --delta: partial refits' (refit_sender)
  BucketSender* sending_ = nullptr;             // the refit in flight's: one of the two
  int writer_ = -1;                             // make_sender's
  // Sharded trainers (issue 19): the layout, the plans computed at setup and
  // one channel per engine rank fed (null / empty for full weights).
  TrainerLayout layout_;
  std::optional<ShardedPlan> sharded_;
  std::vector<std::unique_ptr<ShardChannel>> channels_;
  std::vector<EngineTarget> targets_;  // the setup's, with each acquire's descriptors

  std::optional<GpuSpan> gpu_span_;  // device weights: the refit on the sender's stream
};

}  // namespace refit
