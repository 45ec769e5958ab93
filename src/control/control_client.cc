#include "control/control_client.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace refit {

StatusOr<std::unique_ptr<ControlClient>> ControlClient::Connect(const std::string& address, const Secret& secret,
                                                                Deadline deadline) {
  // A coordinator flooded by strangers may drop this connection before it
  // authenticated (join_gate.h: the oldest unauthenticated one is evicted):
  // the connection closes without a refusal. That is retried, with a short
  // backoff, until `deadline`; a refusal (a wrong secret, ...) is not.
  std::chrono::milliseconds backoff(20);
  for (int attempt = 1;; ++attempt) {
    ASSIGN_OR_RETURN(auto link, Link::Connect(address, "the coordinator at " + address, deadline));
    Status auth = authenticate_as_client(*link, secret, kControlAuthContext, deadline);
    if (auth.ok()) return std::unique_ptr<ControlClient>(new ControlClient(std::move(link)));
    if (auth.code() != StatusCode::kUnavailable || deadline.remaining_ms() <= backoff.count()) {
      return attempt == 1 ? auth
                          : Status(auth.code(), auth.message() + " (attempt " + std::to_string(attempt) +
                                                    "; the earlier ones were dropped before authenticating)");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

ControlClient::~ControlClient() {
  link_->shutdown();
  if (reader_.joinable()) reader_.join();
}

StatusOr<Setup> ControlClient::join(const Join& join, Deadline deadline) {
  RETURN_IF_ERROR(send_message(*link_, RankMessage(join), deadline));
  ASSIGN_OR_RETURN(CoordinatorMessage reply, recv_coordinator_message(*link_, deadline));
  // A refusal: this rank was refused; an abort: setup failed for every rank.
  if (auto* refusal = std::get_if<Refusal>(&reply)) return refusal->error;
  if (auto* abort = std::get_if<Abort>(&reply)) return abort->error;
  if (auto* setup = std::get_if<Setup>(&reply)) return std::move(*setup);
  return InvalidArgument("protocol error: the coordinator answered a join with '" + message_name(reply) + "'");
}

Status ControlClient::send(const RankMessage& message) {
  std::lock_guard<std::mutex> lock(send_mu_);
  return send_message(*link_, message, Deadline::After(std::chrono::seconds(30)));
}

void ControlClient::start_reader(std::function<void(const Status&)> on_abort) {
  on_abort_ = std::move(on_abort);
  reader_ = std::thread([this] { read_loop(); });
}

namespace {
// Why the coordinator stops this rank's work, when `message` says so.
std::optional<Status> stop_reason(const CoordinatorMessage& message) {
  if (const auto* abort = std::get_if<Abort>(&message)) {
    return Aborted("refit aborted by the coordinator: " + abort->error.ToString());
  }
  if (const auto* shutdown = std::get_if<Shutdown>(&message); shutdown != nullptr && shutdown->error) {
    return Aborted("the coordinator ended the job with refit " + std::to_string(shutdown->committed_version) +
                   " committed: " + shutdown->error->ToString());
  }
  return std::nullopt;
}
}  // namespace

void ControlClient::read_loop() {
  for (;;) {
    auto message = recv_coordinator_message(*link_, Deadline::Never());
    std::function<void(const Status&)> notify;
    Status why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!message.ok()) {
        closed_ = true;
        if (!abort_) {
          abort_ = Unavailable("lost the coordinator: " + message.status().message());
          why = *abort_;
          notify = on_abort_;
        }
      } else {
        if (std::optional<Status> stop = stop_reason(*message); stop && !abort_) {
          abort_ = *stop;
          why = *abort_;
          notify = on_abort_;
        }
        queue_.push_back(std::move(*message));
      }
    }
    cv_.notify_all();
    if (notify) notify(why);
    if (!message.ok()) return;
  }
}

StatusOr<CoordinatorMessage> ControlClient::wait(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (!queue_.empty()) {
      CoordinatorMessage message = std::move(queue_.front());
      queue_.pop_front();
      if (std::optional<Status> stop = stop_reason(message)) return abort_ ? *abort_ : *stop;
      return message;
    }
    if (closed_) return abort_ ? *abort_ : Unavailable("lost the coordinator");
    if (deadline.is_never()) {
      cv_.wait(lock);
    } else if (cv_.wait_until(lock, deadline.at()) == std::cv_status::timeout && queue_.empty() && !closed_) {
      return DeadlineExceeded("timed out waiting for a message from the coordinator");
    }
  }
}

StatusOr<std::optional<Start>> ControlClient::wait_for_start(Deadline deadline) {
  ASSIGN_OR_RETURN(CoordinatorMessage message, wait(deadline));
  if (auto* start = std::get_if<Start>(&message)) return std::optional<Start>(*start);
  if (std::holds_alternative<Shutdown>(message)) return std::optional<Start>();
  return InvalidArgument("protocol error: expected 'start' from the coordinator, got '" + message_name(message) + "'");
}

StatusOr<bool> ControlClient::wait_for_recovery(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    while (!queue_.empty()) {
      CoordinatorMessage message = std::move(queue_.front());
      queue_.pop_front();
      if (std::holds_alternative<Relink>(message)) {
        abort_.reset();
        return true;
      }
      if (std::holds_alternative<Shutdown>(message)) return false;
      // The Abort and whatever the failed refit still had queued.
    }
    if (closed_) return Unavailable("lost the coordinator while waiting for recovery");
    if (deadline.is_never()) {
      cv_.wait(lock);
    } else if (cv_.wait_until(lock, deadline.at()) == std::cv_status::timeout && queue_.empty() && !closed_) {
      return DeadlineExceeded("no recovery instruction from the coordinator");
    }
  }
}

std::optional<Status> ControlClient::await_abort_reason(std::chrono::milliseconds grace) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, grace, [&] { return abort_.has_value(); });
  return abort_;
}

Status ControlClient::report_failure(std::uint64_t version, const Status& local) {
  Status status = local;
  // Prefer the coordinator's reason: it names the rank that failed first.
  if (auto reason = await_abort_reason(std::chrono::milliseconds(500))) {
    // A rank that failed only because of the abort would repeat the verdict.
    const bool repeats = local.message().find(reason->message()) != std::string::npos;
    status = repeats ? *reason : Status(reason->code(), reason->message() + " (here: " + local.message() + ")");
  }
  (void)send(Failed{version, status});
  return status;
}

std::optional<Status> ControlClient::abort_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_;
}

}  // namespace refit
