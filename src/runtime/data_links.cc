// The engine rank's data port: see data_links.h.
#include "runtime/data_links.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>

#include "control/auth.h"
#include "net/frames.h"
#include "refit/log.h"

namespace refit {
namespace {

std::string digest_hex(std::uint64_t digest) {
  char text[17];
  std::snprintf(text, sizeof text, "%016" PRIx64, digest);
  return text;
}

// One data connection: authenticates it with the job's secret in this
// rank's data context (auth.h; "none" when the job has no secret) within
// kDataAuthTimeout, then reads its hello (an authenticated trainer opens
// its transport target first, so the hello may take until `deadline`).
// Without a secret "authenticated" proves nothing (anyone answers
// "none"), so the hello is due within the same kDataAuthTimeout of the
// accept: an idle stranger holds the port at most that long.
// Returns the index in port.feeders of the trainer rank it is; an error says
// why it is refused. `addresses`: where the trainer ranks already linked
// connected from ("" for those still awaited).
StatusOr<std::size_t> admit_link(Link& link, const DataPort& port, const std::vector<std::string>& addresses,
                                 Deadline deadline) {
  const Deadline handshake = deadline.min(Deadline::After(kDataAuthTimeout));
  RETURN_IF_ERROR(authenticate_as_server(link, Secret(port.secret), data_auth_context(port.engine_rank), handshake));
  // Without a secret anyone passes the handshake: the hello is then due
  // within the same window, so an idle stranger cannot hold setup.
  ASSIGN_OR_RETURN(FrameHeader frame, link.recv_header(port.secret.empty() ? handshake : deadline, 0));
  StatusOr<HelloFrame> decoded = decode_hello(frame, link.peer());
  if (!decoded.ok()) {
    return InvalidArgument("not a hello from one of its trainer ranks (" + decoded.status().message() + ")");
  }
  const HelloFrame& hello = *decoded;
  auto it = std::find(port.feeders.begin(), port.feeders.end(), hello.trainer_rank);
  if (it == port.feeders.end() || hello.engine_rank != static_cast<std::uint64_t>(port.engine_rank)) {
    return InvalidArgument("not a hello from one of its trainer ranks (trainer rank " +
                           std::to_string(hello.trainer_rank) + ", engine rank " + std::to_string(hello.engine_rank) +
                           ")");
  }
  if (hello.plan_digest != port.plan_digest) {
    // Only digests travel here (the coordinator, which has the specs, named
    // any difference at setup): say which settings make them differ.
    return FailedPrecondition("plan digest mismatch with trainer rank " + std::to_string(hello.trainer_rank) +
                              ": its hello carries plan " + digest_hex(hello.plan_digest) + ", " + port.name +
                              " planned " + digest_hex(port.plan_digest) +
                              "; compare the two ranks' --model, --layers, --rule and --bucket-size");
  }
  const std::size_t index = static_cast<std::size_t>(it - port.feeders.begin());
  if (!addresses[index].empty()) {
    return FailedPrecondition("trainer rank " + std::to_string(hello.trainer_rank) + " is already linked (from " +
                              addresses[index] + "): a duplicate");
  }
  return index;
}

}  // namespace

StatusOr<std::vector<std::unique_ptr<Link>>> accept_data_links(Listener& listener, const DataPort& port,
                                                               const std::function<std::optional<Status>()>& stopped,
                                                               Deadline deadline) {
  std::vector<std::unique_ptr<Link>> links(port.feeders.size());
  std::vector<std::string> addresses(port.feeders.size());
  std::size_t linked = 0;
  int refused = 0;
  std::string last_refusal;
  while (linked < port.feeders.size()) {
    // In slices, so that a job the coordinator ends meanwhile (a trainer
    // rank that will never link again) ends this wait too.
    auto accepted = listener.accept(deadline.min(Deadline::After(std::chrono::milliseconds(200))));
    if (!accepted.ok() && accepted.status().code() == StatusCode::kDeadlineExceeded && !deadline.expired()) {
      if (std::optional<Status> why = stopped()) {
        return Status(why->code(), port.name + " stopped waiting for its trainer ranks' data links: " + why->message());
      }
      continue;
    }
    if (!accepted.ok() && accepted.status().code() != StatusCode::kDeadlineExceeded) return accepted.status();
    if (!accepted.ok() || deadline.expired()) {
      std::string missing;
      for (std::size_t i = 0; i < port.feeders.size(); ++i) {
        if (!links[i]) missing += (missing.empty() ? "" : ", ") + std::to_string(port.feeders[i]);
      }
      return DeadlineExceeded("trainer rank(s) " + missing + " did not link to its data port " + listener.address() +
                              " within the setup deadline (--setup-timeout)" +
                              (refused == 0 ? std::string()
                                            : "; it refused " + std::to_string(refused) +
                                                  " data connection(s), the last from " + last_refusal));
    }
    std::unique_ptr<Link> link = std::move(*accepted);
    const std::string address = link->peer();
    StatusOr<std::size_t> index = admit_link(*link, port, addresses, deadline);
    if (!index.ok()) {
      // authenticate_as_server's refusals already start with "refused <address>: ".
      std::string why = index.status().message();
      const std::string prefix = "refused " + address + ": ";
      if (why.rfind(prefix, 0) == 0) why.erase(0, prefix.size());
      ++refused;
      last_refusal = address + ": " + why;
      log(LogLevel::kWarning, port.name, "refused a data connection from " + last_refusal);
      continue;  // closes it
    }
    link->set_peer("trainer rank " + std::to_string(port.feeders[*index]));
    addresses[*index] = address;
    links[*index] = std::move(link);
    ++linked;
  }
  return links;
}

}  // namespace refit
