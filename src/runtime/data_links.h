// The engine rank's data port: accepting one authenticated data-plane link
// from each trainer rank that feeds it (at setup and at every recovery).
//
// A connection must authenticate with the job's secret in this engine
// rank's data context (control/auth.h) and then send the hello of a trainer
// rank still awaited (net/frames.h). One that does not (a stranger, a wrong
// secret, garbage, silence, a duplicate) is refused and logged with its
// address and why, and the accept goes on until every feeder linked or the
// deadline passes: a stranger never fails the setup.
//
// Hostile connections (issue 16), as at the coordinator's join gate
// (control/join_gate.h): each connection is handshaken on a thread of its
// own, so no number of idle or slow ones delays the others. A connection is
// *unauthenticated* until it proved the secret (without a secret, where
// anyone answers "none", until its hello arrived); its handshake ends
// kDataAuthTimeout after its accept. At most kMaxUnauthenticatedDataLinks
// are in flight; one more evicts the oldest unauthenticated one (closed,
// logged), never one that proved the secret. A trainer rank, which
// authenticates within milliseconds of its connect, is evicted only if that
// many newer connections arrive before it answered. An authenticated
// connection (with a secret) may take until the deadline to send its
// hello: a trainer opens its transport target first. When the call
// returns, a handshake accepted less than 500 ms before may end by itself
// within those 500 ms (a stranger accepted with the trainer ranks is told
// why it is refused); the others are cut and refused. Refusals are logged
// at most once per cause per second, with a count (control/refusal_log.h):
//   "engine rank 0: refused a data connection from A: <why>"
//   "engine rank 0: refused 41 more data connections in the last 1.0 s for the same reason; the last from A: <why>"
// each naming the peer once.
//
// Thread safety: one call at a time per listener; the call joins every
// thread it started before it returns.
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

// Unauthenticated data connections handshaking at once on one data port
// (a thread each); one more evicts the oldest of them. An engine rank awaits
// a few trainer ranks, each authenticated within milliseconds of its
// connect: a trainer is evicted only by 64 connections arriving within
// those milliseconds, while a flood costs at most 64 threads.
inline constexpr int kMaxUnauthenticatedDataLinks = 64;

// Who accepts, and whom it awaits.
struct DataPort {
  std::string name;  // "engine rank 0": the source of its log lines and errors
  int engine_rank = 0;
  std::string secret;  // the job's; "" without one
  std::uint64_t plan_digest = 0;  // a hello of another plan is refused
  std::vector<std::uint64_t> feeders;  // trainer ranks in trainer-index order, or one relay feeder (protocol.h)
};

// Accepts the feeders' links on `listener` until each linked or `deadline`
// passes. Returns them in feeders' order, each named "trainer rank N".
// `stopped` is asked between accepts (every 200 ms at least): a reason it
// returns (the coordinator ended the job) ends the wait with that reason.
StatusOr<std::vector<std::unique_ptr<Link>>> accept_data_links(Listener& listener, const DataPort& port,
                                                               const std::function<std::optional<Status>()>& stopped,
                                                               Deadline deadline);

}  // namespace refit
