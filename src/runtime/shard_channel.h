// ShardChannel: a sharded trainer rank's connection to one engine rank it
// feeds (issue 19): the data link, the transport target, the bucket plan of
// that engine rank's stream, this rank's share of each bucket (the bucket
// feed) and the sender that moves it. A sharded trainer rank holds one
// channel per engine rank its shards reach and drives them all each refit,
// one thread per channel.
//
// The channel keeps the per-bucket protocol (credits, kLanded of its own
// part, whose bytes the feed gives); the trainer rank keeps the refit's.
//
// Thread safety: one thread uses a channel at a time; shutdown_link() may be
// called from any thread (the control reader, on an abort).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "control/control_client.h"
#include "control/protocol.h"
#include "net/frames.h"
#include "net/link.h"
#include "refit/plan.h"
#include "refit/roles.h"
#include "reshard/bucket_feed.h"
#include "runtime/bucket_sender.h"
#include "runtime/sharded_plan.h"
#include "runtime/trainer_share.h"
#include "transport/transport.h"

namespace refit {

class ShardChannel final : public BucketProtocol {
 public:
  ShardChannel(const RankOptions& options, ShardedPlan::Fed* fed, std::string address, ControlClient* client);

  int engine_rank() const { return fed_->engine_rank; }
  // Connects and authenticates (retrying refused connections until
  // `deadline` or an abort), opens the transport target from `descriptor`
  // (writing from device `writer`, -1: none) and sends the hello.
  Status link(const std::string& descriptor, int writer, Deadline deadline);
  // Chooses the sender (bucket_sender.h) over this channel's share;
  // `registrations`: the rank's host weights registered once for all its
  // channels (host_registrations).
  Status make_sender(const WeightSource* source, SenderSettings settings, SharedRegistrations registrations);
  // Every bucket this rank writes a part of, in order; then the sender's
  // finish. Returns the bytes sent. The first channel of a rank (`first`)
  // also runs the tests' per-bucket faults after its first part
  // (--debug-stop-after-bucket, --debug-fail-refit; roles.h); with
  // --debug-gpu-delay-ms and --debug-host-delay-ms every part waits first.
  StatusOr<std::uint64_t> send_all(std::uint64_t version, bool first, Deadline deadline);
  // Buckets this rank writes a part of.
  std::uint64_t buckets() const {
    std::uint64_t n = 0;
    for (std::uint64_t j = 0; j < fed_->plan.buckets.size(); ++j) n += fed_->feed.share(j, options_.rank) != nullptr;
    return n;
  }
  // After a failed refit: forget what was in flight.
  void abandon() { sender_->abandon(); }
  // On the coordinator's relink: a fresh data link and the hello again.
  Status relink(Deadline deadline);
  // Direct mode over shadow weights: the coming refit writes arena `arena`
  // (Start::arena) of the fed engine rank's region.
  void land_in(std::uint64_t arena);
  void shutdown_link();

  // BucketProtocol
  StatusOr<std::uint64_t> wait_credit(std::uint64_t version, std::uint64_t bucket, Deadline deadline) override;
  Status send_landed(std::uint64_t version, std::uint64_t bucket, std::uint64_t slot, Deadline deadline) override;
  std::string peer() const override;

 private:
  StatusOr<std::unique_ptr<Link>> connect(Deadline deadline);
  Status send_hello(Deadline deadline);
  Status inject_delays();
  std::string name() const { return "trainer rank " + std::to_string(options_.rank); }

  const RankOptions& options_;
  ShardedPlan::Fed* fed_;
  std::string address_;
  ControlClient* client_;
  std::unique_ptr<Transport> transport_;
  std::mutex link_mu_;  // shutdown_link() vs relink()'s adopt()
  std::unique_ptr<Link> link_;
  std::unique_ptr<RemoteTarget> target_;  // uses link_: declared after it
  std::uint64_t landing_ = 0;             // the sender's SenderContext::landing
  std::unique_ptr<BucketSender> sender_;  // uses both: destroyed first
};

}  // namespace refit

namespace refit {

// A sharded trainer rank's join fields: every engine rank it feeds, with its
// plan digest of that rank's stream and its parts (bucket, bytes) of it
// (control/protocol.h Feed); and one tensor per dtype it sends.
std::vector<Feed> sharded_feeds(const ShardedPlan& plan, int trainer_rank);
std::map<std::string, std::string> sharded_stream_dtypes(const ShardedPlan& plan);

// One channel per engine rank of `plan.fed`, linked to the engine named by
// the coordinator's `targets` (the same engine ranks, in order: otherwise
// kInvalidArgument naming both) and with its sender chosen.
StatusOr<std::vector<std::unique_ptr<ShardChannel>>> link_shard_channels(
    const RankOptions& options, ShardedPlan& plan, const std::vector<EngineTarget>& targets, ControlClient* client,
    const WeightSource* source, Deadline deadline);

// The credit of bucket j of refit `version` on `link` (its slot and base), within
// the bucket deadline: a credit that does not come means a stalled or dead
// engine rank (kDeadlineExceeded naming `who`, the bucket and the peer); a
// credit of another bucket or version is kDataLoss. Both trainer kinds wait
// for credits this way.
StatusOr<CreditFrame> receive_credit(Link& link, const std::string& who, double bucket_timeout_s,
                                     std::uint64_t version, std::uint64_t j, Deadline deadline);

// What a sharded layout runs on in this build: every transport but nccl
// (an nccl target takes one trainer rank). Host weights (a source of this
// rank's shards) feed host engines over shm, tcp or ucx, staged or direct
// where the transport has it, and device engines over cuda_ipc (direct or
// staged, from --gpu: the copy engines read the registered shards, or
// pinned buffers carry them); device weights feed device engines over
// cuda_ipc or ucx, direct or staged. Every writer writes only its part:
// staged, its slot ranges (a slot's one landing event cannot order several
// writers, so each waits for its own part before it says landed); direct,
// its runs at their arena offsets. kFailedPrecondition naming the settings
// otherwise.
Status check_sharded_settings(const RankOptions& options, const WeightSource& source);

// Recovery: every channel relinks (a fresh data link, the hello again).
Status relink_channels(std::vector<std::unique_ptr<ShardChannel>>& channels, Deadline deadline);

// Sends refit `version` over every channel, one thread per channel but the
// first (this thread); the first error wins and the others' links are shut
// down so that they stop too. Returns the bytes and buckets sent.
struct ShardedSent {
  std::uint64_t bytes = 0, buckets = 0;
  std::vector<EngineShare> shares;  // per channel, in the channels' order
};
StatusOr<ShardedSent> send_over_channels(std::vector<std::unique_ptr<ShardChannel>>& channels,
                                         std::uint64_t version, Deadline deadline);

}  // namespace refit
