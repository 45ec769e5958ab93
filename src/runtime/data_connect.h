// A trainer rank's side of a data link (the engine rank's side:
// data_links.h): connect to the engine rank's data port and authenticate,
// at setup, at every relink and after an acquire (--release-between-refits).
// Shared by the full-weight trainer (trainer_rank.cc) and each channel of a
// sharded one (shard_channel.h).
#pragma once

#include <memory>
#include <string>

#include "control/control_client.h"
#include "net/link.h"
#include "refit/deadline.h"
#include "refit/roles.h"
#include "refit/status.h"

namespace refit {

// A data-plane connection to engine rank `engine_rank` at `address`,
// authenticated both ways with the job's secret in that engine rank's data
// context (control/auth.h; --debug-data-secret stands in for the secret in
// tests); the caller sends the hello. An engine that refuses this side, or
// cannot prove it knows the secret, fails the call naming it. Refused
// connections are retried in short rounds until `deadline`, and stop as soon
// as the coordinator aborted (a dead engine's port refuses for good; the
// abort says why).
StatusOr<std::unique_ptr<Link>> connect_data_link(const RankOptions& options, int engine_rank,
                                                  const std::string& address, ControlClient& client,
                                                  Deadline deadline);

}  // namespace refit
