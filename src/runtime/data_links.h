// The engine rank's data port: accepting one authenticated data-plane link
// from each trainer rank that feeds it (at setup and at every recovery).
//
// A connection must authenticate with the job's secret in this engine
// rank's data context (control/auth.h) and then send the hello of a trainer
// rank still awaited (net/frames.h). One that does not (a stranger, a wrong
// secret, garbage, silence, a duplicate) is refused and logged with its
// address and why, and the accept goes on until every feeder linked or the
// deadline passes: a stranger never fails the setup. Connections are handled
// one at a time; a silent one delays those queued behind it by at most
// kDataAuthTimeout (without a secret, its hello is due within that window
// too, so an idle stranger cannot hold the port longer).
//
// Thread safety: one call at a time per listener.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "net/link.h"
#include "refit/deadline.h"
#include "refit/status.h"

namespace refit {

// Who accepts, and whom it awaits.
struct DataPort {
  std::string name;  // "engine rank 0": the source of its log lines and errors
  int engine_rank = 0;
  std::string secret;  // the job's; "" without one
  std::uint64_t plan_digest = 0;  // a hello of another plan is refused
  std::vector<std::uint64_t> feeders;  // trainer ranks, in trainer-index order
};

// Accepts the feeders' links on `listener` until each linked or `deadline`
// passes. Returns them in feeders' order, each named "trainer rank N".
// `stopped` is asked between accepts (every 200 ms at most): a reason it
// returns (the coordinator ended the job) ends the wait with that reason.
StatusOr<std::vector<std::unique_ptr<Link>>> accept_data_links(Listener& listener, const DataPort& port,
                                                               const std::function<std::optional<Status>()>& stopped,
                                                               Deadline deadline);

}  // namespace refit
