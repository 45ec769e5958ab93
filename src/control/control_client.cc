#include "control/control_client.h"

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <span>
#include <thread>

#include "net/poll_wait.h"

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

void ControlClient::ReportSetupFailure(const std::string& address, const Secret& secret,
                                       const SetupFailed& failure, Deadline deadline) {
  auto link = Link::Connect(address, "the coordinator at " + address, deadline);
  if (!link.ok()) return;
  if (!authenticate_as_client(**link, secret, kControlAuthContext, deadline).ok()) return;
  (void)send_message(**link, RankMessage(failure), deadline);
  // Wait for the coordinator to close (it read the report) or the deadline,
  // so the message is not lost to a reset.
  (void)recv_coordinator_message(**link, deadline);
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

void ControlClient::start_reader(HeartbeatTiming heartbeats, std::function<void(const Status&)> on_abort) {
  on_abort_ = std::move(on_abort);
  {
    std::lock_guard<std::mutex> lock(mu_);
    reading_ = true;
  }
  reader_ = std::thread([this, heartbeats] { read_loop(heartbeats); });
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

void ControlClient::read_loop(HeartbeatTiming heartbeats) {
  using Clock = std::chrono::steady_clock;
  Clock::time_point heard = Clock::now(), next_beat = heard;
  for (;;) {
    const Clock::time_point now = Clock::now();
    if (now >= next_beat) {
      beat(heartbeats);
      next_beat = now + heartbeats.interval;
    }
    const Clock::time_point silent_at = heard + heartbeats.timeout;
    if (now >= silent_at) {
      char limit[32];
      std::snprintf(limit, sizeof limit, "%g s", static_cast<double>(heartbeats.timeout.count()) / 1000);
      return lose(Unavailable(std::string("lost the coordinator: heard nothing from it for ") + limit +
                              " (the heartbeat deadline, --heartbeat-timeout): it stalled, died or is cut off"));
    }
    // Until the next heartbeat is due or the coordinator's silence is too
    // long, whichever comes first; then check both again.
    pollfd fd{link_->fd(), POLLIN, 0};
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(std::min(next_beat, silent_at) - now);
    const int ready = poll_until(std::span<pollfd>(&fd, 1), Deadline::After(wait));
    if (ready < 0) return lose(Unavailable("lost the coordinator: " + ErrnoStatus("poll", -ready).message()));
    if (ready == 0) continue;
    // A frame started: the rest of it is due within the heartbeat deadline.
    auto message = recv_coordinator_message(*link_, Deadline::After(heartbeats.timeout));
    if (!message.ok()) return lose(Unavailable("lost the coordinator: " + message.status().message()));
    heard = Clock::now();
    if (std::holds_alternative<Heartbeat>(*message)) continue;
    std::function<void(const Status&)> notify;
    Status why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (std::optional<Status> stop = stop_reason(*message); stop && !abort_) {
        abort_ = *stop;
        why = *abort_;
        notify = on_abort_;
      }
      queue_.push_back(std::move(*message));
    }
    cv_.notify_all();
    if (notify) notify(why);
  }
}

void ControlClient::lose(const Status& why) {
  std::function<void(const Status&)> notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    if (!abort_) {
      abort_ = why;
      notify = on_abort_;
    }
  }
  // A coordinator that resumes finds the connection closed, not a rank that
  // seems alive.
  link_->shutdown();
  cv_.notify_all();
  if (notify) notify(why);
}

void ControlClient::beat(HeartbeatTiming heartbeats) {
  std::unique_lock<std::mutex> lock(send_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  // A failed send is not judged here: a broken connection shows up as a
  // read error, a stalled coordinator as silence.
  (void)send_message(*link_, RankMessage(Heartbeat{}), Deadline::After(heartbeats.interval));
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

StatusOr<std::optional<Start>> ControlClient::wait_for_start(Deadline deadline, const BetweenRefits& between) {
  for (;;) {
    ASSIGN_OR_RETURN(CoordinatorMessage message, wait(deadline));
    if (auto* start = std::get_if<Start>(&message)) return std::optional<Start>(*start);
    if (std::holds_alternative<Shutdown>(message)) return std::optional<Start>();
    Status handled = InvalidArgument("protocol error: expected 'start' from the coordinator, got '" +
                                     message_name(message) + "'");
    if (const auto* m = std::get_if<Relink>(&message); m != nullptr && between.relink) handled = between.relink(*m);
    if (const auto* m = std::get_if<Acquire>(&message); m != nullptr && between.acquire) handled = between.acquire(*m);
    if (const auto* m = std::get_if<CatchUp>(&message); m != nullptr && between.catch_up) {
      handled = between.catch_up(*m);
    }
    RETURN_IF_ERROR(handled);
  }
}

StatusOr<std::optional<Start>> ControlClient::wait_for_start_while_alive(const BetweenRefits& between) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!reading_) return Internal("wait_for_start_while_alive before start_reader: nothing checks the coordinator");
  }
  // No fixed deadline: the reader's heartbeat deadline closes the client
  // (and so ends this wait) once the coordinator is silent.
  return wait_for_start(Deadline::Never(), between);
}

StatusOr<std::optional<Relink>> ControlClient::wait_for_recovery(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    while (!queue_.empty()) {
      CoordinatorMessage message = std::move(queue_.front());
      queue_.pop_front();
      if (auto* relink = std::get_if<Relink>(&message)) {
        abort_.reset();
        return std::optional<Relink>(std::move(*relink));
      }
      if (std::holds_alternative<Shutdown>(message)) return std::optional<Relink>();
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

bool ControlClient::lost() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

Status commit_in_doubt(std::uint64_t version, std::uint64_t kept, const Status& lost) {
  const std::string v = std::to_string(version);
  return Status(lost.code(), "refit " + v + " is in doubt here: this rank reported it done, then lost the "
                             "coordinator before the commit decision reached it (the coordinator's report says "
                             "whether refit " + v + " was committed); this rank keeps refit " + std::to_string(kept) +
                             ": " + lost.message());
}

Status with_committed_version(const Status& status, std::uint64_t committed) {
  if (status.ok()) return status;
  return Status(status.code(), status.message() + " (last committed here: refit " + std::to_string(committed) + ")");
}

std::optional<Status> ControlClient::abort_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_;
}

}  // namespace refit
