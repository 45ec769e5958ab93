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

StatusOr<Json> ControlClient::join(const Json& join, Deadline deadline) {
  RETURN_IF_ERROR(send_control(*link_, join, deadline));
  ASSIGN_OR_RETURN(Json reply, recv_control(*link_, deadline));
  std::string type = reply["type"].get<std::string>();
  // "error": this rank was refused; "abort": setup failed for every rank.
  if (type == "error" || type == "abort") return status_from_json(reply.value("error", Json()));
  if (type != "setup") return InvalidArgument("protocol error: the coordinator answered a join with '" + type + "'");
  return reply;
}

Status ControlClient::send(const Json& message) {
  std::lock_guard<std::mutex> lock(send_mu_);
  return send_control(*link_, message, Deadline::After(std::chrono::seconds(30)));
}

void ControlClient::start_reader(std::function<void(const Status&)> on_abort) {
  on_abort_ = std::move(on_abort);
  reader_ = std::thread([this] { read_loop(); });
}

void ControlClient::read_loop() {
  for (;;) {
    auto message = recv_control(*link_, Deadline::Never());
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
        if ((*message)["type"] == "abort" && !abort_) {
          Status reason = status_from_json(message->value("error", Json()));
          abort_ = Aborted("refit aborted by the coordinator: " + reason.ToString());
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

StatusOr<Json> ControlClient::wait(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (!queue_.empty()) {
      Json message = std::move(queue_.front());
      queue_.pop_front();
      if (message["type"] == "abort") return *abort_;
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

StatusOr<Json> ControlClient::wait_for(const std::string& type, Deadline deadline, const std::string& alternative) {
  ASSIGN_OR_RETURN(Json message, wait(deadline));
  std::string got = message["type"].get<std::string>();
  if (got != type && (alternative.empty() || got != alternative)) {
    return InvalidArgument("protocol error: expected '" + type + "' from the coordinator, got '" + got + "'");
  }
  return message;
}

StatusOr<Json> ControlClient::wait_for_recovery(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    while (!queue_.empty()) {
      Json message = std::move(queue_.front());
      queue_.pop_front();
      const std::string type = message.value("type", std::string());
      if (type == "relink") {
        abort_.reset();
        return message;
      }
      if (type == "shutdown") return message;
      // "abort" and whatever the failed refit still had queued.
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
  (void)send(Json{{"type", "failed"}, {"version", version}, {"error", status_to_json(status)}});
  return status;
}

std::optional<Status> ControlClient::abort_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_;
}

}  // namespace refit
