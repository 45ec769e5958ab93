// JoinGate: admits connections to the coordinator off its main thread.
//
// A thread accepts connections on the coordinator's listener. Each one is
// authenticated (control/auth.h) and its first message (the join) read on a
// handshake thread of its own, so a slow, silent or hostile peer never
// blocks the coordinator's loop (and so a running refit) nor the other
// peers. Candidates that passed both are queued for the coordinator, which
// decides on its own thread (role, rank range, duplicates): it take()s them
// when fd() polls readable.
//
// Hostile connections (issue 16): a connection is *unauthenticated* until
// it proved the secret (without a secret, where anyone can answer "none",
// until its join arrived). Every handshake ends at `handshake_timeout` after
// the accept. Only unauthenticated connections are limited: at most
// `max_unauthenticated` at once; one more evicts the oldest unauthenticated
// one (closed, logged), so no number of idle or slow connections holds the
// gate shut: a real rank, which authenticates within milliseconds, is
// evicted only if that many newer connections arrive before it answered,
// and then retries (ControlClient::Connect). No limit outlasts a handshake:
// nothing is remembered about an address, so a rank from an attacker's
// address gets through like any other. A peer that fails authentication,
// or whose first message is malformed, is told why (best effort). Refusals
// are logged through refit::log at most once per cause (reason) per second,
// with a count (refusal_log.h).
//
// Thread safety: fd() and take() are for one thread (the coordinator's).
// The destructor stops accepting, wakes every handshake in flight and joins
// every thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "control/auth.h"
#include "control/control_message.h"
#include "control/refusal_log.h"
#include "net/link.h"
#include "net/link.h"
#include "refit/status.h"

namespace refit {

class JoinGate {
 public:
  struct Options {
    Secret secret;  // empty: no authentication
    // Accept -> authenticated and joined. A rank sends its join right after
    // authenticating, so only strangers come near it. Default: 5 s.
    std::chrono::milliseconds handshake_timeout{5000};
    // Unauthenticated connections at once; one more evicts the oldest.
    // Default: 128.
    int max_unauthenticated = 128;
  };
  struct Candidate {
    std::unique_ptr<Link> link;  // peer(): the address it connected from
    Json join;                   // its first message, validated (control_message.h)
  };

  // Starts accepting on `listener`.
  static StatusOr<std::unique_ptr<JoinGate>> Start(std::unique_ptr<Listener> listener, Options options);
  ~JoinGate();
  JoinGate(const JoinGate&) = delete;
  JoinGate& operator=(const JoinGate&) = delete;

  // Polls readable (POLLIN) while a candidate waits.
  int fd() const { return ready_fd_; }
  // The next candidate, if any (never blocks).
  std::optional<Candidate> take();

  const Listener& listener() const { return *listener_; }
  // Connections refused so far (authentication, malformed join, timed out,
  // evicted).
  int refused() const { return refused_.load(); }
  // Unauthenticated connections evicted so far to make room for newer ones.
  int evicted() const { return evicted_.load(); }

 private:
  // One connection being authenticated. Its thread owns the Link; `link`
  // lets the destructor wake it (shutdown) and is cleared, under mu_, before
  // the thread gives the Link away or drops it.
  // Fields other than `thread` are guarded by mu_.
  struct Handshake {
    std::thread thread;
    Link* link = nullptr;
    bool authenticated = false;  // proved the secret (see above): never evicted
    bool evicted = false;
    bool done = false;
  };

  JoinGate(std::unique_ptr<Listener> listener, Options options, int ready_fd, int stop_fd);
  void accept_loop();
  // REQUIRES: mu_ held. Evicts the oldest unauthenticated handshake when
  // max_unauthenticated are in flight.
  void make_room();
  void handshake(Handshake* h, std::unique_ptr<Link> link);
  void reap(bool all);
  void refuse(const std::string& peer, const std::string& why);

  std::unique_ptr<Listener> listener_;
  Options options_;
  int ready_fd_;  // eventfd: candidates waiting
  int stop_fd_;   // eventfd: stop the accept loop
  std::atomic<int> refused_{0};
  std::atomic<int> evicted_{0};
  RefusalLog refusals_{"refit coordinator"};

  std::mutex mu_;  // guards everything below
  std::deque<Candidate> queue_;
  std::list<Handshake> handshakes_;
  bool stopping_ = false;

  std::thread acceptor_;  // last: started after everything above exists
};

}  // namespace refit
