#include "control/join_gate.h"

#include "net/event_fd.h"
#include "net/poll_wait.h"
#include "control/protocol.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "refit/log.h"

namespace refit {

StatusOr<std::unique_ptr<JoinGate>> JoinGate::Start(std::unique_ptr<Listener> listener, Options options) {
  int ready = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (ready < 0) return ErrnoStatus("coordinator: eventfd", errno);
  int stop = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (stop < 0) {
    int err = errno;
    ::close(ready);
    return ErrnoStatus("coordinator: eventfd", err);
  }
  return std::unique_ptr<JoinGate>(new JoinGate(std::move(listener), std::move(options), ready, stop));
}

JoinGate::JoinGate(std::unique_ptr<Listener> listener, Options options, int ready_fd, int stop_fd)
    : listener_(std::move(listener)), options_(std::move(options)), ready_fd_(ready_fd), stop_fd_(stop_fd) {
  acceptor_ = std::thread([this] { accept_loop(); });
}

JoinGate::~JoinGate() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (Handshake& h : handshakes_) {
      if (h.link) h.link->shutdown();
    }
  }
  signal_event_fd(stop_fd_);
  acceptor_.join();
  reap(/*all=*/true);
  ::close(ready_fd_);
  ::close(stop_fd_);
}

std::optional<JoinGate::Candidate> JoinGate::take() {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.empty()) {
    drain_event_fd(ready_fd_);
    return std::nullopt;
  }
  Candidate c = std::move(queue_.front());
  queue_.pop_front();
  if (queue_.empty()) drain_event_fd(ready_fd_);
  return c;
}

void JoinGate::refuse(const std::string& peer, const std::string& why) {
  refused_.fetch_add(1);
  refusals_.refused(peer, why);
}

void JoinGate::accept_loop() {
  for (;;) {
    pollfd fds[2] = {{listener_->fd(), POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    // Wake now and then to join finished handshake threads and log counts.
    StatusOr<int> ready = poll_wait(fds, Deadline::After(std::chrono::milliseconds(200)), "the listening socket");
    reap(/*all=*/false);
    refusals_.flush();
    if (!ready.ok() && ready.status().code() != StatusCode::kDeadlineExceeded) {
      log(LogLevel::kError, "refit coordinator", ready.status().message());
      return;
    }
    if (ready.ok() && (fds[1].revents & POLLIN)) return;
    if (!ready.ok() || !(fds[0].revents & POLLIN)) continue;
    auto link = listener_->accept(Deadline::After(std::chrono::milliseconds(0)));
    if (!link.ok()) continue;  // the peer left before accept, or EAGAIN
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    make_room();
    Handshake& h = handshakes_.emplace_back();
    h.link = link->get();
    h.thread = std::thread([this, hp = &h, owned = std::move(*link)]() mutable { handshake(hp, std::move(owned)); });
  }
}

void JoinGate::make_room() {
  int unauthenticated = 0;
  Handshake* oldest = nullptr;  // handshakes_ is in accept order
  for (Handshake& h : handshakes_) {
    if (h.done || h.authenticated || h.evicted) continue;
    ++unauthenticated;
    if (oldest == nullptr) oldest = &h;
  }
  if (unauthenticated < options_.max_unauthenticated || oldest == nullptr) return;
  // Its thread sees the shut-down link fail, logs the eviction and ends.
  oldest->evicted = true;
  if (oldest->link) oldest->link->shutdown();
}

void JoinGate::handshake(Handshake* h, std::unique_ptr<Link> link) {
  const std::string peer = link->peer();
  const Deadline deadline = Deadline::After(options_.handshake_timeout);
  auto finish = [&](std::unique_ptr<Link> admitted, Json join) {
    std::lock_guard<std::mutex> lock(mu_);
    h->link = nullptr;
    h->done = true;
    if (admitted && !stopping_) {
      queue_.push_back(Candidate{std::move(admitted), std::move(join)});
      signal_event_fd(ready_fd_);
    }
  };
  Status auth = authenticate_as_server(*link, options_.secret, kControlAuthContext, deadline);
  if (!auth.ok()) {
    bool evicted = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      evicted = h->evicted;
    }
    if (evicted) evicted_.fetch_add(1);
    refuse(peer, evicted ? "evicted unauthenticated: the oldest of " + std::to_string(options_.max_unauthenticated) +
                               " unauthenticated connections when another arrived"
                         : refusal_reason(auth, peer));
    return finish(nullptr, Json());
  }
  if (!options_.secret.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!h->evicted) h->authenticated = true;
  }
  auto join = recv_control(*link, deadline);
  if (join.ok()) {
    // Checked against the protocol here, so that a malformed join is refused
    // off the coordinator's thread.
    if (Status valid = decode_rank_message(*join).status(); !valid.ok()) {
      join = InvalidArgument("malformed control message from " + peer + ": " + valid.message());
    }
  }
  if (!join.ok()) {
    (void)send_message(*link, CoordinatorMessage(Refusal{join.status()}), Deadline::After(std::chrono::milliseconds(1000)));
    refuse(peer, "after it authenticated: " + join.status().message());
    return finish(nullptr, Json());
  }
  finish(std::move(link), std::move(*join));
}

void JoinGate::reap(bool all) {
  std::list<Handshake> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = handshakes_.begin(); it != handshakes_.end();) {
      if (all || it->done) {
        auto next = std::next(it);
        finished.splice(finished.end(), handshakes_, it);
        it = next;
      } else {
        ++it;
      }
    }
  }
  for (Handshake& h : finished) h.thread.join();
}

}  // namespace refit
