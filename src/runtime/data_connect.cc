// A trainer rank's side of a data link: see data_connect.h.
#include "runtime/data_connect.h"

#include <chrono>
#include <optional>

#include "control/auth.h"
#include "refit/format.h"
#include "refit/secret.h"

namespace refit {

StatusOr<std::unique_ptr<Link>> connect_data_link(const RankOptions& options, int engine_rank,
                                                  const std::string& address, ControlClient& client,
                                                  Deadline deadline) {
  const std::string peer = "engine rank " + std::to_string(engine_rank) + " at " + address;
  StatusOr<std::unique_ptr<Link>> connected = Unavailable("never tried to connect to " + peer);
  do {
    if (std::optional<Status> abort = client.abort_reason()) {
      return Status(abort->code(), abort->message() + " (while connecting to " + peer + ")");
    }
    connected = Link::Connect(address, peer, deadline.min(Deadline::After(std::chrono::milliseconds(100))));
  } while (!connected.ok() && connected.status().code() == StatusCode::kUnavailable && !deadline.expired());
  if (!connected.ok()) {
    return connected.status().WithContext("retried until the setup deadline (" +
                                          format_seconds(options.setup_timeout_s) + ")");
  }
  std::unique_ptr<Link> link = std::move(*connected);
  const Secret secret(options.debug_data_secret.empty() ? options.secret : options.debug_data_secret);
  RETURN_IF_ERROR(authenticate_as_client(*link, secret, data_auth_context(engine_rank), deadline)
                      .WithContext("authenticating the data link"));
  return link;
}

}  // namespace refit
